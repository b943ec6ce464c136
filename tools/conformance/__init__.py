"""Conformance of the bridge lowerings with eager PyTorch, over PyTorch's own OpInfo suite.

It imports `torch.testing._internal`, so it lives here rather than in the shipped `bridge`
package. ``python -m tools.conformance`` runs it (writes docs/op-coverage.md); see
`samples` for what one sample checks, `exclusions` for what is left out and why.
"""
from tools.conformance.entries import DTYPES, MODES, EntryResult, op_entries, run_entry
from tools.conformance.exclusions import excluded_reason
from tools.conformance.samples import entry_name, run_backward, run_forward

__all__ = ["DTYPES", "MODES", "EntryResult", "op_entries", "run_entry", "excluded_reason",
           "entry_name", "run_backward", "run_forward"]
