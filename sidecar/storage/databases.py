"""The database registry: every named LMDB database, grouped by the area that owns it.

An area's schema module (``sidecar/<area>/schema.py``) owns the keys and records inside its
databases; this registry only says which databases exist and whose they are, so that a delete,
fork or sweep of one area can be confined to its own databases, and a store of another layout
is refused at start (``environment.Store``).
"""

from __future__ import annotations

# Which area owns which databases. A delete, fork or sweep of one area touches only its own
# databases: a run and a memory ref of the same name have keys of the same shape (tenant NUL name
# NUL), so only the database tells them apart. Every database is declared here, in one area.
AREAS: dict[str, tuple[bytes, ...]] = {
    # A run's log and what is derived from it, all under the run's key.
    "runs": (b"runs", b"events", b"event_ids", b"call_ids", b"iterations", b"counts", b"id_chunks", b"windows",
             b"log_entries", b"summaries", b"artifacts", b"replay", b"compaction_records",
             b"fed_forms"),
    # What a run feeds besides its log (profile, task, agent-state data, usage), under the run's key:
    # deleted and forked with its run.
    "run_context": (b"profiles", b"tasks", b"state_data", b"usage"),
    # Agent memory, under each memory ref's key.
    "memory": (b"mem_entries", b"mem_docs", b"mem_df", b"mem_postings", b"mem_vectors", b"mem_meta", b"mem_expiry",
               b"mem_compactions"),
    # The tenant's kept events (memory.compacted), under the tenant's key.
    "tenant_events": (b"tenant_events",),
}
DATABASES = tuple(name for names in AREAS.values() for name in names)

# How a shared store (``storage.shared``) finds the unit a record belongs to: each area's keys start
# with the tenant and this many more names, each followed by NUL, and that prefix is the unit; the
# kind says what the unit is. A run and its context are one unit: they are written, forked and
# deleted together. Every unit carries one version, the optimistic lock of a shared store.
UNIT_SHAPES: dict[str, tuple[str, int]] = {
    "runs": ("run", 1),
    "run_context": ("run", 1),
    "memory": ("memory ref", 1),
    "tenant_events": ("tenant", 0),
}

# The storage layer's own bookkeeping, which belongs to no area: with a shared store, the version
# of each unit this store holds, and which shared store it holds them from.
STORAGE_DATABASES: tuple[bytes, ...] = (b"shared_versions",)

# Areas whose records live under another area's keys and share its lifecycle, as (tied, owner):
# the owner's code holds the tied area's handles to sweep and copy them with a run (DeleteRun,
# ForkRun), and the tied area's code holds the owner's to read and save the run record through the
# owner's functions. Handles pass between them opaque: each database is still named only in its
# own area's modules.
TIED_AREAS: tuple[tuple[str, str], ...] = (("run_context", "runs"),)
