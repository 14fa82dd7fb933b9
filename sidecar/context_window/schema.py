"""The run-context databases (``AREAS["run_context"]`` in ``sidecar.storage.databases``): their
keys and records, read and written here only.

Each record is under the run's key (``transcript.runs.run_key``: tenant NUL run_id NUL), so a
run's delete and fork take them along with its log:

- ``profiles``: run key -> the profile record, JSON: the profile's fields, its static sections as
  rendered with their counts, the tools' tokens (``profiles.profile_record``). The run record
  names it by digest, so a turn finds it prepared in the cache without reading it.
- ``tasks``: run key -> the task record, JSON: the task, the loaded skills, the per-task sections
  as rendered with their counts (``profiles.task_record``); named by digest like the profile.
- ``state_data``: run key + subset name -> the agent-state subset's value, JSON.
- ``usage``: run key + be32(iteration) -> the usage reported for that iteration, JSON (the fields
  of ``state.Usage``).

The functions take ``db``, the handles of the caller's databases by name, which must hold these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.storage.codec import dump_json, load_json
from sidecar.storage.keys import Db, Txn, be32, last_under, records_under

ITERATION_BYTES = 4  # a usage key's suffix: be32(iteration)


# -- profiles and tasks -------------------------------------------------------------------------

def read_profile(txn: Txn, db: Mapping[str, Db], key: bytes) -> bytes | None:
    return txn.get(key, db=db["profiles"])


def put_profile(txn: Txn, db: Mapping[str, Db], key: bytes, record: bytes) -> None:
    txn.put(key, record, db=db["profiles"])


def read_task(txn: Txn, db: Mapping[str, Db], key: bytes) -> bytes | None:
    return txn.get(key, db=db["tasks"])


def put_task(txn: Txn, db: Mapping[str, Db], key: bytes, record: bytes) -> None:
    txn.put(key, record, db=db["tasks"])


def task_id(txn: Txn, db: Mapping[str, Db], key: bytes) -> str:
    """The id of the run's task, "" when it has none (or no task record)."""
    record = read_task(txn, db, key)
    return load_json(record)["task"][0] if record else ""


# -- agent-state data ---------------------------------------------------------------------------

def put_state_subset(txn: Txn, db: Mapping[str, Db], key: bytes, subset: str, value: Any) -> None:
    """Set a subset (None removes it)."""
    subset_key = key + subset.encode("utf-8")
    if value is None:
        txn.delete(subset_key, db=db["state_data"])
    else:
        txn.put(subset_key, json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
                db=db["state_data"])


def read_state_data(txn: Txn, db: Mapping[str, Db], key: bytes) -> dict[str, Any]:
    """Every subset of the run's data, by name."""
    return {subset.decode("utf-8"): json.loads(value) for subset, value in records_under(txn, db["state_data"], key)}


# -- usage --------------------------------------------------------------------------------------

def put_usage(txn: Txn, db: Mapping[str, Db], key: bytes, iteration: int, fields: dict[str, Any]) -> None:
    txn.put(key + be32(iteration), dump_json(fields), db=db["usage"])


def read_last_usage(txn: Txn, db: Mapping[str, Db], key: bytes) -> dict[str, Any] | None:
    """The fields of the usage of the newest iteration that has one."""
    found = last_under(txn, db["usage"], key, ITERATION_BYTES)
    return load_json(found[1]) if found else None


def read_usage(txn: Txn, db: Mapping[str, Db], key: bytes, iteration: int) -> dict[str, Any] | None:
    """The fields of the usage recorded for ``iteration``; None when there is none."""
    found = txn.get(key + be32(iteration), db=db["usage"])
    return load_json(found) if found is not None else None


# -- a fork -------------------------------------------------------------------------------------

def copy_to_fork(txn: Txn, db: Mapping[str, Db], source_key: bytes, fork_key: bytes,
                 carried_iteration: Callable[[bytes, bytes], bool]) -> None:
    """Give a fork the source's run context as it stands: its profile, task and data, and the
    usage of the iterations the fork carries (``carried_iteration(be32(iteration), record)``)."""
    for name in ("profiles", "tasks"):
        value = txn.get(source_key, db=db[name])
        if value is not None:
            txn.put(fork_key, value, db=db[name])
    for name, wanted in (("state_data", None), ("usage", carried_iteration)):
        for suffix, value in list(records_under(txn, db[name], source_key)):
            if wanted is None or wanted(suffix, value):
                txn.put(fork_key + suffix, value, db=db[name])
