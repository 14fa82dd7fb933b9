"""Domain errors, each with a stable machine code that travels to clients unchanged.

Each class names the gRPC status its code travels with, as a plain string (the domain never
imports grpc; ``sidecar.wire.status`` turns it into the status). Messages name fields and ids the
caller sent, never stored content.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field: its path in the request (``events[3].iteration``) and what is wrong."""

    field: str
    description: str


# The gRPC status codes an error may answer with (OK and UNKNOWN are never deliberate);
# sidecar.wire.status checks at import that grpc knows each of them.
STATUS_NAMES = frozenset({
    "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"})


class SidecarError(Exception):
    """Base of every error the sidecar answers deliberately.

    Each class declares its ``status`` beside its ``code``: the name of a gRPC status code
    (``grpc.StatusCode`` member), a plain string so the domain never imports grpc. A class that
    brings a new code without its own status cannot be defined, so no code can reach a client
    as UNKNOWN."""

    code: str = "internal"
    status: str = "INTERNAL"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__ and "status" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} declares code {cls.code!r} but no status: add "
                            "status = '<grpc.StatusCode name>' beside it")
        if cls.status not in STATUS_NAMES:
            raise TypeError(f"{cls.__name__}: status {cls.status!r} is not one of {', '.join(sorted(STATUS_NAMES))}")

    def __init__(self, message: str, violations: tuple[FieldViolation, ...] = (),
                 metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.violations = violations
        self.metadata = metadata or {}  # travels as ErrorInfo.metadata

    @classmethod
    def field(cls, field: str, description: str) -> Self:
        """The error for one bad field, named in the message and as a violation."""
        return cls(f"{field}: {description}", (FieldViolation(field, description),))


class ValidationError(SidecarError):
    code = "validation_error"
    status = "INVALID_ARGUMENT"


class NotFound(SidecarError):
    code = "not_found"
    status = "NOT_FOUND"


class Conflict(SidecarError):
    """The request names something that already exists with different contents."""

    code = "conflict"
    status = "ALREADY_EXISTS"


class WriteConflict(Conflict):
    """With a shared store, other sidecars kept writing the same run or memory ref while this call
    was retried; nothing of it was written. The machine code is ``conflict`` as for ALREADY_EXISTS,
    told apart by its status: this one is worth calling again."""

    code = "conflict"
    status = "ABORTED"


class SharedStoreUnavailable(SidecarError):
    """The shared store ([storage] shared) did not answer, or answered as one behind what this
    sidecar saw; nothing of the call was written, unless the message says its commit was sent but
    not confirmed (it may have landed: the next call naming its run or ref finds out)."""

    code = "shared_store_unavailable"
    status = "UNAVAILABLE"


class TokenBudgetExceeded(SidecarError):
    code = "token_budget_exceeded"
    status = "FAILED_PRECONDITION"


class TranscriptWindowExceeded(SidecarError):
    """The active turn (with the tool calls its results answer) holds more events than the
    run's transcript_window: like the token budget, a bound that is never exceeded."""

    code = "transcript_window_exceeded"
    status = "FAILED_PRECONDITION"


class StoreFull(SidecarError):
    code = "store_full"
    status = "RESOURCE_EXHAUSTED"


class SummaryUnavailable(SidecarError):
    """A summary that a window or a replay needs can no longer be read (its artifact is gone)."""

    code = "replay_context_summary_unavailable"
    status = "FAILED_PRECONDITION"


class Unauthenticated(SidecarError):
    """No bearer token, or one that names no tenant."""

    code = "unauthenticated"
    status = "UNAUTHENTICATED"


class Aborted(SidecarError):
    """A concurrent change got in the way; the same call again will go through."""

    code = "aborted"
    status = "ABORTED"


class CompactionDisabled(SidecarError):
    code = "compaction_disabled"
    status = "FAILED_PRECONDITION"


class WatchFellBehind(SidecarError):
    """A WatchEvents caller read too slowly; it resumes from the kept log."""

    code = "watch_fell_behind"
    status = "RESOURCE_EXHAUSTED"


class TooManyWatches(SidecarError):
    """Every place for a WatchEvents stream is taken: each holds a thread while open, and they may
    hold at most half of the server's, so the other calls are always served."""

    code = "too_many_watches"
    status = "RESOURCE_EXHAUSTED"


class PluginFailed(SidecarError):
    """The configured plugin raised or answered what a hook cannot take (a server-side defect)."""

    code = "plugin_failed"
    status = "INTERNAL"


class StateInvalid(SidecarError):
    """Agent-state data that its subset's JSON schema rejects."""

    code = "state_invalid"
    status = "INVALID_ARGUMENT"


class DeadlineExceeded(SidecarError):
    """The caller's deadline passed before the work was done: it stopped, and wrote nothing."""

    code = "deadline_exceeded"
    status = "DEADLINE_EXCEEDED"


class Deadline:
    """When a call must be done by, in ``time.monotonic()`` terms (None: never), checked between
    the costly stages of a call so a server stops work whose caller has already given up."""

    __slots__ = ("at",)

    def __init__(self, at: float | None = None) -> None:
        self.at = at

    def check(self, stage: str) -> None:
        if self.at is not None and time.monotonic() >= self.at:
            raise DeadlineExceeded(f"the call's deadline passed {stage}; nothing was written")


NO_DEADLINE = Deadline()
