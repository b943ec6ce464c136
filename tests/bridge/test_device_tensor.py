"""DeviceTensor: a torch tensor whose value is a JAX array, with every write path reaching
the array, compared with the same operations on ordinary tensors."""
import copy
import io
import pickle

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bridge.device_tensor import DeviceTensor


def pair(shape=(3, 4), seed=0):
    torch.manual_seed(seed)
    host = torch.randn(shape)
    return host, DeviceTensor.of(jnp.asarray(host.numpy()), torch.float32)


def value(t):
    return torch.from_numpy(np.array(t.cell.array))


def test_reads_give_ordinary_tensors_with_the_value():
    host, dev = pair()
    assert torch.equal(dev.host(), host)
    out = dev * 2 + 1
    assert type(out) is torch.Tensor and torch.equal(out, host * 2 + 1)
    assert torch.equal(dev.sum(0), host.sum(0))
    assert dev.numpy().tolist() == host.numpy().tolist() == dev.tolist()
    assert dev[1, 2].item() == host[1, 2].item()
    assert float(dev[0, 0]) == float(host[0, 0])
    assert repr(dev) == repr(host)


@pytest.mark.parametrize("edit", [
    lambda t: t.mul_(3),
    lambda t: t.data.clamp_(-0.5, 0.5),
    lambda t: t.copy_(torch.arange(12.0).reshape(3, 4)),
    lambda t: t[1].fill_(7.0),
    lambda t: t.t()[0].add_(1.0),
    lambda t: t.view(-1)[3:5].zero_(),
    lambda t: torch.add(torch.ones(3, 4), 2, out=t),
    lambda t: setattr(t, "data", torch.full((3, 4), 0.25)),
    lambda t: torch.nn.init.zeros_(t),
], ids=["mul_", "data_clamp_", "copy_", "row_fill_", "transpose_view", "flat_view", "out=",
        "data_setter", "nn_init"])
def test_every_write_path_reaches_the_array(edit):
    host, dev = pair()
    alias = dev.detach()
    with torch.no_grad():
        edit(host)
        edit(dev)
    assert torch.equal(value(dev), host)
    assert torch.equal(alias.host(), host)  # aliases share the cell


def test_parameter_and_module_writes():
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3)
    module = torch.nn.Linear(4, 3)
    module.load_state_dict(ref.state_dict())
    for name in ("weight", "bias"):
        p = getattr(module, name)
        setattr(module, name, torch.nn.Parameter(DeviceTensor.of(jnp.asarray(p.detach().numpy()),
                                                                 torch.float32)))
    assert isinstance(module.weight, torch.nn.Parameter) and isinstance(module.weight, DeviceTensor)
    new = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    module.load_state_dict(new)
    ref.load_state_dict(new)
    assert torch.equal(value(module.weight), ref.weight.detach())
    x = torch.randn(5, 4)
    module(x).sum().backward()
    ref(x).sum().backward()
    assert torch.allclose(module.weight.grad, ref.weight.grad)


def test_refused_writes_say_what_to_do():
    _, dev = pair()
    with pytest.raises(RuntimeError, match="assign a new torch.nn.Parameter"):
        dev.data = torch.zeros(2, 2)
    with pytest.raises(RuntimeError, match="float64.*before cstorch.compile"):
        dev.data = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="set_ cannot rebind"):
        dev.set_(torch.zeros(3, 4))


def test_pickles_as_an_ordinary_tensor():
    host, dev = pair()
    param = torch.nn.Parameter(dev)
    buf = io.BytesIO()
    torch.save({"t": dev.detach(), "p": param}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded["t"]) is torch.Tensor and torch.equal(loaded["t"], host)
    assert type(loaded["p"]) is torch.nn.Parameter and torch.equal(loaded["p"].detach(), host)
    assert torch.equal(pickle.loads(pickle.dumps(dev)), host)
    clone = copy.deepcopy(param)
    assert type(clone) is torch.nn.Parameter and torch.equal(clone.detach(), host)
    with torch.no_grad():
        clone.mul_(2)
    assert torch.equal(value(dev), host)  # the copy is independent


def test_values_never_alias_host_memory_written_later():
    host, dev = pair()
    src = torch.randn(3, 4)
    expected = src.clone()
    with torch.no_grad():
        dev.copy_(src)
    src.mul_(10)   # a later write to the source must not reach the device value
    assert torch.equal(value(dev), expected)


@pytest.mark.parametrize("pieces", [
    lambda t: t.unbind(0), lambda t: t.unbind(1), lambda t: t.split(2),
    lambda t: torch.split(t, [1, 3], dim=1), lambda t: t.chunk(3), lambda t: t.chunk(2, dim=1),
    lambda t: t.tensor_split(3), lambda t: t.split_with_sizes([2, 1]),
])
def test_view_ops_with_several_pieces_outside_a_step(pieces):
    # Issue 32: unbind/split/chunk on a compiled parameter raised ("'list' object has no
    # attribute 'shape'"); each piece is a view of the value, as in torch.
    host, dev = pair(seed=5)
    got, want = pieces(dev), pieces(host)
    assert type(got) is type(want) and len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, DeviceTensor) and g.shape == w.shape
        assert torch.equal(g.host(), w)
    got[-1].mul_(-2)       # a write through a piece reaches the whole value, as in torch
    want[-1].mul_(-2)
    assert torch.equal(value(dev), host)


def test_pieces_of_a_compiled_parameter_equal_the_eager_ones():
    import cerebras.pytorch as cstorch
    cstorch.backend("CPU")
    torch.manual_seed(11)
    model = torch.nn.Linear(5, 6)
    eager = model.weight.detach().clone()
    cstorch.compile(model)
    for got, want in [(model.weight.unbind(0), eager.unbind(0)),
                      (model.weight.split(4), eager.split(4)),
                      (model.weight.chunk(2, 1), eager.chunk(2, 1))]:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g.detach().clone(), w)


def test_tensors_to_jax_uploads_host_values_of_their_own_and_keeps_device_arrays():
    """One transfer for host tensors (in their JAX dtype, copied: a later write to the
    tensor does not reach the array); a device tensor gives its own array."""
    import jax

    from bridge.convert import tensors_to_jax
    torch.manual_seed(1)
    host = torch.randn(5, 3)
    ints = torch.randint(-9, 9, (4,))
    _, dev = pair(seed=2)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    arrays = tensors_to_jax([host, dev, ints], [sharding] * 3)
    assert arrays[1] is dev.cell.array
    np.testing.assert_array_equal(np.asarray(arrays[0]), host.numpy())
    np.testing.assert_array_equal(np.asarray(arrays[2]), ints.numpy())
    assert arrays[2].dtype == jnp.int32   # int64 lives on the device as int32
    expected = host.numpy().copy()
    host.add_(100.0)
    np.testing.assert_array_equal(np.asarray(arrays[0]), expected)
