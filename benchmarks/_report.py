"""Each benchmark owns one section of docs/benchmarks.md, between markers with its name,
and says how much of the machine other tenants took while it ran."""
import os

import psutil

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


def steal_since(before) -> str:
    """The share of CPU time since `before` (a `psutil.cpu_times()`) that the hypervisor gave
    to other tenants of the host (steal time), as text. On a shared virtual machine this is
    what makes timings move from run to run."""
    after = psutil.cpu_times()
    if not hasattr(after, "steal"):
        return "steal time not counted by this OS"
    total = sum(after) - sum(before)
    share = 100 * (after.steal - before.steal) / total if total > 0 else 0.0
    return f"steal time {share:.1f}%"
