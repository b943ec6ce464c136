"""`cerebras.appliance`: the parts of Cerebras' appliance client that programs written for
`cerebras.pytorch` (Model Zoo's trainer, callbacks and checkpoint tools) import.

Here there is no appliance: steps run on local JAX devices. Names with a meaning off a
Cerebras system behave for real (logging helpers, errors, units, file utilities, local
checkpoint storage over `cstorch`'s HDF5 code). Cluster plumbing exists so those programs
import and run, does nothing, and says so in its docstring.

`logger` is the package's logger; Model Zoo sets its level from the command line.
"""
import logging

logger = logging.getLogger("cerebras.appliance")

__all__ = ["logger"]
