"""Memory compaction (RFC 0012, with RFC 0062's distillation): many entries distilled into one.

One compaction is one LMDB transaction: the distilled entry is put (through the same redaction
as any put: SR-1 carry-forward, whoever wrote the text), its sources are deleted, the search
index loses them and gains it, and the ``memory.compacted`` event is kept; so a crash leaves
the store before or after, never between. Everything costly (reading the sources, distilling,
redacting, counting) happens before that transaction, which then only checks that no source
changed meanwhile and writes.

Triggers: the background job (``host-managed``, every ``interval_seconds``, per memory ref with
more than ``min_entries`` entries) and ``CompactMemory`` (``client-requested``), with the host's
summary or the built-in distiller. A retried compaction of the same sources returns the first.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import logging
import re
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.errors import Aborted, SidecarError, TokenBudgetExceeded, ValidationError
from sidecar.memory.api import MAX_TAGS, Memories, Source, check_ref
from sidecar.memory.index import terms
from sidecar.memory.schema import CompactionRecord, MemoryDatabases
from sidecar.settings import MemoryCompactionSettings
from sidecar.storage.keys import Txn, scope
from sidecar.telemetry import logs, metrics
from sidecar.tenant_events.log import Event, TenantEventLog, timestamp
from sidecar.text.counting import TokenCounter
from sidecar.validation import check_at_least, check_id

log = logging.getLogger(__name__)
EVENT_TYPE = "memory.compacted"
MAX_LISTED_SOURCES = 100  # RFC 0012: sourceIds may be omitted above this; sourceCount always says
PROVENANCE = re.compile(r"^compacted-from:[^\s:][^\s]*$")
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s|\n")
_MAX_LINE_CHARS = 200
_CUT_MARKER = re.compile(r"\s*\[REDACTED:[^\]\s]*$")  # a marker that a cut would leave open


@dataclass(frozen=True, slots=True)
class Outcome:
    compaction_id: str
    output_id: str
    source_count: int
    event: Event
    created: bool  # False: this exact compaction was already done (a retry)


def distil(counter: TokenCounter, sources: Sequence[Source], token_budget: int, max_output_bytes: int) -> str:
    """The built-in distiller: deterministic and extractive, no model. Each source offers its
    first sentence; sentences are chosen by how much of the sources' common vocabulary they
    carry (Luhn's idea) until the budget is spent, and kept in the sources' order. The same
    sources and budget always give the same bytes."""
    header = f"Distilled from {len(sources)} memory entries (extractive):"
    lines: list[str] = []
    for source in sources:
        first = _FIRST_SENTENCE.split(source.content.strip(), maxsplit=1)[0]
        line = " ".join(first.split())
        if len(line) > _MAX_LINE_CHARS:  # a marker is kept whole or not at all
            line = _CUT_MARKER.sub("", line[:_MAX_LINE_CHARS])
        if line and line not in lines:
            lines.append(line)
    weights: Counter = Counter()
    for source in sources:
        weights.update(term for term in source.terms if len(term) >= 3)
    scores = []
    for line in lines:
        line_terms = set(terms(line))
        scores.append(sum(weights[t] for t in line_terms) / (1 + len(line_terms)) ** 0.5)
    used = counter.count(header)
    chosen: list[int] = []
    for index in sorted(range(len(lines)), key=lambda i: (-scores[i], i)):
        cost = counter.count("\n- " + lines[index])
        if used + cost <= token_budget:
            chosen.append(index)
            used += cost
    while chosen:
        text = header + "".join("\n- " + lines[i] for i in sorted(chosen))
        if counter.count(text) <= token_budget and len(text.encode("utf-8")) <= max_output_bytes:
            return text
        chosen.pop()  # the least valuable of those chosen
    raise TokenBudgetExceeded(
        f"{len(sources)} entries cannot be distilled within {token_budget} tokens and {max_output_bytes} "
        "bytes: not even one sentence fits beside the header")


class Compactor:
    def __init__(self, memories: Memories, events: TenantEventLog, settings: MemoryCompactionSettings) -> None:
        self._memories = memories
        self._db = MemoryDatabases(memories.store)
        self._events = events
        self._settings = settings
        self._counter = memories.counter

    def compact(self, tenant: str, memory_ref: str, source_ids: Sequence[str] = (), summary_text: str = "",
                token_budget: int | None = None, trigger: str = "client-requested") -> Outcome:
        settings = self._settings
        key = scope(tenant, check_ref(memory_ref))
        budget = check_at_least("token_budget", token_budget, 1) if token_budget is not None else settings.token_budget
        for i, source_id in enumerate(source_ids):
            check_id(f"source_ids[{i}]", source_id)
        if len(set(source_ids)) != len(source_ids):
            raise ValidationError.field("source_ids", "names an entry twice")
        if len(source_ids) > settings.max_input_entries:
            raise ValidationError.field("source_ids", f"{len(source_ids)} entries; one compaction takes at most "
                                        f"{settings.max_input_entries} ([memory.compaction] max_input_entries)")
        store = self._memories.store
        with store.read() as txn:
            ids = list(source_ids) or self._memories.oldest(txn, key, settings.keep_recent, settings.max_input_entries)
            recorded = self._recorded(txn, key, ids)
            if recorded is not None:
                return recorded
            if len(ids) < 2:
                raise ValidationError.field("source_ids", "a compaction takes at least two live entries" + (
                    "" if source_ids else f" beyond the newest {settings.keep_recent}"))
            sources = self._memories.read_sources(txn, key, ids)

        text = summary_text or distil(self._counter, [self._redacted(tenant, source) for source in sources], budget,
                                      settings.max_output_bytes)
        # The entry keeps the tags a put would accept now: a source's tag that holds a secret
        # registered after it was stored is dropped, never carried forward (nor redacted: a tag is
        # an identifier, and the sources, tag and all, are deleted below).
        offered = {tag for source in sources for tag in source.tags if not PROVENANCE.match(tag)}
        tags = sorted(tag for tag in offered if self._memories.redact(tenant, tag) == tag)
        if len(tags) < len(offered):
            log.info("compaction of %s in tenant %s drops %d source tag(s) holding a secret", memory_ref, tenant,
                     len(offered) - len(tags))
        digest = hashlib.sha256("\0".join([memory_ref, *sorted(ids), text]).encode("utf-8")).hexdigest()
        compaction_id = f"cmp_{digest[:16]}"
        # SR-1 carry-forward: the distilled text goes through the same redaction as a fresh put,
        # however clean its sources were; prepare() redacts before counting.
        output = self._memories.prepare(tenant, text, tags[:MAX_TAGS - 1] + [f"compacted-from:{compaction_id}"],
                                        entry_id=f"mem_{compaction_id}",
                                        content_field="summary_text" if summary_text else "content")
        if output.tokens > budget or len(output.content.encode("utf-8")) > settings.max_output_bytes:
            raise TokenBudgetExceeded(
                f"the distilled entry is {output.tokens} tokens and {len(output.content.encode('utf-8'))} bytes; "
                f"the budget is {budget} tokens and {settings.max_output_bytes} bytes")
        payload = {
            "type": EVENT_TYPE, "ts": timestamp(output.created_ms), "memoryRef": memory_ref,
            "outputId": output.entry_id, "sourceCount": len(sources), "trigger": trigger,
            "byteSize": len(output.content.encode("utf-8")),
            "distillation": {"tokenBudget": budget, "tokensUsed": output.tokens, "indexUpdated": True},
            "compactionId": compaction_id}
        if len(sources) <= MAX_LISTED_SOURCES:
            payload["sourceIds"] = [source.entry_id for source in sources]

        def write(txn: Txn) -> Outcome:
            recorded = self._recorded(txn, key, ids)
            if recorded is not None:  # the same compaction finished while we distilled
                return recorded
            for source in sources:
                if self._memories.ordinal_of(txn, key, source.entry_id) != source.ordinal:
                    raise Aborted(f"entry {source.entry_id!r} changed while it was being compacted; try again")
            self._memories.replace(txn, key, sources, output)
            event = self._events.append(txn, tenant, payload)
            self._db.put_compaction(txn, key, ids, CompactionRecord(compaction_id, output.entry_id, len(sources),
                                                                    event.seq, payload))
            return Outcome(compaction_id, output.entry_id, len(sources), event, True)

        outcome = store.write(write)
        if outcome.created:
            self._events.publish(tenant, [outcome.event])
            metrics.memory_compacted(trigger, outcome.source_count)
        return outcome

    def _redacted(self, tenant: str, source: Source) -> Source:
        """The source as a put would store it today, for the distiller: a source stored before a
        secret in it was registered is redacted before any cut, which could keep part of the
        secret that no later redaction recognises. (The stored source, and its terms, which the
        index must take out, stay as they are.)"""
        content = self._memories.redact(tenant, source.content)
        return source if content == source.content else dataclasses.replace(
            source, content=content, terms=Counter(terms(content)))

    def _recorded(self, txn: Txn, key: bytes, ids: Sequence[str]) -> Outcome | None:
        """The compaction of exactly these sources, if one was done."""
        if not ids:
            return None
        record = self._db.compaction(txn, key, ids)
        if record is None:
            return None
        return Outcome(record.compaction_id, record.output_id, record.source_count,
                       Event(record.seq, EVENT_TYPE, record.event), False)

    def run_round(self) -> list[Outcome]:
        """One round of the background job: every ref over ``min_entries``, oldest entries first."""
        outcomes = []
        for tenant, memory_ref in self._memories.refs_over(self._settings.min_entries):
            try:
                outcomes.append(self.compact(tenant, memory_ref, trigger="host-managed"))
            except SidecarError as error:  # this ref waits for the next round; the others go on
                # The error's code, not its message, and the ref only at DEBUG: a host may name refs freely.
                log.warning("compaction of a memory ref of tenant %s skipped: %s", tenant, error.code)
                log.debug("the memory ref skipped: %s", memory_ref)
        return outcomes


class BackgroundJob:
    """Runs :meth:`Compactor.run_round` every ``interval_seconds`` until stopped."""

    def __init__(self, compactor: Compactor, interval_seconds: float) -> None:
        self._compactor = compactor
        self._interval = interval_seconds
        self._stop = threading.Event()
        # The job runs in a copy of its maker's context: the metrics of the server that made it.
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), name="compaction",
                                        daemon=True)

    def start(self) -> None:
        # A round is up to seconds of CPU-bound Python in this thread; a call served meanwhile
        # waits for the GIL up to the switch interval (5 ms by default) each of the few times it
        # needs it. 0.2 ms keeps the job off the calls' p99 (benchmarks/bench_compaction.py: p99 x1.2-1.5
        # with it, x1.2-2.3 at 1 ms); a compaction of 1,000 entries took no measurably longer.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0002))
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            failed = False
            try:
                outcomes = self._compactor.run_round()
                if outcomes:
                    log.info("compaction round: %d ref(s) compacted", sum(o.created for o in outcomes))
            except Exception as error:  # the job must outlive one bad round
                failed = True
                log.error("compaction round failed", extra=logs.failure(error))
            metrics.job_ran("memory_compaction", failed)
