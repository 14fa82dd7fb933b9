"""The run inspector: a local, read-only web page over the store (``context-sidecar inspect``).

It sits beside the wire, over the same domain: the transcript area's reads (the ones ListRunEvents
and GetTranscriptWindow answer from) render as server-side HTML; nothing here writes.
"""
