"""The run core: what every part of `cstorch` may ask about the run in progress.

It sits at the bottom of the package: it imports nothing of `cstorch`, so that the state,
the backend, optimizers, metrics and data utilities can all ask whether a step is being
captured, or which backend and executor are current, without importing the parts of
`cstorch` that capture and run steps (which import them).
"""

