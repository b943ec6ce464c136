"""Each benchmark owns one section of docs/benchmarks.md, between markers with its name."""
import os

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "benchmarks.md")


def write_section(name: str, markdown: str):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    with open(DOC, "w") as f:
        f.write(text)
