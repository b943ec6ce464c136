"""Lazy initialisation: tensors created inside `backend.device` on a CSX backend hold no host
data until `cstorch.compile` builds them on the devices (`cstorch/lazy_init/`)."""
import copy
import ctypes
import io
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import cstorch
from cstorch.backends import csx
from cstorch.lazy_init import LazyInitTensor, is_lazy
from wafer import host_memory


@pytest.fixture(autouse=True)
def lazy_flag():
    csx.debug.lazy_initialization = True
    yield
    csx.debug.lazy_initialization = True


class Model(torch.nn.Module):
    """Random inits (Linear, Embedding), deterministic ones (LayerNorm, the padding row,
    the buffers) and a parameter written through views."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)
        self.emb = torch.nn.Embedding(10, 16, padding_idx=0)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 3)
        self.register_buffer("pos", torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2 + 1)
        self.register_buffer("eye", torch.eye(3, 4))
        self.register_buffer("full", torch.full((2, 2), 0.25))
        self.mix = torch.nn.Parameter(torch.zeros(4, 3))
        with torch.no_grad():
            self.mix[1].fill_(2.0)
            self.mix[:3, 2].copy_(self.pos[0])
            self.mix.t()[0].add_(1.0)

    def forward(self, tokens):
        h = self.emb(tokens).mean(1)
        return self.head(self.norm(torch.tanh(self.fc(h))))


def deterministic(model):
    return {k: v for k, v in model.state_dict().items()
            if not k.startswith(("fc.", "emb.", "head."))}


def host(t):
    return t.host() if hasattr(t, "host") else t.detach()


def test_device_prints_its_type():
    assert str(cstorch.backend("CSX").device) == "CSX"
    assert f"Device={cstorch.backend('CPU').device}" == "Device=CPU"
    assert repr(cstorch.backend().device) == "device(type='CPU')"


def test_parameters_hold_no_host_data_until_compile():
    backend = cstorch.backend("CSX")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing falls back to the host
        with backend.device:
            model = Model()
    tensors = model.state_dict(keep_vars=True)
    assert all(is_lazy(t) and type(t) is LazyInitTensor for t in tensors.values())
    assert isinstance(model.fc.weight, torch.nn.Parameter) and model.fc.weight.requires_grad
    assert not model.pos.requires_grad
    cstorch.compile(model, backend)
    assert not any(is_lazy(t) for t in model.state_dict(keep_vars=True).values())


def test_deterministic_inits_are_exact():
    backend = cstorch.backend("CSX")
    with backend.device:
        model = Model()
    ref = Model()
    cstorch.compile(model, backend)
    want = deterministic(ref)
    got = deterministic(model)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(host(got[k]), want[k]), k
    assert torch.equal(host(model.emb.weight)[0], torch.zeros(16))   # padding row


def test_nn_init_functions_are_recorded():
    init = torch.nn.init
    backend = cstorch.backend("CSX")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing falls back to the host
        with backend.device:
            made = {name: torch.empty(*shape) for name, shape in
                    [("eye", (4, 6)), ("dirac", (4, 2, 3)), ("ortho", (6, 8)), ("trunc", (16, 16)),
                     ("const", (5,))]}
            init.eye_(made["eye"])
            init.dirac_(made["dirac"])
            init.orthogonal_(made["ortho"])
            init.trunc_normal_(made["trunc"], std=0.02, a=-0.04, b=0.04)
            init.constant_(made["const"], 0.3)
    assert all(is_lazy(t) for t in made.values())
    values = {k: t.materialize() for k, t in made.items()}
    assert torch.equal(values["eye"], init.eye_(torch.empty(4, 6)))
    assert torch.equal(values["dirac"], init.dirac_(torch.empty(4, 2, 3)))
    assert torch.equal(values["const"], torch.full((5,), 0.3))
    q = values["ortho"]
    assert torch.allclose(q @ q.t(), torch.eye(6), atol=1e-5)
    assert values["trunc"].abs().max() <= 0.04 and 0.01 < values["trunc"].std() < 0.03


def test_random_inits_are_reproducible_and_plausible():
    backend = cstorch.backend("CSX")

    def build(seed):
        torch.manual_seed(seed)
        with backend.device:
            return Model()

    a, b, c = build(0), build(0), build(1)
    cstorch.compile(a, backend)
    w, bias = host(a.fc.weight), host(a.fc.bias)
    assert w.shape == (8, 16) and w.dtype == torch.float32
    bound = 1 / math.sqrt(16)        # kaiming_uniform_(a=sqrt(5)) of Linear(16, 8)
    assert w.abs().max() <= bound and bias.abs().max() <= bound
    assert abs(w.std().item() - bound / math.sqrt(3)) < 0.3 * bound
    emb = host(a.emb.weight)[1:]     # normal_(0, 1)
    assert abs(emb.mean().item()) < 0.25 and 0.8 < emb.std().item() < 1.2
    assert torch.equal(b.fc.weight.materialize(), w)     # same seed, same values
    assert not torch.equal(c.fc.weight.materialize(), w)  # another seed
    assert not torch.equal(host(a.head.weight)[:, :3], w[:3, :3])  # tensors differ


def test_reading_before_compile_gives_what_compile_places(capsys):
    backend = cstorch.backend("CSX")
    torch.manual_seed(0)
    with backend.device:
        model = Model()
    print(model.fc.weight)
    assert "Parameter containing" in capsys.readouterr().out
    total = model.fc.weight.sum()
    assert type(total) is torch.Tensor
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    saved = torch.load(io.BytesIO(buf.getvalue()))
    assert all(type(v) is torch.Tensor for v in saved.values())
    assert all(is_lazy(t) for t in model.state_dict(keep_vars=True).values())  # nothing kept
    twin = copy.deepcopy(model)
    assert is_lazy(twin.fc.weight) and isinstance(twin.fc.weight, torch.nn.Parameter)
    cstorch.compile(model, backend)
    for k, v in model.state_dict().items():
        assert torch.equal(host(v), saved[k]), k
    assert torch.equal(twin.fc.weight.materialize(), saved["fc.weight"])
    assert torch.allclose(total, saved["fc.weight"].sum())


def test_writes_after_the_context_are_recorded():
    backend = cstorch.backend("CSX")
    with backend.device:
        model = Model()
    before = model.fc.weight.materialize()
    with torch.no_grad():
        model.fc.weight.mul_(2.0)
        model.fc.weight.data[0].zero_()
    assert is_lazy(model.fc.weight)
    cstorch.compile(model, backend)
    want = before * 2
    want[0] = 0
    assert torch.equal(host(model.fc.weight), want)


def test_dtype_conversion_inside_the_context():
    backend = cstorch.backend("CSX")
    with backend.device:
        model = torch.nn.Linear(16, 8)
        before = model.weight.materialize()
        model.to(torch.bfloat16)
    assert is_lazy(model.weight) and model.weight.dtype == torch.bfloat16
    cstorch.compile(model, backend)
    assert torch.equal(host(model.weight), before.bfloat16())


def test_a_lazily_built_model_trains():
    backend = cstorch.backend("CSX")
    torch.manual_seed(0)
    with backend.device:
        model = Model()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    start = host(model.fc.weight).clone()

    @cstorch.trace
    def step(tokens, labels):
        loss = F.cross_entropy(compiled(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    g = torch.Generator().manual_seed(1)
    tokens, labels = torch.randint(0, 10, (12, 5), generator=g), torch.randint(0, 3, (12,), generator=g)
    losses = [float(step(tokens, labels)) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert not torch.equal(host(model.fc.weight), start)


def test_flag_false_and_cpu_backends_create_eagerly():
    def build(backend):
        torch.manual_seed(0)
        with backend.device:
            return Model()

    torch.manual_seed(0)
    ref = Model()
    csx.debug.lazy_initialization = False
    eager_csx = build(cstorch.backend("CSX"))
    csx.debug.lazy_initialization = True
    cpu = build(cstorch.backend("CPU"))
    for model in (eager_csx, cpu):
        assert not any(isinstance(t, LazyInitTensor) for t in model.state_dict().values())
        for k, v in ref.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k


def test_an_op_without_a_recipe_runs_on_the_host_with_a_warning():
    backend = cstorch.backend("CSX")
    with backend.device:
        w = torch.nn.Parameter(torch.empty(4, 4))
        with pytest.warns(UserWarning, match="exponential_.*ran on the host"):
            with torch.no_grad():
                w.exponential_()
    assert not is_lazy(w) and w.is_materialized
    value = w.materialize()
    assert (value > 0).all()
    module = torch.nn.Module()
    module.w = w
    cstorch.compile(module, backend)
    assert torch.equal(host(module.w), value)


def test_a_checkpoint_loaded_inside_the_context_is_kept_exactly():
    buf = io.BytesIO()
    torch.save({"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.tensor([0.5, -0.5])}, buf)
    backend = cstorch.backend("CSX")
    with backend.device:
        state = torch.load(io.BytesIO(buf.getvalue()))
        model = torch.nn.Linear(3, 2)
        model.load_state_dict(state)
    assert type(state["weight"]) is torch.Tensor
    assert not is_lazy(model.weight) and model.weight.is_materialized   # a host value
    cstorch.compile(model, backend)
    assert torch.equal(host(model.weight), state["weight"])
    assert torch.equal(host(model.bias), state["bias"])


def test_what_cannot_be_done_lazily_says_what_to_do():
    backend = cstorch.backend("CSX")
    with backend.device:
        t = torch.empty(4, 4)
        with pytest.raises(RuntimeError, match="lazy_initialization = False"):
            t.resize_(8, 8)
        with pytest.raises(RuntimeError, match="cannot view a lazily initialised tensor"):
            t.view(torch.int32)


def test_int64_and_float64_are_created_exactly_on_the_host():
    backend = cstorch.backend("CSX")
    with backend.device:
        ids = torch.arange(5)
        wide = torch.full((3,), 0.1, dtype=torch.float64)
    assert type(ids) is torch.Tensor and type(wide) is torch.Tensor
    assert wide[0].item() == 0.1


def test_a_step_traced_inside_the_context_sees_real_factories():
    backend = cstorch.backend("CSX")
    with backend.device:
        @cstorch.trace
        def step(x):
            return x + torch.arange(3, dtype=torch.float32) + torch.ones(3)

        out = step(torch.zeros(3))
    assert torch.equal(torch.as_tensor(out), torch.tensor([1.0, 2.0, 3.0]))


def test_a_large_random_tensor_is_drawn_in_blocks(monkeypatch):
    import cstorch.lazy_init.random_draws as random_draws
    monkeypatch.setattr(random_draws, "_DRAW_ELEMENTS", 64)
    backend = cstorch.backend("CSX")
    with backend.device:
        w = torch.empty(48, 16).uniform_(-1, 1)
    read = w.materialize()
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(w)
    cstorch.compile(module, backend)
    placed = host(module.w)
    assert torch.equal(placed, read)
    assert placed.abs().max() <= 1 and abs(placed.mean().item()) < 0.1
    assert len({tuple(r.tolist()) for r in placed}) == 48   # no block repeats another


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _glibc_mallinfo2():
    fn = getattr(host_memory._glibc(), "mallinfo2", None)
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _glibc_mallinfo2()


def host_bytes():
    """The bytes malloc has handed out and not had back, where glibc says (a backend keeps
    freed buffers resident, wafer.keep_buffers_mapped, so a new tensor may not grow the
    resident set); elsewhere the resident set size."""
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        return info.uordblks + info.hblkhd
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024


@pytest.mark.skipif(_MALLINFO2 is None and not os.path.exists("/proc/self/status"),
                    reason="reads glibc's mallinfo2 or /proc/self/status")
def test_host_memory_does_not_grow_by_the_parameter():
    size = 64 * 2 ** 20
    backend = cstorch.backend("CSX")
    with backend.device:
        torch.nn.Linear(8, 8)   # warm the dispatch machinery
    base = host_bytes()
    with backend.device:
        lazy = torch.nn.Linear(4096, 4096, bias=False)
    lazy_growth = host_bytes() - base
    csx.debug.lazy_initialization = False
    base = host_bytes()
    with backend.device:
        eager = torch.nn.Linear(4096, 4096, bias=False)
    eager_growth = host_bytes() - base
    assert is_lazy(lazy.weight) and type(eager.weight) is torch.nn.Parameter
    assert lazy_growth < size / 8, lazy_growth
    assert eager_growth > size * 3 / 4, eager_growth


SCRIPT = r"""
import json, sys
import torch
import cstorch
torch.manual_seed(0)
backend = cstorch.backend("CSX")
with backend.device:
    model = torch.nn.Linear(16, 8)
read = model.weight.materialize()
cstorch.compile(model, backend)
array = model.weight.cell.array
print(json.dumps({"spec": str(tuple(array.sharding.spec)), "devices": len(array.sharding.device_set),
                  "equal": bool(torch.equal(model.weight.host(), read)), "values": read.tolist()}))
"""


def test_values_do_not_depend_on_the_mesh():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env={**env, "PYTHONPATH": root},
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8 and out["spec"] == "('rows', 'cols')" and out["equal"]
    torch.manual_seed(0)
    with cstorch.backend("CSX").device:
        model = torch.nn.Linear(16, 8)
    assert torch.equal(model.weight.materialize(), torch.tensor(out["values"]))
