"""Every domain error reaches the client as its own status and machine code, through unary and
streaming calls alike, and no error class can exist without a status."""

from __future__ import annotations

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar import errors
from sidecar.errors import SidecarError
from tests.helpers import call_error, rich_error

# Written out here, apart from the code: a new error class fails this test until someone
# decides what its callers should see.
EXPECTED = {
    "internal": grpc.StatusCode.INTERNAL,
    "validation_error": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "token_budget_exceeded": grpc.StatusCode.FAILED_PRECONDITION,
    "store_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "replay_context_summary_unavailable": grpc.StatusCode.FAILED_PRECONDITION,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "aborted": grpc.StatusCode.ABORTED,
    "compaction_disabled": grpc.StatusCode.FAILED_PRECONDITION,
    "watch_fell_behind": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_many_watches": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "plugin_failed": grpc.StatusCode.INTERNAL,
    "state_invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "transcript_window_exceeded": grpc.StatusCode.FAILED_PRECONDITION,
    "shared_store_unavailable": grpc.StatusCode.UNAVAILABLE,
}
# A code two classes share, each with its own status: the class decides.
EXPECTED_OF_CLASS = {"WriteConflict": grpc.StatusCode.ABORTED}
MESSAGE = "run 'r' cannot do that"


def every_error_class() -> list[type[SidecarError]]:
    found, pending = [SidecarError], list(SidecarError.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending += cls.__subclasses__()
    return found


def raised_by(cls: type[SidecarError]):
    def raise_it(*args: object, **kwargs: object) -> None:
        raise cls(MESSAGE)
    return raise_it


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda cls: cls.__name__)
def test_every_error_class_reaches_the_client_as_its_status(start_server, monkeypatch, cls) -> None:
    assert cls.code in EXPECTED, f"{cls.__name__} ({cls.code!r}): add the status its callers should see to EXPECTED"
    sidecar = start_server()
    monkeypatch.setattr(sidecar.services.transcripts, "list_events", raised_by(cls))
    with pytest.raises(grpc.RpcError) as raised:
        sidecar.stub.ListRunEvents(pb.ListRunEventsRequest(run_id="r"))
    status, reason, _ = rich_error(raised.value)
    assert (status, reason) == (EXPECTED_OF_CLASS.get(cls.__name__, EXPECTED[cls.code]), cls.code)
    assert raised.value.details() == MESSAGE  # the message as raised: no exception text, no traceback


def test_an_error_class_without_its_status_cannot_be_defined() -> None:
    with pytest.raises(TypeError, match="status"):
        type("Forgotten", (errors.ValidationError,), {"code": "forgotten_code"})


def test_a_new_error_class_answers_the_status_it_declares(start_server, monkeypatch) -> None:
    declared = type("Throttled", (SidecarError,), {"code": "throttled_for_test", "status": "UNAVAILABLE"})
    sidecar = start_server()
    monkeypatch.setattr(sidecar.services.transcripts, "list_events", raised_by(declared))
    assert call_error(sidecar.stub.ListRunEvents, pb.ListRunEventsRequest(run_id="r"))[:2] == (
        grpc.StatusCode.UNAVAILABLE, "throttled_for_test")


@pytest.mark.parametrize("where", ["before the stream", "inside the stream"])
def test_an_error_in_a_stream_becomes_its_status(start_server, monkeypatch, where) -> None:
    sidecar = start_server()
    events = sidecar.services.events
    if where == "before the stream":
        monkeypatch.setattr(events, "watch", raised_by(errors.Aborted))
    else:
        real_watch = events.watch

        def watch_that_fails(*args: object):
            watch = real_watch(*args)
            watch.events = raised_by(errors.Aborted)
            return watch
        monkeypatch.setattr(events, "watch", watch_that_fails)
    with pytest.raises(grpc.RpcError) as raised:
        list(sidecar.stub.WatchEvents(pb.WatchEventsRequest(), timeout=10))
    assert rich_error(raised.value)[:2] == (grpc.StatusCode.ABORTED, "aborted")
    assert raised.value.details() == MESSAGE


def test_an_unexpected_exception_in_a_stream_is_internal_without_its_text(start_server, monkeypatch) -> None:
    sidecar = start_server()

    def broken(*args: object) -> None:
        raise KeyError("stored secret text")
    monkeypatch.setattr(sidecar.services.events, "watch", broken)
    with pytest.raises(grpc.RpcError) as raised:
        list(sidecar.stub.WatchEvents(pb.WatchEventsRequest(), timeout=10))
    assert rich_error(raised.value)[:2] == (grpc.StatusCode.INTERNAL, "internal")
    assert "secret" not in raised.value.details()
