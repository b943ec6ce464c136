"""nn.LSTM, nn.GRU and nn.RNN in traced steps, with PyTorch's default CPU settings (oneDNN
on): forward and backward equal eager PyTorch, training equals eager training, and
dropout between layers draws a fresh mask each step."""
import copy
import itertools

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bridge
import cerebras.pytorch as cstorch
from tests.models import rel_err

TOL = 1e-5
INPUT, HIDDEN, BATCH, SEQ = 5, 8, 3, 6
MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
_RNN_LAYER = torch.ops.bridge.rnn_layer.default


def _module(mode, **kwargs):
    if mode == "lstm":
        return nn.LSTM(INPUT, HIDDEN, **kwargs)
    if mode == "gru":
        return nn.GRU(INPUT, HIDDEN, **kwargs)
    return nn.RNN(INPUT, HIDDEN, nonlinearity=mode.split("_")[1], **kwargs)


class _Case:
    """One recurrent module with its input and, optionally, its initial state."""

    def __init__(self, mode, initial_state=False, unbatched=False, **kwargs):
        self.mode = mode
        self.module = _module(mode, **kwargs)
        m = self.module
        self.name = f"{mode} {kwargs} initial_state={initial_state} unbatched={unbatched}"
        batch = () if unbatched else (BATCH,)
        self.x = torch.randn((BATCH, SEQ, INPUT) if m.batch_first and not unbatched
                             else (SEQ, *batch, INPUT))
        directions = 2 if m.bidirectional else 1
        h_size = m.proj_size or m.hidden_size
        self.state = []
        if initial_state:
            self.state.append(torch.randn(m.num_layers * directions, *batch, h_size))
            if mode == "lstm":
                self.state.append(torch.randn(m.num_layers * directions, *batch, m.hidden_size))
        self.names = [n for n, _ in m.named_parameters()]
        self.leaves = [self.x, *(p.detach() for p in m.parameters()), *self.state]

    def results(self, leaves):
        x, params, state = leaves[0], leaves[1:1 + len(self.names)], leaves[1 + len(self.names):]
        hx = None if not state else tuple(state) if self.mode == "lstm" else state[0]
        out, h = torch.func.functional_call(self.module, dict(zip(self.names, params)), (x, hx))
        return [out, *h] if isinstance(h, tuple) else [out, h]


def _step(cases):
    """f(*leaves, *weights): every case's results, then the gradients of one weighted sum
    of all results with respect to every leaf (inputs, parameters, initial states)."""
    n = sum(len(c.leaves) for c in cases)

    def f(*flat):
        leaves, weights, results, at = flat[:n], flat[n:], [], 0
        for c in cases:
            results += c.results(leaves[at:at + len(c.leaves)])
            at += len(c.leaves)
        loss = sum((r * w).sum() for r, w in zip(results, weights))
        return results + list(torch.autograd.grad(loss, leaves))
    return f, n


def _check_against_eager(cases):
    f, n = _step(cases)
    leaves = [t for c in cases for t in c.leaves]
    with torch.no_grad():
        results = [[r.shape for r in c.results(c.leaves)] for c in cases]
    weights = [torch.randn(s) for shapes in results for s in shapes]
    expected = f(*(t.clone().requires_grad_() for t in leaves), *weights)

    graph = bridge.capture(f, leaves + weights, [True] * n + [False] * len(weights))
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert not any("mkldnn" in t for t in targets), targets
    got = jax.jit(bridge.lower(graph))(*(bridge.tensor_to_jax(t) for t in leaves + weights))

    labels = [(c.name, what) for c, shapes in zip(cases, results)
              for what in ["output", "h_n", "c_n"][:len(shapes)]]
    labels += [(c.name, f"grad {what}") for c in cases
               for what in ["input", *c.names, "h0", "c0"][:len(c.leaves)]]
    assert len(got) == len(expected) == len(labels)
    for label, a, b in zip(labels, got, expected):
        assert a.shape == tuple(b.shape), label
        assert rel_err(np.asarray(a), b) < TOL, label
    return graph


# (num_layers, bidirectional, batch_first, initial state). Any two of the four take all
# four combinations of their values somewhere in COVERING (a strength-2 covering array);
# the slow test runs the rest of the full product.
FULL = [(layers, *flags) for layers in (1, 2) for flags in itertools.product([False, True], repeat=3)]
COVERING = [(1, False, False, False), (1, True, True, True), (2, False, True, True),
            (2, True, False, True), (2, True, True, False)]


def _check_variants(mode, variants):
    # The variants share one graph: one capture and one XLA compilation for all of them.
    torch.manual_seed(0)
    cases = [_Case(mode, initial_state=init, num_layers=layers, bidirectional=bidir,
                   batch_first=batch_first) for layers, bidir, batch_first, init in variants]
    graph = _check_against_eager(cases)
    # One scanned op per layer and direction: the graph does not grow with the sequence.
    layers = [n for n in graph.graph.nodes if n.target is _RNN_LAYER]
    assert len(layers) == sum(c.module.num_layers * (1 + c.module.bidirectional) for c in cases)


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_backward_match_eager_autograd(mode):
    _check_variants(mode, COVERING)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_every_other_variant_matches_eager_autograd(mode):
    _check_variants(mode, [v for v in FULL if v not in COVERING])


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_projection_no_bias_and_unbatched_input_match_eager_autograd():
    torch.manual_seed(1)
    cases = [
        _Case("lstm", initial_state=True, proj_size=3, num_layers=2, bidirectional=True),
        _Case("lstm", initial_state=False, proj_size=3, bias=False, batch_first=True),
        _Case("gru", initial_state=True, bias=False, bidirectional=True, unbatched=True),
        _Case("rnn_tanh", initial_state=False, bias=False, num_layers=2),
        _Case("lstm", initial_state=True, unbatched=True),
    ]
    _check_against_eager(cases)


class _Classifier(nn.Module):
    def __init__(self, vocab=20, classes=4, dropout=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.lstm = nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True,
                            dropout=dropout)
        self.head = nn.Linear(24, classes)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def _train_step(compiled, optimizer):
    @cstorch.trace
    def step(tokens, labels):
        loss = F.cross_entropy(compiled(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return step


def test_lstm_classifier_trains_like_eager_pytorch():
    torch.manual_seed(0)
    model = _Classifier()
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 20, (4, 7), generator=gen),
                torch.randint(0, 4, (4,), generator=gen)) for _ in range(5)]

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    step = _train_step(compiled, cstorch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for tokens, labels in batches:
        loss = step(tokens, labels)
        ref_loss = F.cross_entropy(reference(tokens), labels)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert rel_err(loss, ref_loss.detach()) < TOL
    assert step.captures == 1
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert rel_err(ours[name], theirs[name]) < TOL, name
    # The head reads the last step only, which the last layer's reverse direction computes
    # first, from h0 = 0: its W_hh gets no gradient. Every other tensor was trained.
    untrained = {k for k in theirs if torch.equal(theirs[k], initial[k])}
    assert untrained == {"lstm.weight_hh_l1_reverse"}


def test_dropout_between_layers_runs_trains_and_draws_a_new_mask_each_step():
    torch.manual_seed(0)
    model = _Classifier(dropout=0.5)
    before = copy.deepcopy(model.state_dict())
    gen = torch.Generator().manual_seed(4)
    tokens, labels = torch.randint(0, 20, (4, 7), generator=gen), torch.randint(0, 4, (4,), generator=gen)

    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    step = _train_step(compiled, cstorch.optim.SGD(model.parameters(), lr=0.1))

    @cstorch.trace
    @torch.no_grad()
    def forward(tokens):
        return compiled(tokens)

    model.train()
    losses = [float(step(tokens, labels)) for _ in range(5)]
    assert all(np.isfinite(losses))
    after = model.state_dict()
    assert {k for k in before if torch.equal(after[k], before[k])} == {"lstm.weight_hh_l1_reverse"}
    # Same weights, same input: only the dropout mask can tell the two calls apart.
    first, second = forward(tokens), forward(tokens)
    assert not torch.allclose(first, second)

    model.eval()
    reference = _Classifier(dropout=0.5)
    reference.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    reference.eval()
    out = forward(tokens)
    assert torch.equal(out, forward(tokens))
    assert rel_err(out, reference(tokens).detach()) < TOL
