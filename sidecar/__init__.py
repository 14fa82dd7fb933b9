"""context-sidecar: counts tokens and assembles each agent turn's context under a budget.

Layers import one way: the wire (``servicer``, ``server``, ``status``, ``cli``) uses the domain
(``transcript`` over ``runs``, ``eventlog``, ``window``, ``summaries``, ``forks``; ``counting``,
``capabilities``, ...), which uses ``store`` (LMDB), ``records`` (byte layouts) and ``fastcore``
(Cython). Only the wire imports grpc or the API stubs; ``records`` uses the storage proto.
"""

__version__ = "0.1.0"
