"""context-sidecar: counts tokens and assembles each agent turn's context under a budget.

Layers import one way: the wire (``servicer``, ``server``, ``status``, ``cli``) uses the domain
(``transcript``, ``counting``, ``capabilities``, ...), which uses ``store`` (LMDB) and
``fastcore`` (Cython). Only the wire imports grpc or the generated ``sidecar.pb`` stubs.
"""

__version__ = "0.1.0"
