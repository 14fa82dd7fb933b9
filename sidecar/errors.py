"""Domain errors, each with a stable machine code that travels to clients unchanged.

The wire layer maps each code to a gRPC status in one table (``sidecar.status``); the domain
never names a gRPC status. Messages name fields and ids the caller sent, never stored content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field: its path in the request (``events[3].iteration``) and what is wrong."""

    field: str
    description: str


class SidecarError(Exception):
    """Base of every error the sidecar answers deliberately."""

    code: str = "internal"

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


class NotFound(SidecarError):
    code = "not_found"


class Conflict(SidecarError):
    """The request names something that already exists with different contents."""

    code = "conflict"


class TokenBudgetExceeded(SidecarError):
    code = "token_budget_exceeded"


class StoreFull(SidecarError):
    code = "store_full"


class SummaryUnavailable(SidecarError):
    """A summary that a window or a replay needs can no longer be read (its artifact is gone)."""

    code = "replay_context_summary_unavailable"


class Unauthenticated(SidecarError):
    """No bearer token, or one that names no tenant."""

    code = "unauthenticated"


class Aborted(SidecarError):
    """A concurrent change got in the way; the same call again will go through."""

    code = "aborted"


class CompactionDisabled(SidecarError):
    code = "compaction_disabled"


class WatchFellBehind(SidecarError):
    """A WatchEvents caller read too slowly; it resumes from the kept log."""

    code = "watch_fell_behind"


class PluginFailed(SidecarError):
    """The configured plugin raised or answered what a hook cannot take (a server-side defect)."""

    code = "plugin_failed"


class StateInvalid(SidecarError):
    """Agent-state data that its subset's JSON schema rejects."""

    code = "state_invalid"
