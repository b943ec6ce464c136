"""The rest of `cstorch.core.annotation` and `cstorch.core.name_scope` as the reference
names them: annotation modes from a config, hooks, skip modes, scope names, module names
and the debug scope."""
import importlib

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cerebras.pytorch.core.annotation import (AnnotationMode, ReverseHooksExecutor,
                                              SkipBwdAnnotation, annotate, current_annotations,
                                              get_hooks_executor,
                                              register_function_mode_forward_hook,
                                              register_function_mode_forward_pre_hook)

name_scope_module = importlib.import_module("cerebras.pytorch.core.name_scope")


class Tagged(AnnotationMode):
    def get_attribute(self, config):
        return AnnotationMode.Attribute("tag", "bwd" if self.is_backward else "fwd")


def test_annotation_modes_hooks_and_skips():
    with pytest.raises(TypeError):
        AnnotationMode(AnnotationMode.Config(True, True))      # abstract: no get_attribute
    with pytest.raises(TypeError, match="Config"):
        Tagged("fwd")
    mode = Tagged(AnnotationMode.Config(enable_fwd=True, enable_bwd=False))
    assert mode.config == AnnotationMode.Config(True, False)
    calls = []
    pre = register_function_mode_forward_pre_hook(lambda fn, a, k: calls.append(("pre", a)))
    post = register_function_mode_forward_hook(lambda fn, a, k, out: calls.append(("post", out)))

    @annotate(mode)
    def double(x):
        calls.append(("in", [a.value for a in current_annotations()]))
        return 2 * x

    try:
        assert double(3) == 6
    finally:
        pre.remove()
        post.remove()
    assert calls == [("pre", (3,)), ("in", ["fwd"]), ("post", 6)]
    assert double.__cs_annotations__ == [(AnnotationMode.Attribute("tag", "fwd"), None)]
    attr = AnnotationMode.Attribute("tag", "x")
    mode.enable_annotation(attr, False, True, True)
    assert [a.value for a in current_annotations()] == ["x", "x"]
    with pytest.raises(RuntimeError, match="enabled last"):
        mode.disable_annotation(AnnotationMode.Attribute("tag", "y"))
    mode.disable_annotation(attr)
    assert current_annotations() == []
    t = torch.ones(2, requires_grad=True) * 2
    assert mode.enable_bwd_annotation((t, 1), {"k": t}) == ((t, 1), {"k": t})
    fns = []
    assert mode.hook_tensor_grad_fn(t, fns) is t and fns == [t.grad_fn]
    skip = SkipBwdAnnotation(1, k=2)
    assert skip.enable_annotation(attr) is None and skip.disable_annotation(attr) is None


def test_reverse_hooks_executor():
    order = []
    executor = ReverseHooksExecutor()
    executor.register_hook(lambda: order.append(1))
    handle = executor.register_hook(lambda: order.append(2))
    executor.register_hook(lambda: order.append(3))
    executor()
    handle.remove()
    executor()
    assert order == [3, 2, 1, 3, 1]
    t = torch.ones(2)
    assert get_hooks_executor(t) is get_hooks_executor(t)
    with pytest.raises(TypeError):
        executor.register_hook(5)


def test_scope_and_module_names():
    m = name_scope_module
    assert str(m.ScopeName("enc", "fwd")) == "enc" and str(m.ScopeName()) == ""
    assert m.ScopeName("a", "fwd", "f") == m.ScopeName("a", "fwd", "f") != m.ScopeName("a")
    gen = m.ModuleNamesGenerator
    a, b = nn.GELU(), nn.GELU()
    assert gen.get_name(a) == "GELU" and gen.get_name(b) == "GELU_1" and gen.get_name(a) == "GELU"
    assert gen.get_or_create_instances_info(nn.GELU)["count"] == 2
    model = nn.Sequential(nn.Linear(2, 2))
    assert m.add_debug_name(model) is model and m.get_debug_name(model[0]) == "model.0"
    with m.name_scope("a/b", raw=True):
        assert cstorch.core.current_name_scope() == "a/b"
    with m.name_scope("a/b"):
        assert cstorch.core.current_name_scope() == "a|b"
    try:
        m.set_debug_scope(m.ScopeName("fwd"))
        with cstorch.name_scope("enc"):
            assert cstorch.core.current_name_scope() == "fwd/enc"
    finally:
        m.set_debug_scope(None)
    assert cstorch.core.current_name_scope() == ""
    with pytest.raises(TypeError):
        cstorch.core.scopes.set_debug_scope(3)


def test_debug_scope_names_the_ops_of_a_traced_step():
    cstorch.backend("CPU")
    model = nn.Linear(3, 2)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        with cstorch.name_scope("head"):
            return compiled(x).sum()

    name_scope_module.set_debug_scope("fwd")
    try:
        text = step.to_jax(torch.randn(4, 3)).stablehlo()
    finally:
        name_scope_module.set_debug_scope(None)
    assert "fwd/head/" in text
