"""`cstorch.sparse.configure`: sparsity algorithms from configuration dicts.

The module is itself callable: ``cstorch.sparse.configure(config)`` builds a `Group` and
``from cerebras.pytorch.sparse.configure import default_sparse_param_filter`` imports the
default filter, as Model Zoo does both.
"""
import inspect
import sys
import types
import warnings

import torch

from cstorch.sparse.base import SparsityAlgorithm
from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.group import Group
from cstorch.sparse.param_filter import make_param_filter

_SKIPPED = ("embedding", "norm", "lm_head", "pe_helper")


def default_sparse_param_filter(name: str, param: torch.Tensor) -> bool:
    """Whether a parameter is sparsified by default: it has more than one dimension and its
    name does not mention an embedding, a norm, the LM head or a position-encoding
    helper (so biases, norms and embedding tables stay dense)."""
    lowered = name.lower()
    return param.dim() > 1 and not any(word in lowered for word in _SKIPPED)


class UnknownSparsityAlgorithm(NameError, ValueError):
    """A sparsity configuration names an algorithm that does not exist. A NameError as in
    the reference, and a ValueError, which it is."""


def algorithm_classes() -> dict:
    """Every sparsity algorithm by lower-case class name: the built-in ones and concrete
    user subclasses of `SparsityAlgorithm` (`Group` and the abstract bases excluded)."""
    found, todo = {}, [SparsityAlgorithm]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls not in (SparsityAlgorithm, DynamicSparsityAlgorithm, Group) \
                and not inspect.isabstract(cls):
            found.setdefault(cls.__name__.lower(), cls)
    return found


def map_sparsity_algorithm(algorithm):
    """The `SparsityAlgorithm` class `algorithm` names ("static", "gmp", "set", "rigl",
    any case, or the lower-case name of a user subclass); a class is returned as is."""
    if isinstance(algorithm, type) and issubclass(algorithm, SparsityAlgorithm):
        return algorithm
    classes = algorithm_classes()
    if not isinstance(algorithm, str) or algorithm.lower() not in classes:
        raise UnknownSparsityAlgorithm(f"unknown sparsity algorithm {algorithm!r}: use one of "
                                       f"{sorted(classes)}")
    return classes[algorithm.lower()]


def _entries(config) -> list:
    """The config as a list of dicts, each an algorithm's arguments."""
    if isinstance(config, bool) or config is None:
        raise TypeError(f"a sparsity configuration is a level, a dict or a list of dicts, "
                        f"got {config!r}")
    if isinstance(config, (int, float)):
        return [{"sparsity": config}]
    if isinstance(config, dict):
        if "groups" not in config:
            return [config]
        # {"groups": {"algorithm": ..., "params": {...}}} or a list of such groups; the
        # keys beside "groups" are every group's defaults.
        defaults = {k: v for k, v in config.items() if k != "groups"}
        groups = config["groups"]
        groups = [groups] if isinstance(groups, dict) else groups
        if not isinstance(groups, (list, tuple)):
            raise TypeError(f"a sparsity configuration's 'groups' is a dict or a list of "
                            f"dicts, got {type(groups).__name__}")
        out = []
        for i, group in enumerate(groups):
            if not isinstance(group, dict):
                raise TypeError(f"sparsity group {i} must be a dict, got "
                                f"{type(group).__name__}")
            entry = {**defaults, **{k: v for k, v in group.items() if k != "params"}}
            entry.update(group.get("params") or {})
            out.append(entry)
        return out
    if isinstance(config, (list, tuple)):
        return list(config)
    raise TypeError("a sparsity configuration is a level, a dict or a list of dicts, got "
                    f"{type(config).__name__}")


def configure(config):
    """A `Group` of sparsity algorithms from a configuration: a sparsity level (a
    `Static` algorithm on the default parameters), a dict, a list of dicts, or a dict
    whose ``groups`` lists dicts of ``algorithm`` and ``params``. None when the
    configuration sets no sparsity (``{"sparsity": None}``).

    Each dict names its ``algorithm`` ("static" when absent; "gmp", "set", "rigl", or the
    lower-case name of any concrete `SparsityAlgorithm` subclass; the older key ``type``
    means the same and warns), its ``param_filter`` (a glob, a list of globs or a callable;
    `default_sparse_param_filter` when absent) and the algorithm's own arguments
    (``sparsity``, or its older name ``schedule``; ``init_method``, ``update``,
    ``drop_fraction``, ...). Parameters go to the first dict whose filter takes them.
    """
    group = Group()
    for i, entry in enumerate(_entries(config)):
        if not isinstance(entry, dict):
            raise TypeError(f"sparsity configuration entry {i} must be a dict, got "
                            f"{type(entry).__name__}")
        kwargs = dict(entry)
        if "type" in kwargs:
            warnings.warn("The 'type' key is deprecated, please use 'algorithm' instead",
                          DeprecationWarning, stacklevel=2)
            if "algorithm" in kwargs:
                raise ValueError("Cannot specify both 'type' and 'algorithm' in the same "
                                 "config")
            kwargs["algorithm"] = kwargs.pop("type")
        if "schedule" in kwargs:
            if "sparsity" in kwargs:
                raise ValueError("Cannot specify both 'sparsity' and 'schedule' in the same "
                                 "config")
            kwargs["sparsity"] = kwargs.pop("schedule")
        if "sparsity" in kwargs and kwargs["sparsity"] is None:
            continue   # this entry sparsifies nothing
        cls = map_sparsity_algorithm(kwargs.pop("algorithm", None) or "static")
        param_filter = kwargs.pop("param_filter", None)
        param_filter = default_sparse_param_filter if param_filter is None else param_filter
        param_filter = make_param_filter(param_filter)
        group.add(param_filter, cls(**kwargs))
    if not group.sparsity_groups:
        return None
    return group


configure.default_sparse_param_filter = default_sparse_param_filter


class _CallableModule(types.ModuleType):
    """This module, callable as `configure`: whichever of the two an import leaves at
    ``cstorch.sparse.configure`` (importing the submodule by name rebinds the package's
    attribute to the module), ``cstorch.sparse.configure(...)`` works."""

    def __call__(self, config):
        return configure(config)


sys.modules[__name__].__class__ = _CallableModule
