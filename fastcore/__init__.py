"""Compiled hot paths of the sidecar (Cython). See ``_reference.py`` for readable twins.

Importing this package imports the compiled module or fails: there is no silent fallback to
Python, because the sidecar's latency figures are only true of the compiled code.
"""

try:
    from fastcore._fastcore import (NOT_A_UNIT, RECORD_SIZE, compaction_cut, count_code_points, select_window,
                                    splits_group)
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "fastcore's compiled extension is not built (fastcore/_fastcore*.so is missing). "
        "Install the package so it compiles: pip install -e . (needs gcc and the Python headers)."
    ) from exc

__all__ = ["NOT_A_UNIT", "RECORD_SIZE", "compaction_cut", "count_code_points", "select_window", "splits_group"]
