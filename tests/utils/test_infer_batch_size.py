"""`infer_batch_size`: the first dimension of a batch's first tensor that has one, in
the order torch's pytree flattens the batch; the fast path for a leading tensor must give
what the full walk gives."""
from collections import OrderedDict, namedtuple

import torch

from cstorch.utils.data import infer_batch_size

Pair = namedtuple("Pair", "a b")


def walk(data):
    """The definition, by the full flattening."""
    for leaf in torch.utils._pytree.tree_leaves(data):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return None


def test_matches_the_full_walk_on_many_structures():
    a, b, scalar = torch.zeros(3, 2), torch.zeros(5), torch.tensor(1.0)
    cases = [a, (a, b), [b, a], {"y": b, "x": a}, (scalar, b), [scalar, {"k": a}],
             {"s": scalar, "t": (b, a)}, OrderedDict(y=a, x=b), Pair(b, a), (), {}, [],
             scalar, (1, 2.0, "text", b), {"n": None, "t": a}, [[a], b]]
    for case in cases:
        assert infer_batch_size(case) == walk(case), case


def test_dict_order_is_insertion_order():
    assert infer_batch_size({"late": torch.zeros(7), "early": torch.zeros(2)}) == 7


def test_no_tensor_with_a_dimension_gives_none():
    assert infer_batch_size((torch.tensor(3.0), 4, "x")) is None
