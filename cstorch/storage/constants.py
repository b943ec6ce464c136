"""`cerebras.pytorch.storage.constants`: names of a checkpoint file's global attributes."""

__CSTORCH_VERSION__ = "__cstorch_version__"
"""The root attribute holding the version of the package that wrote the checkpoint."""

__FORMAT_VERSION__ = "__version__"
"""The root attribute holding the checkpoint format's version (0.5)."""

__SPEC__ = "__spec__"
"""The root attribute holding the saved object's structure."""

__SUCCESS__ = "__SUCCESS__"
"""The root attribute a complete save sets to True last."""
