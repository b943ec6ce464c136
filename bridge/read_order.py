"""Which of a graph's updated inputs are still read after their new value could be made.

XLA writes a donated input's new value into the input's own buffer. When some op reads
the input but is not an ancestor of its new value (a parameter that the backward pass
multiplies by while the optimizer, which needs only the parameter's gradient, updates
it), nothing orders that read before the write, and XLA copies the whole input first.
"""
import operator

import torch
import torch.fx as fx


def read_after_update(gm: fx.GraphModule, n: int) -> list[bool]:
    """For each of the first `n` inputs of `gm`, whose first `n` outputs are their new
    values: whether an op that reads the input is not an ancestor of its new value, or
    the old value is returned as well (an input returned unchanged, or read only on the
    way to its new value, is False)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"][:n]
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    new_values = output.args[0][:n]
    # Bit i of feeds[node]: `node` is, or is an ancestor of, input i's new value. One pass
    # from the output backwards, with ints as bit sets, instead of a search per input.
    feeds: dict[fx.Node, int] = {}
    for i, value in enumerate(new_values):
        if isinstance(value, fx.Node):
            feeds[value] = feeds.get(value, 0) | (1 << i)
    for node in reversed(gm.graph.nodes):
        bits = feeds.get(node, 0)
        for user in node.users:
            if user is not output and not _is_foreach(user):
                bits |= feeds.get(user, 0)
        feeds[node] = bits
        if _is_foreach(node):
            _feed_elements(node, feeds)
    returned = {}   # input -> the output positions that return its old value
    for k, value in enumerate(output.args[0]):
        if isinstance(value, fx.Node):
            returned.setdefault(value, []).append(k)
    late = []
    for i, (node, value) in enumerate(zip(placeholders, new_values)):
        if value is node:
            late.append(False)
            continue
        late.append(any(k != i for k in returned.get(node, ()))
                    or any(not feeds.get(reader, 0) >> i & 1
                           for reader in _readers(node, output)))
    return late


def untouched_inputs(gm: fx.GraphModule, n: int) -> list[bool]:
    """For each of the first `n` inputs of `gm`, whose first `n` outputs are their new
    values: whether the graph neither reads it nor changes it (it is only returned, as
    its own new value)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"][:n]
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    returned = output.args[0]
    counts: dict = {}
    for value in returned:
        if isinstance(value, fx.Node):
            counts[value] = counts.get(value, 0) + 1
    return [returned[i] is node and counts[node] == 1 and set(node.users) == {output}
            for i, node in enumerate(placeholders)]


def _is_foreach(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target._schema.name.startswith("aten::_foreach_")


def _feed_elements(node: fx.Node, feeds: dict):
    """A foreach op's k-th result is computed from the k-th tensor of each of its list
    arguments alone (XLA sees one computation per tensor): what result k feeds, element k
    feeds; a tensor argument outside the lists feeds every result's target."""
    per_index: dict = {}
    every = 0
    for user in node.users:
        if user.target is operator.getitem:
            per_index[user.args[1]] = per_index.get(user.args[1], 0) | feeds.get(user, 0)
        every |= feeds.get(user, 0)
    for arg in (*node.args, *node.kwargs.values()):
        if isinstance(arg, (list, tuple)):
            for k, element in enumerate(arg):
                if isinstance(element, fx.Node):
                    feeds[element] = feeds.get(element, 0) | per_index.get(k, 0)
        elif isinstance(arg, fx.Node):
            feeds[arg] = feeds.get(arg, 0) | every


def _readers(node: fx.Node, output: fx.Node):
    """The ops that read `node`'s data: its users, and through views of it (a transpose
    that XLA folds into a product, a reshape) theirs."""
    pending, seen = list(node.users), set()
    while pending:
        user = pending.pop()
        if user in seen or user is output:
            continue
        seen.add(user)
        if _is_view(user):
            pending.extend(user.users)
        else:
            yield user


def _is_view(node: fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    returns = node.target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None \
        and not returns[0].alias_info.is_write
