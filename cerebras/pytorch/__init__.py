"""`import cerebras.pytorch as cstorch` gives this project's `cstorch`, submodules included.

Every `cerebras.pytorch.X` import resolves to the very module object `cstorch.X`, so
classes are shared: `cerebras.pytorch.optim.SGD is cstorch.optim.SGD`.
"""
import importlib
import importlib.abc
import importlib.util
import sys

import cstorch

_ALIAS, _TARGET = __name__, "cstorch"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        # The import system stamped the alias spec on the real module; give it its own back.
        module.__spec__ = importlib.util.find_spec(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_ALIAS + "."):
            return None
        real = _TARGET + fullname[len(_ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


sys.meta_path.insert(0, _AliasFinder())
for _name, _module in list(sys.modules.items()):
    if _name.startswith(_TARGET + "."):
        sys.modules.setdefault(_ALIAS + _name[len(_TARGET):], _module)
sys.modules[_ALIAS] = cstorch
