"""Events the sidecar emits for operators, per tenant: kept (``memory.compacted``) and delivered
live to watchers (``memory.compacted``, ``context.summarized``).

An event is appended inside the transaction that did what it reports, so it exists exactly
when that did; watchers hear of it only after the commit.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from sidecar.errors import TooManyWatches, WatchFellBehind
from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn
from sidecar.tenant_events.schema import EventDatabase
from sidecar.validation import page_within_bytes

MAX_WATCH_BACKLOG = 10_000  # a watcher that falls this far behind is dropped, not the sidecar


@dataclass(frozen=True, slots=True)
class Event:
    seq: int  # per tenant, increasing
    type: str
    payload: dict[str, Any]  # the event as its RFC defines it (it carries "type" too)

    def json(self) -> str:
        return json.dumps(self.payload, separators=(",", ":"))


def timestamp(ms: int) -> str:
    """RFC 0012's ts: ISO 8601, UTC, milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


class Watch:
    """One watcher's queue of events; closed when the watcher leaves, the sidecar stops, or the
    watcher falls too far behind."""

    def __init__(self, tenant: str, types: frozenset[str]) -> None:
        self.tenant, self.types = tenant, types
        self.queue: queue.Queue[Event | None] = queue.Queue(MAX_WATCH_BACKLOG)
        self.closed = False
        self.fell_behind = False

    def events(self, active: Callable[[], bool]) -> Iterator[Event]:
        """The events queued for this watcher, as they come, until it is closed (everything queued
        before that is still delivered) or ``active()`` turns false. A watcher that fell behind
        gets :class:`WatchFellBehind` after its backlog: the events it missed are in the log."""
        last_seq = 0
        while active():
            try:
                event = self.queue.get(timeout=1.0)  # wakes to re-check active(): the caller may be gone
            except queue.Empty:
                if self.closed:  # closed while the queue was full: no end marker fitted
                    break
                continue
            if event is None:
                break
            last_seq = event.seq
            yield event
        if self.fell_behind:
            raise WatchFellBehind(f"this watch fell {MAX_WATCH_BACKLOG} events behind and was closed; the "
                                  f"events after seq {last_seq} are in ListMemoryEvents (since_seq)",
                                  metadata={"last_seq": str(last_seq)})


class TenantEventLog:
    def __init__(self, store: Store, max_watches: int) -> None:
        self._store = store
        self._db = EventDatabase(store)
        self._lock = threading.Lock()
        self._watches: list[Watch] = []
        self._max_watches = max_watches

    def append(self, txn: Txn, tenant: str, payload: dict[str, Any]) -> Event:
        """Keep the event in the caller's write transaction; :meth:`publish` it after the commit."""
        event = Event(self._db.last_seq(txn, tenant) + 1, payload["type"], payload)
        self._db.put(txn, tenant, event.seq, event.json())
        return event

    def list(self, tenant: str, since: int = 0, memory_ref: str = "",
             limit: int = 1000) -> tuple[list[Event], bool]:
        """The tenant's kept events after seq ``since``, oldest first, of one memory ref if named:
        at most ``limit``, and no more than fit in a page's bytes; and whether more follow (the
        next page starts after the last seq of this one)."""
        def matching(txn: Txn) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
            for seq, record, payload in self._db.events_after(txn, tenant, since):
                if not memory_ref or payload.get("memoryRef") == memory_ref:
                    yield seq, record, payload

        with self._store.read() as txn:
            page, more = page_within_bytes(islice(matching(txn), limit + 1), lambda found: len(found[1]))
        if len(page) > limit:
            page, more = page[:limit], True
        return [Event(seq, payload["type"], payload) for seq, _, payload in page], more

    def watch(self, tenant: str, types: Iterable[str]) -> Watch:
        watch = Watch(tenant, frozenset(types))
        with self._lock:
            if len(self._watches) >= self._max_watches:
                raise TooManyWatches(f"{len(self._watches)} watches are open, as many as this sidecar serves at "
                                     f"once (half its [server] max_workers threads: each open watch holds one); "
                                     f"watch again once one closes, or page with ListMemoryEvents")
            self._watches.append(watch)
        return watch

    def live_watches(self) -> int:
        """How many watches are open now."""
        with self._lock:
            return len(self._watches)

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)
        watch.closed = True
        try:
            watch.queue.put_nowait(None)  # wakes a reader blocked on the queue
        except queue.Full:
            pass

    def close_watches(self) -> None:
        """End every watch (the sidecar is stopping): each stream returns after what it was sent."""
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            self.unwatch(watch)

    def publish(self, tenant: str, events: Iterable[Event]) -> None:
        """Deliver committed events to the tenant's watchers (and no one else's)."""
        with self._lock:
            watches = [w for w in self._watches if w.tenant == tenant]
        for event in events:
            for watch in watches:
                if watch.types and event.type not in watch.types:
                    continue
                try:
                    watch.queue.put_nowait(event)
                except queue.Full:
                    watch.fell_behind = True
                    self.unwatch(watch)
