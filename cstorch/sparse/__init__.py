"""`cerebras.pytorch.sparse`: weight sparsity as masks on parameters, gradients and
optimizer state, kept inside traced steps.

```python
sparsity = cstorch.sparse.configure({"sparsity": 0.5, "param_filter": "*.weight"})
# or cstorch.sparse.Static(sparsity=0.5), cstorch.sparse.GMP(...), SET(...), RigL(...)
model.apply(sparsity)       # after cstorch.compile(model)
optimizer.apply(sparsity)
```
"""
from cstorch.sparse import configure, init, utils
from cstorch.sparse.configure import map_sparsity_algorithm
from cstorch.sparse.base import SparseParameter, SparsityAlgorithm
from cstorch.sparse.dynamic import DynamicSparsityAlgorithm
from cstorch.sparse.gmp import GMP
from cstorch.sparse.group import Group
from cstorch.sparse.init import make_init_method
from cstorch.sparse.rigl import RigL
from cstorch.sparse.set import SET
from cstorch.sparse.static import Static
from cstorch.sparse.utils import (Constant, Cosine, Cycling, Exp, FreqSchedule,
                                  HyperParameterSchedule, Lambda, Linear, ListSchedule, Power,
                                  UpdateSchedule, make_hyperparameter_schedule,
                                  make_update_schedule)

__all__ = ["configure", "map_sparsity_algorithm", "init", "utils", "SparsityAlgorithm", "SparseParameter",
           "DynamicSparsityAlgorithm", "Static", "GMP", "SET", "RigL", "Group",
           "make_init_method", "HyperParameterSchedule", "Constant", "Linear", "Exp", "Power",
           "Cosine", "Cycling", "Lambda", "UpdateSchedule", "FreqSchedule", "ListSchedule",
           "make_hyperparameter_schedule", "make_update_schedule"]
