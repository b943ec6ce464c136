"""Lazy initialisation: inside `with backend.device:` tensors are recipes, not data.

On a CSX backend with `cstorch.backends.csx.debug.lazy_initialization` (the default),
factory functions (`torch.empty`, `zeros`, `ones`, `full`, `arange`, `eye`, `rand`,
`randn`, the `_like` and `new_*` forms) called inside the device context return a
`LazyInitTensor`: a torch tensor with a shape and a dtype but no data, holding how its
value is made. In-place ops on it (`nn.init.*`, `uniform_`, `normal_`, `zero_`, `fill_`,
`copy_`, arithmetic, writes through views such as `weight[padding_idx].fill_(0)`) extend
that recipe instead of computing anything, and so do ops that make new tensors from lazy
ones inside the context. `cstorch.compile` builds each value directly on the devices with
its sharding (`LazyInitTensor.device_value`): the recipe runs as one small jitted JAX
program whose ops are the bridge's ATen lowerings, so no host copy is ever made.

Random values come from JAX's PRNG, not torch's CPU generator: each random op takes a
key from one 64-bit number drawn from torch's generator when the op is recorded (the
default generator, or the `generator=` passed to it), so values depend on
`torch.manual_seed` and on the order tensors are created, and a run is reproducible,
but they differ from eager PyTorch's. Torch's CPU stream is a Mersenne Twister consumed
sequentially by each kernel's own sampling code; reproducing it on the device would mean
copying those kernels, and the device wants counter-based keys. Large random tensors are
drawn in blocks of rows, so XLA's working memory stays small; the blocks depend on the
shape only, so the values do not depend on the mesh. Deterministic recipes (zeros, ones,
full, arange, eye, copies, arithmetic) give exactly what eager PyTorch gives.

Reading a lazy tensor before compile (printing, `.sum()` outside the context,
`torch.save`, `cstorch.save`) builds its value with the same program compile would run
and copies it to the host, without keeping it: the value read equals the value compile
places. An op that cannot be recorded (no lowering, data-dependent output) runs on the
host with real values; if it writes into a lazy tensor, that tensor's value is kept on
the host from then on and a warning names the op. Dtypes JAX holds differently (int64,
float64 without x64) and empty tensors are created eagerly on the host, so their values
stay exact and `torch.load` can `set_` into them.

CPU and GPU backends create tensors eagerly inside `backend.device`: their values are
eager PyTorch's, as the reference's CPU and GPU backends give. The context is for
building models: a loop run inside it would keep making recipes.
"""
from cstorch.lazy_init.recording import LazyInitTensor, LazyMode, is_lazy

__all__ = ["LazyInitTensor", "LazyMode", "is_lazy"]
