"""With a shared store ([storage] shared), each call first makes current the runs, memory refs and
tenant event log it names, so that it reads what other sidecars wrote (``Store.current``: one
query for their versions, a load of any that moved on). Without one, nothing is wrapped.

The units are read off the request by field name, so a new RPC with a ``run_id`` or
``memory_ref`` is covered without being listed here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import message

from sidecar.errors import SidecarError
from sidecar.storage.environment import Store
from sidecar.storage.shared import unit_id
from sidecar.wire.status import to_status

_RUN_FIELDS = ("run_id", "source_run_id", "new_run_id")
# Calls that read or write the tenant's event log (memory.compacted), which names no field.
_TENANT_LOG_CALLS = frozenset({"ListMemoryEvents", "WatchEvents", "CompactMemory"})


def units_of(call: str, request: message.Message, tenant: str) -> list[bytes]:
    """The units a call names. An id that could not name anything (empty, or with a NUL, which
    validation refuses) names none: the call answers for it."""
    names = [("run", getattr(request, field)) for field in _RUN_FIELDS if hasattr(request, field)]
    if hasattr(request, "memory_ref"):
        names.append(("memory ref", request.memory_ref))
    units = [unit_id(kind, tenant, name) for kind, name in names if name and "\0" not in name]
    if call in _TENANT_LOG_CALLS:
        units.append(unit_id("tenant", tenant))
    return units


def freshening(store: Store, tenant_of: Callable[[grpc.ServicerContext], str]) -> Callable[[Callable], Callable]:
    """A wrap for each servicer method: make what the call names current first."""
    if store.shared is None:
        return lambda behavior: behavior

    def wrap(behavior: Callable) -> Callable:
        call = behavior.__name__

        def make_current(request: Any, context: grpc.ServicerContext) -> None:
            if not isinstance(request, message.Message):  # malformed: the call refuses it
                return
            try:
                tenant = tenant_of(context)
            except SidecarError:  # the call answers UNAUTHENTICATED itself
                return
            try:
                store.current(units_of(call, request, tenant))
            except SidecarError as error:
                context.abort_with_status(to_status(error))

        if inspect.isgeneratorfunction(behavior):
            @functools.wraps(behavior)
            def current_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                make_current(request, context)
                yield from behavior(request, context)
            return current_stream

        @functools.wraps(behavior)
        def current(request: Any, context: grpc.ServicerContext) -> Any:
            make_current(request, context)
            return behavior(request, context)
        return current
    return wrap
