"""The lowering registry: one lowering per overload, no out= variants."""
import pytest
import torch

from bridge.ops import LOWERINGS, lowering

aten = torch.ops.aten


def test_every_registered_overload_is_functional():
    assert not [op for op in LOWERINGS if any(a.is_out for a in op._schema.arguments)]


def test_a_second_registration_is_refused_naming_both():
    first = LOWERINGS[aten.add.Tensor]

    def another_add(x, y, alpha=1):
        return x + alpha * y

    with pytest.raises(ValueError) as info:
        lowering(aten.add.Tensor)(another_add)
    message = str(info.value)
    assert "aten.add.Tensor" in message
    assert first.__qualname__ in message and "another_add" in message
    assert LOWERINGS[aten.add.Tensor] is first


def _unlowered_packet():
    """An op with an out= variant and no lowering yet, free for a test to take."""
    for packet in (aten.linalg_ldl_solve, aten.linalg_ldl_factor_ex, aten.hash_tensor,
                   aten.linalg_householder_product):
        if {"default", "out"} <= set(packet.overloads()) and packet.default not in LOWERINGS:
            return packet
    pytest.skip("every candidate op has a lowering now")


def test_a_packet_registers_its_functional_overloads_only():
    packet = _unlowered_packet()

    def ldl_solve(*args):
        raise NotImplementedError

    try:
        lowering(packet)(ldl_solve)
        assert LOWERINGS[packet.default] is ldl_solve
        assert packet.out not in LOWERINGS
    finally:
        LOWERINGS.pop(packet.default, None)


def test_an_explicit_out_variant_is_refused():
    with pytest.raises(ValueError, match=r"aten.atan2.out writes into an out="):
        lowering(aten.atan2.out)(lambda *a: None)
    assert aten.atan2.out not in LOWERINGS
