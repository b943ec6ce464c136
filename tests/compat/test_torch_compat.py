"""`cstorch.torch_compat`: what code written for the real package's torch relies on."""
import dataclasses

import pytest
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

import cerebras.pytorch  # noqa: F401  (importing it applies the compatibility)


def _tuples_as_lists(spec):
    """What Model Zoo's config dump does (trainer/validate.py): every tuple node of a
    spec rebuilt as a list with `dataclasses.replace`."""
    if spec.num_children == 0:
        return spec
    children = [_tuples_as_lists(spec.child(i)) for i in range(spec.num_children)]
    return dataclasses.replace(spec, type=list if spec.type is tuple else spec.type,
                               children_specs=children)


def test_dataclasses_replace_rebuilds_a_treespec():
    values, spec = tree_flatten({"betas": (0.9, 0.95), "groups": [{"lr": (1, 2)}], "n": 3})
    rebuilt = tree_unflatten(values, _tuples_as_lists(spec))
    assert rebuilt == {"betas": [0.9, 0.95], "groups": [{"lr": [1, 2]}], "n": 3}
    same = dataclasses.replace(spec)
    assert same == spec and same.num_leaves == spec.num_leaves
    # The constructor's own arguments are unchanged.
    assert TreeSpec(tuple, None, list(spec.child(0).children())) == spec.child(0)
    assert TreeSpec(tuple, context=None, children_specs=[]).num_children == 0


def test_a_treespec_needs_its_context_and_children():
    with pytest.raises(TypeError, match="needs `context` and `children_specs`"):
        TreeSpec(tuple)
