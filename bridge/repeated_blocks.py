"""Find runs of structurally identical modules applied one after another (the decoder
layers of an `nn.ModuleList` or `nn.Sequential`), and mark what each one does in a capture.

While `marked` is active, every op a run's module makes during its call carries
`BLOCK = (run, layer)` in its node's `custom` meta, and the ops computing its gradients
carry the same through `BACKWARD_ANNOTATIONS`; `bridge.scan_blocks` then lowers the marked
layers as one loop. Modules that differ (a shape, a flag, a hook on one of them) are not
a run: the reason is logged at INFO.
"""
import contextlib
import logging

import torch.fx.traceback as fx_traceback
import torch.nn as nn
from torch.nn.modules.module import (register_module_forward_hook,
                                     register_module_forward_pre_hook)

from bridge.capture import BACKWARD_ANNOTATIONS
from bridge.node_marks import BLOCK, IN_BACKWARD

log = logging.getLogger("bridge.scan")


_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                "_backward_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")
_PLAIN = (bool, int, float, str, type(None))


def _signature(module: nn.Module, attributes: bool) -> list:
    """What a module's calls can depend on, besides its tensors' values, as a list of
    (what, value) items: the same list for two modules means they compute alike. Without
    `attributes`, plain attributes (flags, sizes, an index) are left out."""
    items = []
    for name, m in module.named_modules(remove_duplicate=False):
        where = name or "the layer"
        items.append((f"{where}: its class", type(m)))
        items.append((f"{where}: train/eval mode", m.training))
        for table in _HOOK_TABLES:
            items.append((f"{where}: {table.strip('_').replace('_', ' ')}",
                          len(getattr(m, table, None) or {})))
        for key, value in sorted(vars(m).items()) if attributes else ():
            if not key.startswith("_") and isinstance(value, _PLAIN + (tuple,)):
                items.append((f"{where}: attribute {key!r}", value))
        for key, t in list(m._parameters.items()) + list(m._buffers.items()):
            if t is None:
                items.append((f"{where}: {key!r}", None))
                continue
            hooks = len(getattr(t, "_backward_hooks", None) or {}) + \
                len(getattr(t, "_post_accumulate_grad_hooks", None) or {})
            items.append((f"{where}: {key!r}", (tuple(t.shape), t.dtype,
                                                 bool(t.requires_grad), hooks)))
    return items


def _difference(a: list, b: list) -> str:
    for (what, x), (_, y) in zip(a, b):
        if x != y:
            return f"{what} differs ({x!r} against {y!r})"
    return "its submodules differ"


class Run:
    """Consecutive identical modules of one container: `modules[k]` is layer k."""

    def __init__(self, name: str, first: int, modules: list):
        self.name, self.first, self.modules = name, first, modules

    def layer_name(self, k: int) -> str:
        return f"{self.name}.{self.first + k}"

    @property
    def label(self) -> str:
        return f"{self.name}[{self.first}:{self.first + len(self.modules)}]"

    def __repr__(self):
        return f"Run({self.label})"


def find_runs(named_modules, attributes: bool = True) -> list:
    """The runs of at least two identical consecutive modules in the containers
    (`nn.ModuleList`, `nn.Sequential`) among `named_modules` ((name, module) pairs),
    outermost first; a container inside a run's module is left to that run. Where
    neighbours differ, why is logged at INFO. Without `attributes`, modules that differ
    only in plain attributes are a run too: right for `bridge.traced_once`, which checks
    every torch call a later layer makes against the first layer's, so that an attribute
    that changes a call is found there."""
    runs, inside = [], set()
    for name, container in named_modules:
        if id(container) in inside or not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.children())
        if len(children) < 2 or len({id(c) for c in children}) < len(children):
            continue
        signatures = [_signature(c, attributes) for c in children]
        start = 0
        for k in range(1, len(children) + 1):
            if k < len(children) and signatures[k] == signatures[start]:
                continue
            if k < len(children) and type(children[k]) is type(children[start]):
                log.info("%s.%d is not looped over with %s.%d: %s; it is compiled on its own",
                         name, k, name, start, _difference(signatures[k], signatures[start]))
            if k - start >= 2:
                run = Run(name, start, children[start:k])
                runs.append(run)
                for module in run.modules:
                    inside.update(id(m) for m in module.modules())
            start = k
    return runs


@contextlib.contextmanager
def marked(runs: list):
    """While active, the ops each run's layer makes (and later the ops computing their
    gradients) carry `BLOCK` in their node's custom meta. A layer called inside another
    marked layer's call keeps the outer mark."""
    layer_of = {id(m): (run.label, k) for run in runs for k, m in enumerate(run.modules)}
    open_marks: list = []   # (module, its annotate context)

    def pre(module, args):
        where = layer_of.get(id(module))
        if where is None or open_marks:
            return
        custom = fx_traceback.get_current_meta().get("custom") or {}
        backward = {**(custom.get(BACKWARD_ANNOTATIONS) or {}), BLOCK: where}
        mark = fx_traceback.annotate({BLOCK: where, BACKWARD_ANNOTATIONS: backward})
        mark.__enter__()
        open_marks.append((module, mark))

    def post(module, args, output):
        if open_marks and open_marks[-1][0] is module:
            open_marks.pop()[1].__exit__(None, None, None)

    if not layer_of:
        yield
        return
    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        while open_marks:
            _close(open_marks.pop()[1])


def _close(mark):
    """Close a mark left open by an error raised inside its layer. By then the capture
    has put the node meta it annotated back as it was, so the mark may find its key gone."""
    try:
        mark.__exit__(None, None, None)
    except KeyError:
        pass


def unmark(gm):
    """Take the `BLOCK` marks off `gm`'s nodes (layers that are not to loop)."""
    for node in gm.graph.nodes:
        custom = node.meta.get("custom")
        if custom and BLOCK in custom:
            node.meta["custom"] = {k: v for k, v in custom.items() if k != BLOCK}


def block_of(node) -> tuple | None:
    return (node.meta.get("custom") or {}).get(BLOCK)


def is_backward(node) -> bool:
    return bool((node.meta.get("custom") or {}).get(IN_BACKWARD))

