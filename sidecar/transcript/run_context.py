"""What a run feeds besides its transcript: its profile, its task and loaded skills, its
agent-state data, the usage reported for it, and the layout of its window.

The records are the context window's (``context_window.schema``), under the run's key; what
reads or changes the run record (the digests it names them by, the window an iteration fed) is
the transcript's, so the run contexts live here, above the context window.

Each write validates and redacts first, renders and counts outside the write lock, then writes
in one transaction; the run record names the profile and task records by digest, so a turn
finds their prepared form in the cache without reading them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sidecar.caching import Caches
from sidecar.context_window import schema, state
from sidecar.context_window.policy import Policy
from sidecar.context_window.profiles import (
    STATIC_PARTS,
    LoadedSkill,
    PreparedProfile,
    PreparedTask,
    Profile,
    ProfileCache,
    Task,
    check_profile,
    check_skill,
    check_task,
    digest,
    load_profile,
    load_task,
    profile_record,
    redacted_profile,
    redacted_task,
    stored_task,
    task_record,
)
from sidecar.context_window.sections import Layout, layout
from sidecar.context_window.state import Fed, StateSchemas, Usage
from sidecar.errors import Conflict, FieldViolation, NotFound, ValidationError
from sidecar.settings import ContextSettings
from sidecar.storage.environment import Store
from sidecar.storage.keys import Txn
from sidecar.text.counting import Counters
from sidecar.text.redaction import Redactor, refuse_secrets
from sidecar.transcript.runs import Run, require_run, save_run
from sidecar.transcript.schema import run_key, window_at

HOST_DEFINED = "host-defined"


@dataclass(slots=True)
class NewContext:
    profile_record: bytes | None = None
    task_record: bytes | None = None
    task: Task | None = None  # as given, redacted


@dataclass(frozen=True, slots=True)
class ProfileUpdate:
    prefix_sha256: str
    changed: tuple[str, ...]  # the prefix parts that differ from the profile before


class RunContexts:
    def __init__(self, store: Store, counters: Counters, defaults: ContextSettings, redactor: Redactor,
                 policy: Policy | None = None, schemas: StateSchemas | None = None,
                 caches: Caches | None = None) -> None:
        """``caches``: the server's (by default, caches of this object's own, on)."""
        self._store = store
        self._db = store.handles("runs", "run_context")
        self._counters = counters
        self._defaults = defaults
        self._redactor = redactor
        self.policy = policy or Policy()
        self.schemas = schemas or StateSchemas()
        self._cache = ProfileCache(caches or Caches())

    # -- what a turn reads ---------------------------------------------------------------------

    def layout(self, txn: Txn, key: bytes, run: Run, run_id: str) -> Layout:
        """The run's window layout (cached per profile, task and counter)."""
        cache_key = (key, f"{run.profile_digest}/{run.task_digest}/layout")
        return self._cache.get(cache_key, lambda: layout(
            self.policy, self.profile(txn, key, run), self.task_of(txn, key, run), run_id,
            self._defaults.model_window_tokens, self._defaults.turn_budget_tokens))

    def profile(self, txn: Txn, key: bytes, run: Run) -> PreparedProfile:
        return load_profile(txn, self._db, key, run.profile_digest, self._cache)

    # -- the profile and the task ---------------------------------------------------------------

    def _counter(self, run: Run, field: str) -> Callable[[str], int]:
        if run.settings.token_counter == HOST_DEFINED:
            raise ValidationError.field(field, "the run counts tokens in host-defined units, in which the sidecar "
                                        "cannot count its sections; open the run with a sidecar counter")
        return self._counters.get(run.settings.token_counter).count

    def prepare_new(self, tenant: str, run_id: str, run: Run, profile: Profile | None,
                    task: Task | None) -> NewContext:
        """What OpenRun gives a run: the profile and task records (None where not given)."""
        limit = self._defaults.max_event_bytes
        redact = self._redactor.redacting(tenant, run_id)
        new = NewContext()
        if profile is not None:
            check_profile(profile, limit)
            new.profile_record = profile_record(redacted_profile(profile, redact), self._counter(run, "profile"))
        if task is not None:
            check_task(task, limit)
            new.task = redacted_task(task, redact)
            new.task_record = task_record(new.task, (), self._counter(run, "task"))
        return new

    def confirm(self, txn: Txn, key: bytes, run: Run, run_id: str, new: NewContext) -> None:
        """An existing run is confirmed when the profile and task given are the run's (its loaded
        skills aside: they are not OpenRun's)."""
        differing = []
        if new.profile_record is not None and digest(new.profile_record) != run.profile_digest:
            differing.append("profile")
        if new.task is not None and stored_task(txn, self._db, key)[0] != new.task:
            differing.append("task")
        if differing:
            raise Conflict(f"run {run_id!r} already exists with a different {' and '.join(differing)}",
                           tuple(FieldViolation(name, "differs from the run's") for name in differing))

    def store_new(self, txn: Txn, key: bytes, run: Run, new: NewContext) -> None:
        """Give a run being created what :meth:`prepare_new` made."""
        if new.profile_record is not None:
            schema.put_profile(txn, self._db, key, new.profile_record)
            run.profile_digest = digest(new.profile_record)
        if new.task_record is not None:
            schema.put_task(txn, self._db, key, new.task_record)
            run.task_digest = digest(new.task_record)

    def update_profile(self, tenant: str, run_id: str, profile: Profile) -> ProfileUpdate:
        key = run_key(tenant, run_id)
        check_profile(profile, self._defaults.max_event_bytes)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
        record = profile_record(redacted_profile(profile, self._redactor.redacting(tenant, run_id)),
                                self._counter(run, "profile"))

        def write(txn: Txn) -> ProfileUpdate:
            run = require_run(txn, self._db, key, run_id)
            before = self.profile(txn, key, run)
            schema.put_profile(txn, self._db, key, record)
            run.profile_digest = digest(record)
            save_run(txn, self._db, key, run)
            after = self.profile(txn, key, run)
            return ProfileUpdate(after.prefix_sha256,
                                 tuple(p for p in STATIC_PARTS if before.parts[p] != after.parts[p]))

        return self._store.write(write)

    def update_task(self, tenant: str, run_id: str, task: Task) -> None:
        check_task(task, self._defaults.max_event_bytes)
        task = redacted_task(task, self._redactor.redacting(tenant, run_id))
        self._rewrite_task(tenant, run_id, "task", lambda _, skills: (task, skills))

    def load_skill(self, tenant: str, run_id: str, skill: LoadedSkill) -> bool:
        """Load (or replace) a skill; True when none of that name was loaded."""
        check_skill(skill, self._defaults.max_event_bytes)
        redact = self._redactor.redacting(tenant, run_id)
        refuse_secrets(redact, [("skill.name", skill.name)])
        skill = replace(skill, body=redact(skill.body))
        created: list[bool] = []

        def change(task: Task, skills: tuple[LoadedSkill, ...]) -> tuple[Task, tuple[LoadedSkill, ...]]:
            created[:] = [all(s.name != skill.name for s in skills)]
            return task, tuple(s for s in skills if s.name != skill.name) + (skill,)

        self._rewrite_task(tenant, run_id, "skill", change)
        return created[0]

    def unload_skill(self, tenant: str, run_id: str, name: str) -> None:
        def change(task: Task, skills: tuple[LoadedSkill, ...]) -> tuple[Task, tuple[LoadedSkill, ...]]:
            if all(s.name != name for s in skills):
                raise NotFound(f"no skill {name!r} is loaded in run {run_id!r}")
            return task, tuple(s for s in skills if s.name != name)

        self._rewrite_task(tenant, run_id, "name", change)

    def _rewrite_task(self, tenant: str, run_id: str, field: str,
                      change: Callable[[Task, tuple[LoadedSkill, ...]], tuple[Task, tuple[LoadedSkill, ...]]]) -> None:
        """Change the task record. Its sections are counted before the write lock is taken; the
        change is made again on what the transaction reads, and only a text counted differently
        from before (a concurrent change) is counted under the lock."""
        key = run_key(tenant, run_id)
        with self._store.read() as txn:
            run = require_run(txn, self._db, key, run_id)
            counted = _Memo(self._counter(run, field))
            task_record(*change(*stored_task(txn, self._db, key)), counted)

        def write(txn: Txn) -> None:
            run = require_run(txn, self._db, key, run_id)
            record = task_record(*change(*stored_task(txn, self._db, key)), counted)
            schema.put_task(txn, self._db, key, record)
            run.task_digest = digest(record)
            save_run(txn, self._db, key, run)

        self._store.write(write)

    # -- agent state ----------------------------------------------------------------------------

    def put_state_data(self, tenant: str, run_id: str, subset: str, json_text: str) -> None:
        key = run_key(tenant, run_id)
        state.check_subset(subset)
        refuse_secrets(self._redactor.redacting(tenant, run_id), [("subset", subset)])
        # Validated as redacted: the schema checks what is stored, and its messages echo no secret.
        value = state.parse_value(json_text, self._defaults.max_event_bytes,
                                        self._redactor.redacting(tenant, run_id))
        if value is not None:
            self.schemas.check(subset, value)

        def write(txn: Txn) -> None:
            require_run(txn, self._db, key, run_id)
            schema.put_state_subset(txn, self._db, key, subset, value)

        self._store.write(write)

    def state_data(self, txn: Txn, key: bytes) -> dict[str, Any]:
        return schema.read_state_data(txn, self._db, key)

    def task_of(self, txn: Txn, key: bytes, run: Run) -> PreparedTask:
        return load_task(txn, self._db, key, run.task_digest, self._cache)

    def record_usage(self, tenant: str, run_id: str, iteration: int, input_tokens: int, cached_tokens: int,
                     output_tokens: int, cache_read_input_tokens: int = 0,
                     cache_creation_input_tokens: int = 0) -> Usage:
        key = run_key(tenant, run_id)
        if iteration < 1:
            raise ValidationError.field("iteration", f"must be at least 1, got {iteration}")
        now_ms = int(time.time() * 1000)

        def write(txn: Txn) -> Usage:
            require_run(txn, self._db, key, run_id)
            window = window_at(txn, self._db, key, iteration)
            fed = None if window is None else Fed(window.fed_tokens, window.cache["report"][0] if window.cache else 0)
            return state.record_usage(txn, self._db, key, run_id, iteration, fed, input_tokens, cached_tokens,
                                      output_tokens, now_ms, cache_read_input_tokens, cache_creation_input_tokens)

        return self._store.write(write)

    def last_usage(self, txn: Txn, key: bytes) -> Usage | None:
        return state.last_usage(txn, self._db, key)

    def usage_of(self, txn: Txn, key: bytes, iteration: int) -> Usage | None:
        return state.usage_of(txn, self._db, key, iteration)


class _Memo:
    """A counter that remembers its counts, so a text counted before the lock is not counted again."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self._count = count
        self._known: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self._known:
            self._known[text] = self._count(text)
        return self._known[text]

