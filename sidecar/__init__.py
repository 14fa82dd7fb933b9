"""context-sidecar: counts tokens and assembles each agent turn's context under a budget.

Layers import one way: ``wire`` (gRPC: server, servicer, conversions, status) uses the areas
(``transcript``, ``context_window``, ``memory``, ``tenant_events``), which use ``storage``
(LMDB), ``text`` (counting, redaction, fencing) and ``fastcore`` (Cython). ``errors``,
``settings`` and ``validation`` are shared by every layer; plugins import ``plugin_api`` only.
"""

__version__ = "0.1.0"
