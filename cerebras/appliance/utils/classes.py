"""Class discovery."""


def retrieve_all_subclasses(cls: type) -> list[type]:
    """Every subclass of `cls` at any depth, each once, in depth-first order of
    `__subclasses__()`; `cls` itself is not included. Only classes already defined (their
    modules imported) can be found."""
    if not isinstance(cls, type):
        raise TypeError(f"retrieve_all_subclasses takes a class, got {cls!r}")
    found, seen = [], set()

    def walk(parent):
        # type.__subclasses__ is unbound so metaclass-level classes (type itself) work too.
        for sub in type.__subclasses__(parent) if parent is type else parent.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                found.append(sub)
                walk(sub)

    walk(cls)
    return found


__all__ = ["retrieve_all_subclasses"]
