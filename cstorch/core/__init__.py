"""`cerebras.pytorch.core`: annotations and scopes that shape the ops of a traced step."""
from cstorch.core import annotation
from cstorch.core.constant import make_constant
from cstorch.core.debug_name import add_debug_name, get_debug_name
from cstorch.core.scopes import current_name_scope, current_pol, name_scope, pol

__all__ = ["annotation", "make_constant", "add_debug_name", "get_debug_name", "name_scope",
           "current_name_scope", "pol", "current_pol"]
