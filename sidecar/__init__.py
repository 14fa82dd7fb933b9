"""context-sidecar: counts tokens and assembles each agent turn's context under a budget.

Layers import one way: ``wire`` (gRPC: server, servicer, conversions, status) uses the areas
(``transcript``, ``context_window``, ``memory``, ``tenant_events``), which use ``storage``
(LMDB), ``text`` (counting, redaction, fencing) and ``fastcore`` (Cython). ``errors``,
``settings`` and ``validation`` are shared by every layer; plugins import ``plugin_api`` only.
"""

import importlib.metadata

DISTRIBUTION = "context-sidecar"


def __getattr__(name: str) -> str:
    # The installed distribution's version, read when asked for (not at every import of the
    # package): pyproject.toml is the only place it is written.
    if name == "__version__":
        return importlib.metadata.version(DISTRIBUTION)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
