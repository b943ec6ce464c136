"""cstorch.sparse: Static, GMP, SET and RigL applied to a model and its optimizer give the
same parameters, masks and optimizer state inside one traced step (CPU backend) as eagerly,
step by step; configuration, filters, schedules and the error paths."""
import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch

RTOL = 1e-5
STEPS = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 6)
        self.static = torch.nn.Linear(6, 8)
        self.gmp = torch.nn.Linear(8, 8)
        self.set = torch.nn.Linear(8, 8)
        self.rigl = torch.nn.Linear(8, 3)
        self.norm = torch.nn.LayerNorm(3)   # stays dense by default (not used in forward)

    def forward(self, ids):
        h = self.embedding(ids).mean(1)
        h = torch.tanh(self.static(h))
        h = torch.tanh(self.gmp(h))
        h = torch.tanh(self.set(h))
        return self.rigl(h)


CONFIG = [
    {"sparsity": 0.5, "param_filter": "static.weight", "init_method": "topk"},
    {"algorithm": "gmp", "param_filter": "gmp.*",
     "sparsity": {"type": "linear", "init": 0.1, "slope": 0.1}, "update": {"freq": 2}},
    {"algorithm": "SET", "param_filter": ["set.weight"], "sparsity": 0.5,
     "drop_fraction": {"type": "cosine", "init": 0.5, "half_period": 8},
     "update": {"freq": 2, "stop": 7}},
    {"algorithm": "rigl", "param_filter": lambda name, p: name.startswith("rigl"),
     "sparsity": 0.6, "drop_fraction": 0.4, "update": {"steps": [3, 6]}},
]


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 10, (4, 5), generator=g), torch.randn(4, 3, generator=g))
            for _ in range(STEPS)]


def _run(traced):
    """Train Net under the four algorithms for STEPS steps; the model's state, the optimizer
    state and the loss after every step, the initial masks, the target-sparsity reports."""
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = Net()
    compiled = cstorch.compile(model) if traced else model
    sparsity = cstorch.sparse.configure(CONFIG)
    model.apply(sparsity)
    initial = {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}
    opt = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    opt.apply(sparsity)
    targets = []
    sparsity.register_target_sparsity_hook(
        lambda alg, name, target: targets.append((name, target)))

    def body(ids, y):
        opt.zero_grad()
        loss = ((compiled(ids) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    step = cstorch.trace(body) if traced else body
    trajectory = []
    for ids, y in _batches():
        loss = step(ids, y)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt_state = {f"{i}.{k}": v.detach().clone()
                     for i, p in enumerate(model.parameters())
                     for k, v in opt.state[p].items() if v.dim() > 0}
        trajectory.append((float(loss.detach()), state, opt_state))
    if traced:
        assert step.captures == 1
    # The gradients the last step left were masked (the static mask never moves).
    grad = model.static.weight.grad.detach()
    assert torch.all(grad[~model.static.weight_mask] == 0) and torch.any(grad != 0)
    return model, sparsity, initial, trajectory, targets


@pytest.fixture(scope="module")
def runs():
    return _run(False), _run(True)


def _assert_close(actual, expected, what):
    if expected.dtype == torch.bool:
        assert torch.equal(actual, expected), what
    else:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=1e-6, msg=what)


def test_traced_equals_eager_step_by_step(runs):
    (_, _, init_e, traj_e, _), (_, _, init_t, traj_t, _) = runs
    for key in init_e:
        _assert_close(init_t[key], init_e[key], key)
    for i, ((loss_e, state_e, opt_e), (loss_t, state_t, opt_t)) in enumerate(zip(traj_e, traj_t)):
        assert loss_t == pytest.approx(loss_e, rel=RTOL), i
        assert state_t.keys() == state_e.keys()
        for key in state_e:
            _assert_close(state_t[key], state_e[key], f"step {i}: {key}")
        assert opt_t.keys() == opt_e.keys()
        for key in opt_e:
            _assert_close(opt_t[key], opt_e[key], f"step {i}: optimizer state {key}")


def test_which_parameters_are_sparse(runs):
    model, sparsity, initial, _, _ = runs[1]
    assert sorted(initial) == ["gmp.bias_mask", "gmp.weight_mask", "rigl.bias_mask",
                               "rigl.weight_mask", "set.weight_mask", "static.weight_mask"]
    assert isinstance(sparsity, cstorch.sparse.Group)
    assert isinstance(sparsity, cstorch.sparse.SparsityAlgorithm)
    kinds = [type(a) for a in sparsity.algorithms]
    sparse = cstorch.sparse
    assert kinds == [sparse.Static, sparse.GMP, sparse.SET, sparse.RigL]
    assert sparsity.num_sparse_params == 6
    assert sparsity.state_dict() == {"groups": [{"step": STEPS}] * 4}


def test_masks_hold_on_parameters_and_optimizer_state(runs):
    for model, _, _, trajectory, _ in runs:
        state, opt_state = trajectory[-1][1], trajectory[-1][2]
        names = [n for n, _ in model.named_parameters()]
        for key, mask in state.items():
            if not key.endswith("_mask"):
                continue
            name = key[:-len("_mask")]
            assert torch.all(state[name][~mask] == 0), name
            i = names.index(name)
            assert torch.all(opt_state[f"{i}.momentum_buffer"][~mask] == 0), name


def test_each_algorithm_follows_its_schedule(runs):
    _, _, initial, trajectory, _ = runs[1]

    def density(step, key):
        return trajectory[step][1][key].float().mean().item()

    # Static: the topk pattern of the initial weights, never changed.
    for step in range(STEPS):
        assert torch.equal(trajectory[step][1]["static.weight_mask"], initial["static.weight_mask"])
    assert density(0, "static.weight_mask") == 0.5
    # GMP: level 0.1 + 0.1 * t, updated at t = 2, 4, 6, 8 (t = optimizer steps taken);
    # only weights still kept survive an update.
    assert initial["gmp.weight_mask"].float().mean().item() == pytest.approx(_kept(0.1) / 64)
    for t, level in ((1, 0.1), (2, 0.3), (3, 0.3), (4, 0.5), (6, 0.7), (8, 0.9)):
        assert density(t - 1, "gmp.weight_mask") == pytest.approx(_kept(level) / 64), t
    for t in range(1, STEPS):
        before = trajectory[t - 1][1]["gmp.weight_mask"]
        assert not torch.any(trajectory[t][1]["gmp.weight_mask"] & ~before)
    # SET and RigL keep their level but move connections on their update steps only.
    for key, updates in (("set.weight_mask", {2, 4, 6}), ("rigl.weight_mask", {3, 6})):
        previous = initial[key]
        for t in range(1, STEPS + 1):
            mask = trajectory[t - 1][1][key]
            assert mask.sum() == previous.sum(), (key, t)
            assert torch.equal(mask, previous) == (t not in updates), (key, t)
            previous = mask


def _kept(level, n=64):
    """What the reference keeps: int((1 - level) * n) in float32 arithmetic (57 of 64 at
    0.1, 44 at 0.3)."""
    one, level32 = np.float32(1), np.float32(level)
    return int(np.floor((one - level32) * np.float32(n)))


def test_target_sparsity_hook_reports_every_step(runs):
    for _, _, _, _, targets in runs[:1]:
        gmp = [float(t) for name, t in targets if name == "gmp.weight"]
        assert gmp == pytest.approx([0.1 + 0.1 * t for t in range(1, STEPS + 1)], rel=1e-6)


def test_gradients_are_masked_after_backward():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 4)
    sparsity = cstorch.sparse.Static(sparsity=0.75, init_method="checkerboard")
    model.apply(sparsity)
    assert model.weight_mask.sum() == 5 and model.bias_mask.sum() == 1
    model(torch.randn(3, 5)).sum().backward()
    assert torch.all(model.weight.grad[~model.weight_mask] == 0)
    assert torch.all(model.weight.grad[model.weight_mask] != 0)


def test_weights_written_later_are_masked_before_forward():
    cstorch.backend("CPU")
    model = torch.nn.Linear(4, 4, bias=False)
    model.apply(cstorch.sparse.Static(sparsity=0.5))
    with torch.no_grad():
        model.weight.fill_(1.0)
    out = model(torch.ones(1, 4))
    assert torch.equal(out[0], model.weight_mask.sum(1).float())
    assert torch.all(model.weight[~model.weight_mask] == 0)


def test_requires_dense_and_default_filter():
    cstorch.backend("CPU")
    model = Net()
    model.gmp.weight.requires_dense = True
    sparsity = cstorch.sparse.configure(0.3)   # a level: Static on the default parameters
    model.apply(sparsity)
    masks = sorted(k for k in model.state_dict() if k.endswith("_mask"))
    # Embeddings, norms, biases and requires_dense parameters stay dense.
    assert masks == ["rigl.weight_mask", "set.weight_mask", "static.weight_mask"]
    f = cstorch.sparse.configure.default_sparse_param_filter
    from cerebras.pytorch.sparse.configure import default_sparse_param_filter
    assert f is default_sparse_param_filter
    assert f("layers.0.fc.weight", torch.zeros(2, 2))
    assert not f("layers.0.fc.bias", torch.zeros(2))
    assert not f("lm_head.weight", torch.zeros(2, 2))
    assert not f("ln_f.norm.weight", torch.zeros(2, 2))
    # importing the submodule by name leaves cstorch.sparse.configure callable
    assert callable(cstorch.sparse.configure)


def test_names_are_full_names_when_applied_through_module_apply():
    cstorch.backend("CPU")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Sequential(torch.nn.Linear(3, 3)))
    sparsity = cstorch.sparse.Group({"1.0.weight": cstorch.sparse.Static(sparsity=0.5)})
    model.apply(sparsity)
    assert list(sparsity.sparse_params) == ["1.0.weight"]


def test_state_dict_resumes_the_step_counter():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 6)
    sparsity = cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.0, "slope": 0.05})
    model.apply(sparsity)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    sparsity.load_state_dict({"step": 10})   # before optimizer.apply: kept until then
    opt.apply(sparsity)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    assert sparsity.state_dict() == {"step": 11}
    assert model.weight_mask.sum() == 36 - round(0.55 * 36)


def test_manual_update_when_autoupdate_is_off():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4, bias=False)
    sparsity = cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.0, "slope": 0.25})
    model.apply(sparsity)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    opt.apply(sparsity)
    sparsity.autoupdate = False
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert sparsity.state_dict() == {"step": 0} and model.weight_mask.all()
    sparsity.update()
    assert sparsity.state_dict() == {"step": 1} and model.weight_mask.sum() == 12


@pytest.mark.parametrize("schedule, steps, expected", [
    ({"type": "exp", "init": 0.0, "gamma": 0.5, "final": 0.8}, [0, 2],
     [0.0, 0.8 * (1 - 0.36787944)]),
    ({"type": "power", "init": 0.2, "beta": 1.0}, [0, 3], [0.2, 0.8]),
    ({"type": "cycling", "values": [0.1, 0.2, 0.3]}, [0, 4, 5], [0.1, 0.2, 0.3]),
    ({"type": "cosine", "init": 0.6, "half_period": 4, "minimum": 0.2}, [0, 4, 8], [0.6, 0.2, 0.6]),
    ([0.25, 0.5], [1], [0.5]),
    (0.3, [7], [0.3]),
])
def test_hyperparameter_schedules(schedule, steps, expected):
    s = cstorch.sparse.make_hyperparameter_schedule(schedule)
    assert [s.value_at(t) for t in steps] == pytest.approx(expected, rel=1e-6)


def test_update_schedules():
    freq = cstorch.sparse.make_update_schedule({"freq": 3, "start": 2, "stop": 9})
    hits = [t for t in range(12) if bool(freq(torch.tensor(float(t))))]
    assert hits == [2, 5, 8]
    listed = cstorch.sparse.make_update_schedule({"steps": [4, 1]})
    assert [t for t in range(6) if bool(listed(torch.tensor(float(t))))] == [1, 4]
    # a list of levels pairs with update steps
    gmp = cstorch.sparse.GMP(sparsity=[0.1, 0.5], update={"steps": [2, 5]})
    assert [gmp.sparsity.value_at(t) for t in (0, 4, 5)] == pytest.approx([0.1, 0.1, 0.5])


@pytest.mark.parametrize("make, error, match", [
    (lambda: cstorch.sparse.Static(), ValueError, "needs a sparsity level"),
    (lambda: cstorch.sparse.Static(sparsity=1.5), ValueError, r"sparsity must be in \[0, 1\)"),
    (lambda: cstorch.sparse.Static(sparsity=0.5, init_method="bogus"), ValueError,
     "unknown sparsity init_method 'bogus'"),
    (lambda: cstorch.sparse.Static(sparsity=0.5, foo=1), TypeError,
     "unexpected keyword argument 'foo'"),
    (lambda: cstorch.sparse.configure({"sparsity": 0.5, "param_filter": 3}), TypeError,
     "filter must be a string or list of strings"),
    (lambda: cstorch.sparse.GMP(), ValueError, "needs a sparsity level or schedule"),
    (lambda: cstorch.sparse.GMP(sparsity=0.5, update={"freq": 0}), ValueError,
     "freq must be at least 1"),
    (lambda: cstorch.sparse.GMP(sparsity=0.5, update={"every": 2}), ValueError,
     r"unknown update keys \['every'\]"),
    (lambda: cstorch.sparse.GMP(sparsity=0.5, update={"freq": 4, "start": 8, "stop": 2}),
     ValueError, "stop must be an integer after start"),
    (lambda: cstorch.sparse.GMP(sparsity={"type": "wavy"}), ValueError, "needs a 'type'"),
    (lambda: cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.1}), TypeError,
     "slope"),
    (lambda: cstorch.sparse.GMP(sparsity=0.5), ValueError,
     "Configured with constant sparsity 0.5"),
    (lambda: cstorch.sparse.map_sparsity_algorithm("magic"), NameError,
     "unknown sparsity algorithm 'magic'"),
    (lambda: cstorch.sparse.configure({"type": "set", "algorithm": "set", "sparsity": 0.5}),
     ValueError, "both 'type' and 'algorithm'"),
    (lambda: cstorch.sparse.SET(sparsity=0.5, drop_fraction=2.0), ValueError,
     r"drop_fraction must be in \[0, 1\]"),
    (lambda: cstorch.sparse.RigL(sparsity=0.5, balance_in_groups=2), ValueError,
     "not supported"),
    (lambda: cstorch.sparse.configure({"algorithm": "magic", "sparsity": 0.5}), ValueError,
     "unknown sparsity algorithm 'magic'"),
    (lambda: cstorch.sparse.configure("0.5"), TypeError, "a level, a dict or a list"),
    (lambda: cstorch.sparse.configure([0.5]), TypeError, "entry 0 must be a dict"),
    (lambda: cstorch.sparse.configure({"algorithm": "set", "sparsity": 0.5, "bad": 1}),
     TypeError, "unexpected keyword argument 'bad'"),
    (lambda: cstorch.sparse.Group({"*": "static"}), TypeError, "must be a SparsityAlgorithm"),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_targets_and_init_methods():
    cstorch.backend("CPU")
    sparsity = cstorch.sparse.Static(sparsity=0.5)
    with pytest.raises(TypeError, match="applies to a torch.nn.Module or an optimizer"):
        sparsity.apply("model")
    bad = cstorch.sparse.Static(sparsity=0.5, init_method=lambda p, s: torch.ones(3))
    with pytest.raises(ValueError, match=r"mask of the parameter's shape \(2, 2\)"):
        torch.nn.Linear(2, 2, bias=False).apply(bad)
    gmp = cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.1, "slope": 0.1})
    with pytest.raises(RuntimeError, match=r"call optimizer.apply\(sparsity\) first"):
        gmp.update(cstorch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1))
    with pytest.raises(KeyError, match="expects a 'step' entry"):
        gmp.load_state_dict({})
    with pytest.raises(ValueError, match="'groups' list"):
        cstorch.sparse.configure(0.5).load_state_dict({"groups": []})


def test_masks_and_step_round_trip_through_a_checkpoint(tmp_path):
    def build(seed):
        cstorch.backend("CPU")
        torch.manual_seed(seed)
        model = Net()
        cstorch.compile(model)
        sparsity = cstorch.sparse.configure(CONFIG)
        model.apply(sparsity)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.apply(sparsity)
        return model, opt, sparsity

    model, opt, sparsity = build(0)
    sparsity.load_state_dict({"groups": [{"step": 5}] * 4})
    path = str(tmp_path / "ckpt.mdl")
    cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                  "sparsity": sparsity.state_dict()}, path)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}

    model2, opt2, sparsity2 = build(1)
    assert not torch.equal(model2.set.weight_mask, saved["set.weight_mask"])
    ckpt = cstorch.load(path)
    assert sorted(k for k in ckpt["model"] if k.endswith("_mask")) == \
        sorted(k for k in saved if k.endswith("_mask"))
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    sparsity2.load_state_dict(ckpt["sparsity"])
    for key, value in saved.items():
        assert torch.equal(model2.state_dict()[key].detach(), value), key
    assert model2.set.weight_mask.dtype == torch.bool
    assert sparsity2.state_dict() == {"groups": [{"step": 5}] * 4}
