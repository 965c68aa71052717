"""idrs-bench: a benchmark harness for input-dependent randomized smoothing."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("idrs_bench")

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
