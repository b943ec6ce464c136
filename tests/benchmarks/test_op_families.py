# ruff: noqa: E501  (HLO text, one instruction per line, as XLA prints it)
"""`benchmarks.op_families` charges each executed XLA instruction to the ATen op it was
lowered from: a fusion holding a dot counts as that dot's op whatever its root is, the
optimizer's line wins over the op, and instructions XLA made itself are layout work."""
from benchmarks.op_families import classify_instruction, family, hlo_op_names

HLO = '''HloModule jit_step

%fused_computation.7 (param_0: f32[4,8], param_1: f32[8,3]) -> f32[4] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[8,3]{1,0} parameter(1)
  %dot.2 = f32[4,3]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(jax_fn)/aten.mm.default model.py:12/dot_general"}
  %constant.1 = f32[] constant(-inf)
  ROOT %reduce_max.3 = f32[4]{0} reduce(%dot.2, %constant.1), dimensions={1}, to_apply=%max, metadata={op_name="jit(jax_fn)/aten._log_softmax.default step.py:40/reduce_max"}
}

%fused_computation.9 (param_0.1: f32[4,3]) -> f32[4,3] {
  %param_0.1 = f32[4,3]{1,0} parameter(0)
  ROOT %mul.5 = f32[4,3]{1,0} multiply(%param_0.1, %param_0.1), metadata={op_name="jit(jax_fn)/aten.mul.Tensor step.py:44/mul"}
}

ENTRY %main.10 (a: f32[4,8], b: f32[8,3], c: f32[4,3]) -> (f32[4], f32[4,3], f32[4,3]) {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,3]{1,0} parameter(1)
  %c = f32[4,3]{1,0} parameter(2)
  %ynn_fusion.7 = f32[4]{0} fusion(%a, %b), kind=kCustom, calls=%fused_computation.7, metadata={op_name="jit(jax_fn)/aten._log_softmax.default step.py:40/reduce_max"}
  %multiply_fusion.9 = f32[4,3]{1,0} fusion(%c), kind=kLoop, calls=%fused_computation.9, metadata={op_name="jit(jax_fn)/aten.mul.Tensor step.py:44/mul"}
  %copy.4 = f32[4,3]{1,0} copy(%c)
  ROOT %tuple = (f32[4], f32[4,3], f32[4,3]) tuple(%ynn_fusion.7, %multiply_fusion.9, %copy.4)
}
'''


def test_a_fusion_holding_a_dot_is_charged_to_the_dot():
    names = hlo_op_names(HLO)
    assert "aten.mm.default" in names["ynn_fusion.7"]
    assert classify_instruction(names["ynn_fusion.7"], "step.py:44") == "matmul (linear layers)"


def test_a_product_xla_made_without_metadata_is_still_a_product():
    text = HLO.replace(', metadata={op_name="jit(jax_fn)/aten.mm.default model.py:12/dot_general"}', "")
    names = hlo_op_names(text)
    assert classify_instruction(names["ynn_fusion.7"], "step.py:44") == "matmul (linear layers)"


def test_the_optimizer_line_wins_and_xla_copies_are_layout():
    names = hlo_op_names(HLO)
    assert classify_instruction(names["multiply_fusion.9"], "step.py:44") == "optimizer update"
    assert classify_instruction(names["multiply_fusion.9"], "step.py:99") == family("mul")
    assert names["copy.4"] == ""
    assert classify_instruction(names["copy.4"], "step.py:44").startswith("layout")


def test_families_of_common_ops():
    assert family("addmm") == "matmul (linear layers)"
    assert family("bmm").startswith("attention")
    assert family("native_layer_norm_backward") == "normalisation"
    assert family("embedding_dense_backward").startswith("embedding")
    assert family("gelu").startswith("elementwise")
