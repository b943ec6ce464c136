"""Metrics accumulated on the device inside traced eval steps: a Model Zoo style eval loop
over a small GPT, and what the run state does with metrics."""
import copy
import math

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cerebras.pytorch.metrics import AccuracyMetric, MeanMetric, PerplexityMetric
from cerebras.pytorch.metrics.metric import Metric
from tests.models import TinyGPT

VOCAB, SEQ, BATCH, STEPS = 61, 16, 4, 3


class GPT2LikeModel(nn.Module):
    """TinyGPT wrapped the way Model Zoo's `GPT2LMHeadModel` wraps its transformer: the
    metrics are submodules, and `forward` updates them as its `compute_eval_metrics` path
    does (token accuracy weighted by the attention mask; perplexity from the loss scaled
    back up by the number of tokens). Model Zoo's GPT-2 itself does not import yet: it
    needs `cerebras.pytorch` names (utils.kernel, ...) that other parts of issue 14 add."""

    def __init__(self):
        super().__init__()
        self.model = TinyGPT(vocab=VOCAB, dim=32, heads=2, layers=2, block=SEQ)
        self.compute_eval_metrics = True
        self.perplexity_metric = PerplexityMetric(name="eval/lm_perplexity")
        self.accuracy_metric = AccuracyMetric(name="eval/accuracy")

    def forward(self, data):
        lm_logits = self.model(data["input_ids"])
        loss = lm_loss(lm_logits, data["labels"], data["attention_mask"])
        if not self.model.training and self.compute_eval_metrics:
            lm_labels = data["labels"].clone()
            lm_weights = data["attention_mask"].to(lm_logits.dtype).clone()
            lm_preds = lm_logits.argmax(-1).int()
            self.accuracy_metric(labels=lm_labels, predictions=lm_preds, weights=lm_weights)
            unscaled_loss = loss * torch.sum(lm_weights, dtype=torch.float32)
            self.perplexity_metric(labels=lm_labels, loss=unscaled_loss, weights=lm_weights)
        return loss


def lm_loss(logits, labels, mask):
    """Model Zoo's GPT loss with num_tokens scaling: masked cross-entropy over the tokens."""
    loss = nn.CrossEntropyLoss(reduction="none")(logits.view(-1, VOCAB), labels.view(-1).long())
    mask = mask.to(logits.dtype)
    return torch.sum(loss * mask.view(-1)) / torch.sum(mask)


def batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
        mask = (torch.arange(SEQ) < lengths[:, None]).int()
        out.append({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:],
                    "attention_mask": mask})
    return out


def eager_reference(model, data):
    """Accuracy and perplexity of `model` over `data`, in plain torch."""
    correct = weight = total_loss = 0.0
    with torch.no_grad():
        for batch in data:
            logits = model(batch["input_ids"])
            mask = batch["attention_mask"].float()
            correct += float(((logits.argmax(-1) == batch["labels"]).float() * mask).sum())
            weight += float(mask.sum())
            total_loss += float(nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), reduction="none")
                @ mask.reshape(-1))
    return correct / weight, math.exp(total_loss / weight)


def read_metrics(model):
    """What Model Zoo's `ModelEvalMetrics` callback does after a validation loop."""
    values = {}
    for metric in model.modules():
        if isinstance(metric, Metric) and metric.num_updates > 0:
            values[metric.name] = (float(metric), metric.num_updates)
            metric.reset()
    return values


def test_traced_eval_loop_accumulates_gpt_metrics_equal_to_eager_torch():
    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    model = GPT2LikeModel()
    reference = copy.deepcopy(model.model)
    compiled = cstorch.compile(model, backend)
    model.eval()
    data = batches()

    def input_fn():
        return torch.utils.data.DataLoader(data, batch_size=None)

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch):
        return compiled(batch)

    accuracy, perplexity = eager_reference(reference, data)
    for _ in range(2):  # the second pass starts from the reset accumulators
        executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                                   num_steps=STEPS)
        for batch in executor:
            eval_step(batch)
        values = read_metrics(model)
        assert values["eval/accuracy"][1] == values["eval/lm_perplexity"][1] == STEPS
        assert values["eval/accuracy"][0] == pytest.approx(accuracy, rel=1e-6, abs=1e-7)
        assert values["eval/lm_perplexity"][0] == pytest.approx(perplexity, rel=1e-5)
    assert eval_step.captures == 1
    # Metrics are state of the model they belong to, but not part of its checkpoints.
    assert "model.accuracy_metric.total_correct" in backend.state.names
    assert not any("metric" in key for key in model.state_dict())


def test_one_program_accumulates_across_calls_and_eager_calls_add_to_it(capfd):
    backend = cstorch.backend("CPU")
    metric, reference = MeanMetric(name="eval/mean"), MeanMetric(name="reference")

    @cstorch.trace
    @torch.no_grad()
    def eval_step(value, weight):
        metric(value, weight)
        return metric.compute()

    g = torch.Generator().manual_seed(0)
    for i in range(4):
        value, weight = torch.randn(5, generator=g), torch.rand(5, generator=g)
        running = eval_step(value, weight)
        reference(value, weight)
        assert float(running) == pytest.approx(float(reference), rel=1e-6)
        if i == 1:  # an eager update between steps lands in the device state
            metric(torch.tensor([7.0]), 2.0)
            reference(torch.tensor([7.0]), 2.0)
    assert eval_step.captures == 1
    assert float(metric) == pytest.approx(float(reference), rel=1e-6)
    assert metric.num_updates == reference.num_updates == 5
    assert "metrics.eval_mean.total_value" in backend.state.names
    assert "not passed to cstorch.compile" not in capfd.readouterr().err


def test_metrics_with_one_name_keep_separate_state():
    backend = cstorch.backend("CPU")
    first, second = AccuracyMetric(name="acc"), AccuracyMetric(name="acc")

    @cstorch.trace
    @torch.no_grad()
    def eval_step(labels, predictions):
        first(labels=labels, predictions=predictions)
        second(labels=labels, predictions=1 - predictions)

    eval_step(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 1, 1]))
    assert float(first) == 0.75 and float(second) == 0.25
    assert {"metrics.acc.total_correct", "metrics.acc_1.total_correct"} <= set(backend.state.names)
