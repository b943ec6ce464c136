"""Model Zoo's GPT-2 in eval mode with `compute_eval_metrics`: its own forward pass updates
its AccuracyMetric and PerplexityMetric inside each `@cstorch.trace` eval step; read after
the loop (as Model Zoo's ModelEvalMetrics callback reads them), they equal accuracy and
perplexity computed eagerly in plain torch."""
import copy
import math

import numpy as np
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.metrics import AccuracyMetric, PerplexityMetric
from cerebras.pytorch.metrics.metric import Metric
from tests.modelzoo.common import VOCAB, build, loader, token_batches

STEPS = 3
RTOL = 1e-5


def eager_reference(model, batches):
    """Per-batch losses, token accuracy and perplexity of the uncompiled model, in plain
    torch from its logits: accuracy = sum(mask * (argmax == label)) / sum(mask);
    perplexity = exp(sum(mask * cross-entropy) / sum(mask)), over all batches."""
    correct = weight = total_loss = 0.0
    losses = []
    with torch.no_grad():
        for batch in batches:
            logits = model.model(input_ids=batch["input_ids"],
                                 attention_mask=batch["attention_mask"]).double()
            labels = batch["labels"].long()
            mask = batch["attention_mask"].double()
            token_loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
            batch_loss = float(token_loss @ mask.reshape(-1))
            correct += float(((logits.argmax(-1) == labels).double() * mask).sum())
            weight += float(mask.sum())
            total_loss += batch_loss
            losses.append(batch_loss / float(mask.sum()))
    return losses, correct / weight, math.exp(total_loss / weight)


def predictable_labels(model, batches, seed=4):
    """Half the labels replaced by the model's own argmax predictions (its logits depend
    on the input ids alone), so that accuracy is far from both 0 and 1 for a random model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for batch in batches:
            logits = model.model(input_ids=batch["input_ids"],
                                 attention_mask=batch["attention_mask"])
            take = torch.rand(batch["labels"].shape, generator=g) < 0.5
            batch["labels"] = torch.where(take, logits.argmax(-1).int(), batch["labels"])
    return batches


def read_metrics(model):
    """What Model Zoo's ModelEvalMetrics callback does at the end of a validation loop."""
    values = {}
    for metric in model.modules():
        if isinstance(metric, Metric) and metric.num_updates > 0:
            values[metric.name] = (float(metric), metric.num_updates)
            metric.reset()
    return values


def test_traced_eval_loop_metrics_equal_eager_torch():
    model = build("gpt2", seed=2, compute_eval_metrics=True)
    assert isinstance(model.accuracy_metric, AccuracyMetric)
    assert isinstance(model.perplexity_metric, PerplexityMetric)
    reference = copy.deepcopy(model)
    reference.eval()
    # padded: the loss mask leaves tokens out, as DummyDataProcessor's does
    batches = predictable_labels(reference, token_batches(STEPS, seed=3, padded=True))

    cstorch.backend("CPU")
    compiled = cstorch.compile(model, cstorch.backend())
    model.eval()

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch):
        return compiled(batch)

    executor = cstorch.utils.data.DataExecutor(loader(batches), num_steps=STEPS)
    losses = [eval_step(batch) for batch in executor]
    losses = [float(loss) for loss in losses]
    values = read_metrics(model)
    assert eval_step.captures == 1

    ref_losses, accuracy, perplexity = eager_reference(reference, batches)
    assert sorted(values) == ["eval/accuracy", "eval/lm_perplexity"]
    assert values["eval/accuracy"][1] == values["eval/lm_perplexity"][1] == STEPS
    assert 0.3 < accuracy < 0.7  # some argmax predictions right and some wrong
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    np.testing.assert_allclose(values["eval/accuracy"][0], accuracy, rtol=RTOL)
    np.testing.assert_allclose(values["eval/lm_perplexity"][0], perplexity, rtol=RTOL)
    print(f"accuracy {values['eval/accuracy'][0]} vs {accuracy} "
          f"(rel {abs(values['eval/accuracy'][0] / accuracy - 1):.2e}); "
          f"perplexity {values['eval/lm_perplexity'][0]} vs {perplexity} "
          f"(rel {abs(values['eval/lm_perplexity'][0] / perplexity - 1):.2e}); "
          f"losses max rel {max(abs(a / b - 1) for a, b in zip(losses, ref_losses)):.2e}")
    # read and reset: the accumulators start again from nothing
    assert model.accuracy_metric.num_updates == 0
    assert math.isnan(float(model.accuracy_metric))
