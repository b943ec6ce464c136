"""`Group`: different sparsity algorithms for different parameters."""
from torch.utils.hooks import RemovableHandle

from cstorch.sparse.base import SparsityAlgorithm
from cstorch.sparse.param_filter import make_param_filter


class Group(SparsityAlgorithm):
    """A composition of algorithms, each with the parameters its filter takes: a parameter
    goes to the first group whose filter (a glob of parameter names, a list of globs, or a
    callable ``(name, param) -> bool``) and whose algorithm's own ``param_filter`` take
    it.

    ``groups``: a dict ``{filter: algorithm}`` or a list of ``(filter, algorithm)`` pairs;
    `add` and `extend` add more. Applied like any algorithm (``model.apply(group)``,
    ``optimizer.apply(group)``); its `state_dict` holds one entry per group.
    """

    def __init__(self, groups=None):
        super().__init__(sparsity=None)
        self.sparsity_groups = []
        items = groups.items() if isinstance(groups, dict) else (groups or [])
        for item in items:
            try:
                param_filter, algorithm = item
            except (TypeError, ValueError):
                raise TypeError("Group takes a dict {filter: algorithm} or a list of (filter, "
                                f"algorithm) pairs, got {item!r}") from None
            self.add(param_filter, algorithm)

    def add(self, filter, algorithm: SparsityAlgorithm):  # noqa: A002  (the reference's name)
        """Give `algorithm` the parameters `filter` takes (a glob of parameter names, a
        list of globs or a callable ``(name, param) -> bool``) and no earlier group took."""
        if not isinstance(algorithm, SparsityAlgorithm):
            raise TypeError(f"a Group's algorithm must be a SparsityAlgorithm, got "
                            f"{type(algorithm).__name__}")
        self.sparsity_groups.append((make_param_filter(filter), algorithm))

    def extend(self, group: "Group"):
        """Append the groups of another `Group`."""
        if not isinstance(group, Group):
            raise TypeError(f"Group.extend takes a Group, got {type(group).__name__}")
        self.sparsity_groups.extend(group.sparsity_groups)

    @property
    def algorithms(self):
        return [algorithm for _, algorithm in self.sparsity_groups]

    def _choose(self, name, param):
        for param_filter, algorithm in self.sparsity_groups:
            if param_filter(name, param):
                chosen = algorithm._choose(name, param)
                if chosen is not None:
                    return chosen
        return None

    @property
    def sparse_params(self):
        merged = {}
        for algorithm in self.algorithms:
            merged.update(algorithm.sparse_params)
        return merged

    @sparse_params.setter
    def sparse_params(self, value):  # the base's constructor sets it; a Group derives it
        pass

    @property
    def sparsity(self):
        """The sparsity schedule of each sparse parameter, by full name (each group's
        algorithm has its own)."""
        return {name: sp.algorithm.sparsity for name, sp in self.sparse_params.items()}

    def sparsify_parameter(self, module, name, param):
        """Sparsify `param` (held by `module` as `name`) with the algorithm of the first
        group whose filter takes `name`; None when no group takes it."""
        algorithm = self._choose(name, param)
        if algorithm is None:
            return None
        return algorithm.sparsify_parameter(module, name, param)

    def visit_state(self, f):
        for algorithm in self.algorithms:
            algorithm.visit_state(f)

    def sparsify_optimizer(self, optimizer):
        for algorithm in self.algorithms:
            algorithm.sparsify_optimizer(optimizer)
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)

    @property
    def autoupdate(self):
        return all(a.autoupdate for a in self.algorithms)

    @autoupdate.setter
    def autoupdate(self, value):
        for algorithm in getattr(self, "sparsity_groups", ()):
            algorithm[1].autoupdate = value

    def update(self, optimizer=None):
        for algorithm in self.algorithms:
            algorithm.update(optimizer)

    def update_mask(self, p, mask, sparsity):
        raise TypeError("a Group updates masks through its algorithms")

    def prune_weights(self):
        for algorithm in self.algorithms:
            algorithm.prune_weights()

    def initialize(self):
        for algorithm in self.algorithms:
            algorithm.initialize()

    def register_target_sparsity_hook(self, hook):
        return _Handles([a.register_target_sparsity_hook(hook) for a in self.algorithms])

    def register_computed_sparsity_hook(self, hook):
        return _Handles([a.register_computed_sparsity_hook(hook) for a in self.algorithms])

    def state_dict(self):
        return {"groups": [algorithm.state_dict() for algorithm in self.algorithms]}

    def load_state_dict(self, state_dict):
        states = state_dict.get("groups") if isinstance(state_dict, dict) else None
        if not isinstance(states, list) or len(states) != len(self.sparsity_groups):
            raise ValueError(f"the Group has {len(self.sparsity_groups)} groups; its state_dict "
                             f"must have a 'groups' list of as many entries, got {state_dict!r}")
        for algorithm, state in zip(self.algorithms, states):
            algorithm.load_state_dict(state)

    def __repr__(self):
        inner = ", ".join(repr(a) for a in self.algorithms)
        return f"Group([{inner}])"


class _Handles(RemovableHandle):
    """One handle for the hooks a Group registered on each of its algorithms."""

    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()
