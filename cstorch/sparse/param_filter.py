"""Which parameters a sparsity algorithm takes: a filter from globs of names."""
import fnmatch


def make_param_filter(param_filter):
    """A callable ``(name, param) -> bool`` from a glob of parameter names (``"*.weight"``,
    ``"fc1.*"``, shell-style, matched against the whole name), a list of globs (any), or
    a callable (kept)."""
    if callable(param_filter):
        return param_filter
    if isinstance(param_filter, str):
        patterns = [param_filter]
    elif isinstance(param_filter, (list, tuple)) and param_filter \
            and all(isinstance(p, str) for p in param_filter):
        patterns = list(param_filter)
    else:
        raise TypeError(f"filter must be a string or list of strings, got {type(param_filter)}")

    def matches(name, param):
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    matches.patterns = patterns
    return matches
