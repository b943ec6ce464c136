"""cstorch.core.annotation, the kernel and kv-group annotaters and
cstorch.lib.cerebras_pytorch_lib.set_attribute: attributes are recorded on the traced
graph and on the function, and what is computed does not change."""
from dataclasses import asdict, dataclass, field, fields

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cerebras.pytorch.core.annotation import (AnnotationMode, create_annotation,
                                              current_annotations)
from cerebras.pytorch.lib import cerebras_pytorch_lib
from cerebras.pytorch.utils.kernel import kernel_annotater
from cerebras.pytorch.utils.num_kv_groups import groups_annotater

CS = "cs.internal"


# Annotation configs written the way Model Zoo writes them.
@dataclass
class NamedConfig(AnnotationMode.Config):
    name: str | None


def named_attribute(config, is_backward):
    return AnnotationMode.Attribute("named_matmul", f"{config.name}.{'bwd' if is_backward else 'fwd'}")


def named_matmul(name, enable_fwd=True, enable_bwd=True):
    return create_annotation(NamedConfig, named_attribute, name=name, enable_fwd=enable_fwd,
                             enable_bwd=enable_bwd)


@dataclass
class WitConfig(AnnotationMode.Config):
    schedule_opt: bool = True
    cse_opt: bool = True


def wit_attribute(config, is_backward):
    values = asdict(config)
    for f in fields(AnnotationMode.Config):
        del values[f.name]
    return AnnotationMode.Attribute("wit", values)


@dataclass
class MaskRangeConfig(AnnotationMode.Config):
    value: list
    enable_fwd: bool = field(default=True, init=False)
    enable_bwd: bool = field(default=True, init=False)


def test_configs_and_attributes_behave_as_model_zoo_declares_them():
    assert [f.name for f in fields(AnnotationMode.Config)] == ["enable_fwd", "enable_bwd"]
    cfg = WitConfig(enable_fwd=True, enable_bwd=False, cse_opt=False)
    assert wit_attribute(cfg, False) == AnnotationMode.Attribute("wit", {"schedule_opt": True,
                                                                         "cse_opt": False})
    assert MaskRangeConfig(value=[1]).enable_bwd is True
    with pytest.raises(TypeError):
        create_annotation(dict, named_attribute)
    with pytest.raises(TypeError):       # the config is built (and checked) at once
        create_annotation(NamedConfig, named_attribute, enable_fwd=True, enable_bwd=True)


def test_annotated_function_records_its_attributes_and_computes_the_same():
    seen = []

    @named_matmul("qk", enable_bwd=False)
    def scores(q, k):
        """Attention scores."""
        seen.extend(current_annotations())
        return q @ k.T

    q, k = torch.randn(3, 4), torch.randn(5, 4)
    assert torch.equal(scores(q, k), q @ k.T)
    assert scores.__name__ == "scores" and scores.__doc__ == "Attention scores."
    assert seen == [AnnotationMode.Attribute("named_matmul", "qk.fwd")]
    assert scores.__cs_annotations__ == [(AnnotationMode.Attribute("named_matmul", "qk.fwd"), None)]
    assert current_annotations() == []


def _graph_nodes(step, *args):
    graph = step.to_jax(*args).program.graph
    return [n for n in graph.graph.nodes if n.op == "call_function"]



class WitMode(AnnotationMode):
    def get_attribute(self, config):
        return AnnotationMode.Attribute("wit", {"cse_opt": False})


def test_forward_and_backward_ops_carry_their_attribute_in_the_traced_graph():
    torch.manual_seed(0)
    cstorch.backend("CPU")
    model = nn.Linear(4, 3)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @named_matmul("head")
    def head(x):
        return compiled(x)

    @cstorch.trace
    def step(x):
        # AnnotationMode(config) with its get_attribute, as the reference has it (it
        # took the attribute itself before).
        with WitMode(AnnotationMode.Config(enable_fwd=True, enable_bwd=False)):
            loss = head(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    x = torch.randn(2, 4)
    nodes = _graph_nodes(step, x)
    annotated = {str(n.target): (n.meta.get("custom") or {}).get(CS) for n in nodes}
    addmm = [n for n in nodes if "addmm" in str(n.target)][0]
    assert addmm.meta["custom"][CS] == {"named_matmul": "head.fwd", "wit": {"cse_opt": False}}
    # The gradient of the matmul (an mm) carries the backward attribute only.
    grads = [(n.meta.get("custom") or {}).get(CS) for n in nodes if str(n.target) == "aten.mm.default"]
    assert {"named_matmul": "head.bwd"} in grads
    pow_node = [n for n in nodes if str(n.target) == "aten.pow.Tensor_Scalar"][0]
    assert pow_node.meta["custom"][CS] == {"wit": {"cse_opt": False}}
    assert annotated  # the optimizer's update, outside any annotation, carries none:
    assert all(CS not in (n.meta.get("custom") or {}) for n in nodes[-4:])

    # Numerics: the same loss as the module computes eagerly.
    w, b = model.weight.host(), model.bias.host()
    expected = (x @ w.T + b).square().mean()
    assert torch.allclose(step(x).host(), expected, rtol=1e-6, atol=1e-7)


def test_kernel_and_groups_annotaters_wrap_torch_functions():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    using_kernel = kernel_annotater("FLASH")
    using_groups = groups_annotater(4)
    fn = using_groups(using_kernel(torch.matmul))
    assert torch.equal(fn(a, b), torch.matmul(a, b))
    attrs = [fwd for fwd, _ in fn.__cs_annotations__]
    assert attrs == [AnnotationMode.Attribute("kernel", "FLASH"),
                     AnnotationMode.Attribute("num_kv_groups", 4)]
    assert kernel_annotater(None)(torch.matmul) is torch.matmul
    assert groups_annotater(None)(torch.matmul) is torch.matmul
    with pytest.raises(ValueError):
        groups_annotater(0)


def test_kernel_attribute_reaches_the_graph_of_a_traced_matmul():
    cstorch.backend("CPU")
    using_kernel = kernel_annotater("FLASH")

    @cstorch.trace
    @torch.no_grad()
    def step(a, b):
        return using_kernel(torch.matmul)(a, b) + 1

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    nodes = _graph_nodes(step, a, b)
    mm = [n for n in nodes if "mm" in str(n.target)][0]
    assert mm.meta["custom"][CS] == {"kernel": "FLASH"}
    add = [n for n in nodes if "add" in str(n.target)][-1]
    assert CS not in (add.meta.get("custom") or {})
    assert torch.allclose(step(a, b).host(), a @ b + 1, rtol=1e-6, atol=1e-6)


def test_set_attribute_records_on_the_tensor_and_merges_dicts():
    x = torch.arange(4.0)
    cerebras_pytorch_lib.set_attribute(x, CS, {"source_vars": ["layer0.out"]})
    cerebras_pytorch_lib.set_attribute(x, CS, {"other": 1})
    cerebras_pytorch_lib.set_attribute(x, "tag", 5)
    assert cerebras_pytorch_lib.get_attributes(x) == {
        CS: {"source_vars": ["layer0.out"], "other": 1}, "tag": 5}
    assert torch.equal(x, torch.arange(4.0))
    assert cerebras_pytorch_lib.get_attributes(torch.ones(1)) == {}
    with pytest.raises(TypeError):
        cerebras_pytorch_lib.set_attribute([1], CS, {})
