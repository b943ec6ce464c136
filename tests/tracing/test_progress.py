"""A traced step's first call names what it is doing on a terminal (tracing, then lowering
and compiling) and clears the line when done; piped, it shows nothing. A notice given
meanwhile gets a line of its own."""
import io
import sys

import torch

import cerebras.pytorch as cstorch
from cstorch.notices import inform
from cstorch.tracing import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _called_twice(monkeypatch, stream):
    """What the first and the second call of a traced step wrote to `stream` as stderr."""
    monkeypatch.setattr(sys, "stderr", stream)
    backend = cstorch.backend("CPU")
    model = cstorch.compile(torch.nn.Linear(4, 2), backend)

    @cstorch.trace
    def train_step(x):
        return model(x).sum()

    x = torch.randn(3, 4)
    before = len(stream.getvalue())
    float(train_step(x))
    first = stream.getvalue()[before:]
    float(train_step(x))
    return first, stream.getvalue()[before + len(first):]


def test_the_first_call_names_its_phases_on_a_terminal(monkeypatch):
    first, second = _called_twice(monkeypatch, _Terminal())
    tracing = first.index("train_step: tracing")
    assert first.index("train_step: lowering and compiling") > tracing
    assert second == ""   # the program is compiled: nothing to show


def test_a_piped_run_shows_nothing(monkeypatch):
    first, second = _called_twice(monkeypatch, io.StringIO())
    assert "train_step" not in first + second


def test_a_notice_during_a_capture_gets_a_line_of_its_own(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.shown("train_step"):
        progress.phase("tracing")
        inform("a notice")
    out = terminal.getvalue()
    at = out.index("cstorch: a notice\n")
    assert out[:at].endswith("\r")   # the phase's line was cleared first
    assert "\rtrain_step: tracing" in out[at:]   # and drawn again below the notice
