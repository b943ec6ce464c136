"""`cstorch.sparse.configure`: sparsity algorithms from configuration dicts.

The module is itself callable: ``cstorch.sparse.configure(config)`` builds a `Group` and
``from cerebras.pytorch.sparse.configure import default_sparse_param_filter`` imports the
default filter, as Model Zoo does both.
"""
import fnmatch
import sys
import types

import torch

_SKIPPED = ("embedding", "norm", "lm_head", "pe_helper")


def default_sparse_param_filter(name: str, param: torch.Tensor) -> bool:
    """Whether a parameter is sparsified by default: it has more than one dimension and its
    name does not mention an embedding, a norm, the LM head or a position-encoding
    helper (so biases, norms and embedding tables stay dense)."""
    lowered = name.lower()
    return param.dim() > 1 and not any(word in lowered for word in _SKIPPED)


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
        raise TypeError("param_filter must be a glob of parameter names, a non-empty list of "
                        f"globs or a callable (name, param) -> bool, got {param_filter!r}")

    def matches(name, param):
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    matches.patterns = patterns
    return matches


def algorithm_classes() -> dict:
    """Every concrete sparsity algorithm by lower-case class name (user subclasses too)."""
    import inspect

    from cstorch.sparse.base import SparsityAlgorithm
    found, todo = {}, [SparsityAlgorithm]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not inspect.isabstract(cls):
            found.setdefault(cls.__name__.lower(), cls)
    return found


def configure(config):
    """A `Group` of sparsity algorithms from a configuration: a sparsity level (a
    `Static` algorithm on the default parameters), a dict, or a list of dicts.

    Each dict names its ``algorithm`` ("static" when absent; "gmp", "set", "rigl", or the
    lower-case name of any concrete `SparsityAlgorithm` subclass), its ``param_filter``
    (a glob, a list of globs or a callable; `default_sparse_param_filter` when absent)
    and the algorithm's own arguments (``sparsity``, ``init_method``, ``update``,
    ``drop_fraction``, ...). Parameters go to the first dict whose filter takes them.
    """
    from cstorch.sparse.group import Group
    if isinstance(config, bool):
        raise TypeError(f"a sparsity configuration is a level, a dict or a list of dicts, "
                        f"got {config!r}")
    if isinstance(config, (int, float)):
        config = [{"sparsity": config}]
    elif isinstance(config, dict):
        config = [config]
    elif not isinstance(config, (list, tuple)):
        raise TypeError("a sparsity configuration is a level, a dict or a list of dicts, got "
                        f"{type(config).__name__}")
    classes = algorithm_classes()
    classes.pop("group", None)
    group = Group()
    for i, entry in enumerate(config):
        if not isinstance(entry, dict):
            raise TypeError(f"sparsity configuration entry {i} must be a dict, got "
                            f"{type(entry).__name__}")
        kwargs = dict(entry)
        name = kwargs.pop("algorithm", None) or "static"
        cls = classes.get(str(name).lower())
        if cls is None:
            raise ValueError(f"unknown sparsity algorithm {name!r} in entry {i}: use one of "
                             f"{sorted(classes)}")
        param_filter = kwargs.pop("param_filter", None)
        param_filter = default_sparse_param_filter if param_filter is None else param_filter
        try:
            algorithm = cls(**kwargs)
        except TypeError as e:
            raise TypeError(f"sparsity configuration entry {i} ({cls.__name__}): {e}") from None
        group.add(param_filter, algorithm)
    return group


configure.default_sparse_param_filter = default_sparse_param_filter


class _CallableModule(types.ModuleType):
    """This module, callable as `configure`: whichever of the two an import leaves at
    ``cstorch.sparse.configure`` (importing the submodule by name rebinds the package's
    attribute to the module), ``cstorch.sparse.configure(...)`` works."""

    def __call__(self, config):
        return configure(config)


sys.modules[__name__].__class__ = _CallableModule
