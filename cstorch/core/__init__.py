"""`cerebras.pytorch.core`: annotations and scopes that shape the ops of a traced step."""
from cstorch.core import annotation
from cstorch.core.constant import make_constant
from cstorch.core.scopes import current_name_scope, current_pol, pol
# After the submodule `name_scope` is imported, the package's `name_scope` is rebound to
# the function (`cstorch.core.name_scope(...)`); the module stays importable by its name.
from cstorch.core.name_scope import add_debug_name, get_debug_name, name_scope

__all__ = ["annotation", "make_constant", "add_debug_name", "get_debug_name", "name_scope",
           "current_name_scope", "pol", "current_pol"]
