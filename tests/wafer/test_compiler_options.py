"""The XLA options a step is compiled with, per platform."""
import types

import numpy as np

from wafer.compile import compiler_options


def _mesh(platform):
    device = types.SimpleNamespace(platform=platform)
    return types.SimpleNamespace(devices=np.array([device], dtype=object))


def test_gpu_steps_skip_triton_matmul_autotuning(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiler_options(_mesh("gpu")) == {"xla_gpu_enable_triton_gemm": False,
                                              "xla_allow_excess_precision": False}


def test_cpu_steps_round_half_precision_where_the_program_says(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiler_options(_mesh("cpu")) == {"xla_allow_excess_precision": False}


def test_a_users_own_xla_flag_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    assert compiler_options(_mesh("gpu")) == {"xla_allow_excess_precision": False}
    monkeypatch.setenv("XLA_FLAGS", "--xla_allow_excess_precision=true")
    assert compiler_options(_mesh("cpu")) == {}
