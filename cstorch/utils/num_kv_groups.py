"""`cerebras.pytorch.utils.num_kv_groups`: telling the compiler about grouped attention."""
from dataclasses import dataclass
from collections.abc import Callable

from cstorch.core.annotation import AnnotationMode, create_annotation

__all__ = ["groups_annotater", "GroupsConfig"]


@dataclass
class GroupsConfig(AnnotationMode.Config):
    """The number of key/value head groups of a grouped-query attention."""
    num_kv_groups: int


def _groups_attribute(config: GroupsConfig, is_backward: bool):
    return AnnotationMode.Attribute("num_kv_groups", config.num_kv_groups)


def groups_annotater(num_kv_groups: int | None) -> Callable[[Callable], Callable]:
    """A decorator that tells the compiler the ops of the wrapped function work on
    `num_kv_groups` key/value groups (multi-query and grouped-query attention)::

        using_groups = groups_annotater(8)
        scores = using_groups(torch.matmul)(q, k.transpose(-1, -2))

    Recorded as the annotation attribute ``num_kv_groups`` on the ops traced in the call
    (`cstorch.core.annotation`); what they compute is unchanged. `None` gives a decorator
    that returns the function unchanged.
    """
    if num_kv_groups is None:
        return lambda fn: fn
    if not isinstance(num_kv_groups, int) or isinstance(num_kv_groups, bool) or num_kv_groups < 1:
        raise ValueError(f"groups_annotater expects a positive int or None, got {num_kv_groups!r}")
    return create_annotation(GroupsConfig, _groups_attribute, num_kv_groups=num_kv_groups,
                             enable_fwd=True, enable_bwd=True)
