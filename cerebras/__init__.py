"""The `cerebras` namespace: `cerebras.pytorch` is this project's `cstorch`."""
