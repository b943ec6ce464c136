"""The public members of `cstorch.optim.Optimizer` and `Adam` that the real package has
(api_signatures.json) do what they say: zero_grad hooks run, visit_state reaches every
state tensor, the global step is per parameter, Adam keeps its weight decay as an L2 rate."""
import pytest
import torch

import cerebras.pytorch as cstorch


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(3, 2, generator=g)),
            torch.nn.Parameter(torch.randn(2, generator=g))]


def _set_grads(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_zero_grad_hooks_run_around_zero_grad_and_can_be_removed():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.SGD(params, lr=0.1)
    calls = []

    def pre(optimizer, args, kwargs):
        calls.append(("pre", optimizer, args, dict(kwargs),
                      [p.grad is not None for p in params]))

    def post(optimizer, args, kwargs):
        calls.append(("post", optimizer, args, dict(kwargs), [p.grad is None for p in params]))

    pre_handle = opt.register_zero_grad_pre_hook(pre)
    post_handle = opt.register_zero_grad_post_hook(post)
    _set_grads(params)
    opt.zero_grad()
    assert calls == [("pre", opt, (), {}, [True, True]), ("post", opt, (), {}, [True, True])]

    calls.clear()
    pre_handle.remove()
    _set_grads(params)
    opt.zero_grad(set_to_none=True)
    assert calls == [("post", opt, (), {"set_to_none": True}, [True, True])]
    post_handle.remove()
    _set_grads(params)
    opt.zero_grad()
    assert len(calls) == 1


def test_a_pre_hook_may_replace_the_arguments():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.SGD(params, lr=0.1)
    opt.register_zero_grad_pre_hook(lambda o, args, kwargs: ((), {"set_to_none": False}))
    _set_grads(params)
    opt.zero_grad()
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in params)


def test_a_pre_hook_returning_something_else_is_an_error():
    cstorch.backend("CPU")
    opt = cstorch.optim.SGD(_params(), lr=0.1)
    opt.register_zero_grad_pre_hook(lambda o, args, kwargs: "nope")
    with pytest.raises(RuntimeError, match=r"None or \(args, kwargs\)"):
        opt.zero_grad()


def test_visit_state_visits_every_state_tensor_and_takes_replacements():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.Adam(params, lr=0.1)
    _set_grads(params)
    opt.step()
    seen = []
    opt.visit_state(lambda t: seen.append(t) or None)
    expected = [t for p in params for t in opt.state[p].values()]
    assert len(seen) == len(expected) == 8
    assert all(a is b for a, b in zip(seen, expected))

    before = {k: v.clone() for k, v in opt.state[params[0]].items()}
    opt.visit_state(lambda t: t * 2)
    for key, value in opt.state[params[0]].items():
        torch.testing.assert_close(value, before[key] * 2, rtol=0, atol=0)


def test_visit_state_replacements_reach_a_compiled_run():
    cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @cstorch.trace
    def step(x):
        opt.zero_grad()
        loss = compiled(x).sum()
        loss.backward()
        opt.step()
        return loss

    x = torch.ones(1, 2)
    step(x)
    opt.visit_state(lambda t: torch.zeros_like(t))
    weight = model.weight.detach().clone()
    step(x)
    # a zeroed momentum buffer: this step moves by lr * grad alone (grad of sum is x)
    torch.testing.assert_close(model.weight.detach(), weight - 0.1 * x, rtol=1e-6, atol=1e-7)


def test_global_step_is_per_parameter_state_after_the_rules_own():
    class Counting(cstorch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1}, enable_global_step=True)

        def preinitialize(self):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["m"] = torch.zeros_like(p)

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.increment_global_step(p)

    cstorch.backend("CPU")
    params = _params()
    opt = Counting(params[:1])
    opt.add_param_group({"params": params[1:]})
    assert [list(opt.state[p]) for p in params] == [["m", "step"], ["m", "step"]]
    opt.step()
    step = opt.increment_global_step(params[1])
    assert step is opt.state[params[1]]["step"] and step.dtype == torch.float32
    assert [float(opt.state[p]["step"]) for p in params] == [1.0, 2.0]


def test_state_dict_and_zero_grad_pass_their_arguments_to_torch():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.SGD(params, lr=0.1, momentum=0.5)
    assert list(opt.state_dict()["param_groups"][0]["params"]) == [0, 1]
    _set_grads(params)
    opt.zero_grad(False)
    assert all(p.grad is not None for p in params)


def test_adam_keeps_weight_decay_as_its_l2_rate():
    cstorch.backend("CPU")
    params = _params()
    opt = cstorch.optim.Adam(params[:1], lr=0.1, weight_decay=0.1)
    group = opt.param_groups[0]
    assert (group["l2_regularization_rate"], group["weight_decay"]) == (0.1, 0.0)
    assert list(group)[-1] == "weight_decay"

    opt.add_param_group({"params": params[1:], "weight_decay": 0.2})
    assert (opt.param_groups[1]["l2_regularization_rate"],
            opt.param_groups[1]["weight_decay"]) == (0.2, 0.0)

    sd = opt.state_dict()
    opt.load_state_dict(sd)  # its own state dict: the rates stay
    assert [g["l2_regularization_rate"] for g in opt.param_groups] == [0.1, 0.2]

    # a state dict whose groups hold weight_decay only (torch.optim.Adam's form)
    for g in sd["param_groups"]:
        g["weight_decay"] = 0.05
        del g["l2_regularization_rate"]
    opt.load_state_dict(sd)
    assert [(g["l2_regularization_rate"], g["weight_decay"]) for g in opt.param_groups] == \
        [(0.05, 0.0), (0.05, 0.0)]
    assert sd["param_groups"][0]["weight_decay"] == 0.05  # the caller's dict is left alone

    groups = [{"weight_decay": 0.3, "l2_regularization_rate": 0.0}]
    opt.handle_weight_decay(groups)
    assert groups == [{"l2_regularization_rate": 0.3, "weight_decay": 0.0}]
