"""The tenant-events area's stored form (``AREAS["tenant_events"]``), and the only code that reads
or writes it.

``tenant_events``: tenant NUL seq (8 bytes, big-endian, from 1 up) -> the event's payload as
compact JSON, the very text a watcher receives (``log.Event.json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn, last_under, records_under, scope

_SEQ_BYTES = 8


class EventDatabase:
    """Typed reads and writes of the tenants' kept events."""

    def __init__(self, store: Store) -> None:
        self._events = store.handles("tenant_events")["tenant_events"]

    def last_seq(self, txn: Txn, tenant: str) -> int:
        """The tenant's last event's seq; 0 before its first."""
        last = last_under(txn, self._events, scope(tenant), _SEQ_BYTES)
        return int.from_bytes(last[0], "big") if last else 0

    def put(self, txn: Txn, tenant: str, seq: int, event_json: str) -> None:
        txn.put(scope(tenant) + seq.to_bytes(_SEQ_BYTES, "big"), event_json.encode("utf-8"), db=self._events)

    def events_after(self, txn: Txn, tenant: str, since: int) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        """(seq, stored record, payload) of the tenant's events after seq ``since``, oldest first."""
        for seq, record in records_under(txn, self._events, scope(tenant), (since + 1).to_bytes(_SEQ_BYTES, "big")):
            yield int.from_bytes(seq, "big"), record, json.loads(record)
