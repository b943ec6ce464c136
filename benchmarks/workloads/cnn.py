"""cnn: a small ResNet on 32x32x3 images (batch 32, 10 classes, SGD momentum 0.9): a 3x3
stem to 16 channels, three basic blocks (16, 32 and 64 channels, the last two with stride 2
and a 1x1 projection shortcut), BatchNorm after every convolution, global average pooling
and a linear head. BatchNorm trains on batch statistics and updates its running ones."""
import jax
import jax.numpy as jnp
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workloads import _jax

BATCH, CLASSES = 32, 10
TITLE = f"ResNet-style CNN (3 basic blocks, BatchNorm), 32x32x3, batch {BATCH}, SGD momentum 0.9"
SIZES = {"full": (30, 7), "quick": (2, 2)}
OPTIMIZER = ("SGD", {"lr": 0.05, "momentum": 0.9})
BLOCKS = ((16, 16, 1), (16, 32, 2), (32, 64, 2))   # (in, out, stride)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.blocks = nn.Sequential(*[BasicBlock(*b) for b in BLOCKS])
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def make_model():
    torch.manual_seed(0)
    return SmallResNet()


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 3, 32, 32, generator=g),
             torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(n)]


def loss(model, x, y):
    return F.cross_entropy(model(x), y)


jax_init = _jax.params_of


def conv(p, name, x, stride, pad):
    return jax.lax.conv_general_dilated(x, p[f"{name}.weight"], (stride, stride),
                                        ((pad, pad), (pad, pad)),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def batch_norm(p, bufs, new, name, x, momentum=0.1, eps=1e-5):
    """Training-mode BatchNorm2d: normalise by the batch's statistics; the running mean and
    (unbiased) variance move towards them, `num_batches_tracked` counts the batch."""
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean((0, 2, 3))
    var = jnp.square(x - mean[:, None, None]).mean((0, 2, 3))
    new[f"{name}.running_mean"] = (1 - momentum) * bufs[f"{name}.running_mean"] + momentum * mean
    new[f"{name}.running_var"] = ((1 - momentum) * bufs[f"{name}.running_var"]
                                  + momentum * var * n / (n - 1))
    new[f"{name}.num_batches_tracked"] = bufs[f"{name}.num_batches_tracked"] + 1
    y = (x - mean[:, None, None]) * jax.lax.rsqrt(var + eps)[:, None, None]
    return y * p[f"{name}.weight"][:, None, None] + p[f"{name}.bias"][:, None, None]


def jax_loss(params, buffers, x, y):
    p, new = params, {}
    bn = lambda name, h: batch_norm(p, buffers, new, name, h)  # noqa: E731
    h = jax.nn.relu(bn("stem.1", conv(p, "stem.0", x, 1, 1)))
    for i, (cin, cout, stride) in enumerate(BLOCKS):
        b = f"blocks.{i}"
        z = jax.nn.relu(bn(f"{b}.bn1", conv(p, f"{b}.conv1", h, stride, 1)))
        z = bn(f"{b}.bn2", conv(p, f"{b}.conv2", z, 1, 1))
        if stride != 1 or cin != cout:
            h = bn(f"{b}.shortcut.1", conv(p, f"{b}.shortcut.0", h, stride, 0))
        h = jax.nn.relu(z + h)
    logits = _jax.linear(p, "fc", h.mean((2, 3)))
    return _jax.cross_entropy(logits, y), new
