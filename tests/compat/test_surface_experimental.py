"""cstorch.experimental: the implicit generation loop (one iteration per eager call; traced
steps: tests/compat/test_implicit_loop_compiled.py), weight
Compression requests, and traced-tensor listener hooks."""
import fnmatch

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cerebras.pytorch.experimental.listener import register_traced_tensor_hook

START = 0   # the padding token of the prompts below


def test_implicit_loop_generates_one_token_per_iteration():
    prompts = torch.tensor([[5, 6, 7, START, START, START],
                            [8, START, START, START, START, START],
                            [1, 2, 3, 4, 5, 6]], dtype=torch.int32)      # full: nothing to do
    index = cstorch.experimental.start_implicit_loop(prompts, loop_dim=1)
    # A full row reads its last token as padding; the update then finds no padding to fill.
    assert index.tolist() == [[2], [0], [4]]
    hidden = torch.arange(3 * 6 * 2, dtype=torch.float32).reshape(3, 6, 2)
    sliced = cstorch.experimental.get_loop_iteration_slice(hidden, index)
    assert sliced.shape == (3, 1, 2)
    assert torch.equal(sliced[:, 0], hidden[torch.arange(3), index[:, 0]])
    pred = torch.tensor([[40], [41], [42]], dtype=torch.int32)
    out = cstorch.experimental.update_implicit_loop(
        input_tensor=prompts, index_tensor=index, update_tensor=pred,
        stop_sequences_tensor=torch.zeros(3, 1, 2, dtype=torch.int32), start_token=START,
        max_tokens=4)
    assert out.tolist() == [[5, 6, 7, 40, START, START], [8, 41, START, START, START, START],
                            [1, 2, 3, 4, 5, 6]]
    assert out.dtype == torch.int32 and prompts[0, 3] == START       # input untouched


def test_implicit_loop_repeated_in_a_traced_step_fills_the_sequences():
    cstorch.backend("CPU")
    vocab = 11

    @cstorch.trace
    @torch.no_grad()
    def step(input_ids):
        index = cstorch.experimental.start_implicit_loop(input_ids, loop_dim=1)
        current = cstorch.experimental.get_loop_iteration_slice(input_ids, index)
        token = (current * 3 + 1) % vocab + 1          # a deterministic "model", never START
        return cstorch.experimental.update_implicit_loop(
            input_tensor=input_ids, index_tensor=index, update_tensor=token,
            stop_sequences_tensor=None, start_token=[START], max_tokens=8)

    seq = torch.tensor([[2, START, START, START, START], [4, 5, START, START, START]])
    for _ in range(5):
        seq = step(seq).host()
    expected = []
    for row in ([2], [4, 5]):
        row = list(row)
        while len(row) < 5:
            row.append((row[-1] * 3 + 1) % vocab + 1)
        expected.append(row)
    assert seq.tolist() == expected
    assert step.captures == 1


def test_compression_records_the_format_of_selected_parameters():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compression = cstorch.experimental.Compression("mx8", "*.weight")
    model.apply(compression)
    assert compression.compressed == {"0.weight": "mx8", "2.weight": "mx8"}
    assert cstorch.experimental.Compression.format_of(model[0].weight) == "mx8"
    assert cstorch.experimental.Compression.format_of(model[0].bias) is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # A pattern that only a submodule's local name matches selects nothing in the end.
    local = cstorch.experimental.Compression("mx8", "weight")
    nn.Sequential(nn.Linear(2, 2)).apply(local)
    assert local.compressed == {}
    with pytest.raises(ValueError):
        cstorch.experimental.Compression("", "*")


def test_traced_tensor_hooks_see_module_outputs_while_a_step_is_traced():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    compiled = cstorch.compile(model)
    seen, norms = [], {}

    def dump(tensor, name):
        seen.append((name, tuple(tensor.shape), tensor.dtype))

    def norm_listener(tensor, name):           # as Model Zoo's NormTensorListener
        if fnmatch.fnmatch(name, "model.0"):
            norms[name] = torch.norm(tensor)

    handles = [register_traced_tensor_hook(dump), register_traced_tensor_hook(norm_listener)]

    @cstorch.trace
    @torch.no_grad()
    def step(x):
        norms.clear()
        out = compiled(x)
        return out, norms["model.0"]

    x = torch.randn(2, 4)
    model(x)                                    # eager, outside a capture: no call
    assert seen == []
    out, norm = step(x)
    names = [n for n, _, _ in seen]
    assert names == ["model.0", "model.1", "model"]
    assert seen[0][1:] == ((2, 3), torch.float32)
    hidden = x @ model[0].weight.host().T + model[0].bias.host()
    assert torch.allclose(norm.host(), torch.norm(hidden), rtol=1e-6)
    for h in handles:
        h.remove()
    seen.clear()

    @cstorch.trace
    @torch.no_grad()
    def other(x):
        return compiled(x) * 2

    other(x)
    assert seen == []


def test_stop_sequences_and_max_tokens_warn_that_eager_calls_cannot_apply_them(monkeypatch):
    from cstorch.experimental import implicit_loop
    monkeypatch.setattr(implicit_loop, "_warned", [])
    seq = torch.tensor([[2, START, START]])
    index = cstorch.experimental.start_implicit_loop(seq, loop_dim=1)
    with pytest.warns(UserWarning, match="outside a traced step, it generates one token per "
                      "call, so stop_sequences_tensor and max_tokens are not applied"):
        # stop_sequences_tensor and start_token have no defaults (api_signatures)
        cstorch.experimental.update_implicit_loop(seq, index, torch.tensor([[7]]), None,
                                                  START, max_tokens=4)


def test_the_loop_dimension_comes_from_the_index():
    # get_loop_iteration_slice and update_implicit_loop take no loop_dim (api_signatures):
    # the index start_implicit_loop returns carries it.
    prompts = torch.tensor([[5, 8], [6, START], [START, START]], dtype=torch.int32)  # [S, B]
    index = cstorch.experimental.start_implicit_loop(prompts, 0)
    assert index.tolist() == [[1, 0]]
    hidden = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    sliced = cstorch.experimental.get_loop_iteration_slice(hidden, index)
    assert torch.equal(sliced[0], torch.stack([hidden[1, 0], hidden[0, 1]]))
    out = cstorch.experimental.update_implicit_loop(prompts, index, torch.tensor([[40, 41]]),
                                                    None, START)
    assert out.tolist() == [[5, 8], [6, 41], [40, START]]
    plain = torch.tensor([[2, 1]])   # an index of [B, S] data made elsewhere: dim 1 by shape
    assert cstorch.experimental.get_loop_iteration_slice(
        torch.arange(6).reshape(2, 3), plain.reshape(2, 1)).tolist() == [[2], [4]]
    with pytest.raises(ValueError, match="no loop dimension"):
        cstorch.experimental.get_loop_iteration_slice(hidden, torch.tensor([[1, 2], [0, 1]]))


def test_compression_apply_and_annotate():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    comp = cstorch.experimental.Compression("lz", "*.weight")
    assert comp.apply(model) is model
    assert sorted(comp.compressed) == ["0.weight", "1.weight"]
    assert comp.format_of(model[0].weight) == "lz" and comp.format_of(model[0].bias) is None
    t = torch.ones(2)
    assert comp.annotate(t) is t and comp.format_of(t) == "lz"
    with pytest.raises(TypeError):
        comp.apply(t)
    with pytest.raises(TypeError):
        comp.annotate([1])


def test_numpy_module():
    import numpy as np
    import cerebras.pytorch.numpy as cnp
    t = torch.randn(3).to(torch.bfloat16)
    assert torch.equal(cnp.from_numpy(cnp.to_numpy(t)), t)
    assert cnp.from_numpy(np.arange(3)).tolist() == [0, 1, 2]
