"""Shared fixtures: real LMDB in a temp folder, real encodings, a real server on a real port."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from sidecar.memory import index as memory_module
from sidecar.settings import (
    AuthSettings,
    ClearingSettings,
    ContextSettings,
    MemoryCompactionSettings,
    MemorySettings,
    RenderSettings,
    ServerSettings,
    Settings,
    StorageSettings,
    TenantCredential,
)
from sidecar.storage.environment import Store
from sidecar.storage.shared import SharedStore
from sidecar.telemetry.metrics import Metrics
from sidecar.text.counting import Counters
from sidecar.transcript.transcripts import Transcripts
from sidecar.wire import server as server_module
from sidecar.wire.server import Services, build_server

PLUGIN = Path(__file__).resolve().parent / "plugin"


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test plugin (tests/plugin) installed into a folder of its own (its dist-info holds the
    entry points); a sidecar loads it with ``env=with_site(site)``."""
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = shutil.copytree(PLUGIN, tmp_path_factory.mktemp("source") / "plugin")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, cwd=source, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert list(target.glob("context_sidecar_test_plugin-*.dist-info"))
    return target


@pytest.fixture(scope="session")
def counters() -> Counters:
    """Both tiktoken encodings load once per test session (~0.5 s)."""
    return Counters()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(str(tmp_path / "lmdb"), map_size=16 << 20)
    yield store
    store.close()


@pytest.fixture
def small_segments(monkeypatch):
    """Seal after 8 postings, 3 chunks a segment: a few hundred entries cross many segments."""
    monkeypatch.setattr(memory_module, "POSTINGS_PER_CHUNK", 8)
    monkeypatch.setattr(memory_module, "POSTINGS_PER_SEGMENT", 24)


@pytest.fixture
def make_transcripts(store: Store, counters: Counters):
    def make(clearing: dict | None = None, **context: object) -> Transcripts:
        # The domain's own tests hold the window's rules over the host's events; [context.clearing]
        # (on by default in a server) is tested through a real server, in tests/transcript/test_clearing.py.
        return Transcripts(store, counters, ContextSettings(**context),
                           clearing_settings=ClearingSettings(**(clearing or {"enabled": False})))
    return make


def settings_for(tmp_path: Path, storage: dict | None = None, memory: dict | None = None,
                 tenants: dict[str, str] | None = None, compaction: dict | None = None, clearing: dict | None = None,
                 render: dict | None = None, **context: object) -> Settings:
    """``tenants``: tenant id -> bearer token (the settings keep only its SHA-256); ``clearing``:
    the [context.clearing] section."""
    credentials = tuple(TenantCredential(tenant, hashlib.sha256(token.encode()).hexdigest())
                        for tenant, token in (tenants or {}).items())
    storage = {"path": str(tmp_path / "lmdb"), "map_size": 16 << 20, **(storage or {})}  # a test may name its path
    return Settings(server=ServerSettings(listen="127.0.0.1:0"), storage=StorageSettings(**storage),
                    context=ContextSettings(**context), context_clearing=ClearingSettings(**(clearing or {})),
                    memory=MemorySettings(**(memory or {})),
                    memory_compaction=MemoryCompactionSettings(**(compaction or {})), auth=AuthSettings(credentials),
                    render=RenderSettings(**(render or {})))


@dataclasses.dataclass
class RunningServer:
    address: str
    channel: grpc.Channel
    stub: pb_grpc.ContextSidecarStub
    services: Services
    metrics: Metrics | None = None  # the server's figures (its registry), when started with metrics=True


@pytest.fixture
def start_server(tmp_path: Path, counters: Counters):
    """Start a real gRPC server on 127.0.0.1:<free port> with the given [context] settings."""
    started: list[tuple[grpc.Server, RunningServer]] = []

    def start_with(storage: dict | None = None, memory: dict | None = None, tenants: dict[str, str] | None = None,
                   compaction: dict | None = None, clearing: dict | None = None, render: dict | None = None,
                   metrics: bool = False, clock: Callable[[], float] = time.time,
                   **context: object) -> RunningServer:
        settings = settings_for(tmp_path / f"server{len(started)}", storage, memory, tenants, compaction, clearing,
                                render, **context)
        storage_settings = settings.storage
        shared = SharedStore(storage_settings.shared, storage_settings.shared_pool_size,
                             storage_settings.shared_timeout) if storage_settings.shared else None
        store = Store(storage_settings.path, storage_settings.map_size, storage_settings.max_map_size, shared=shared)
        services = Services.build(settings, store, counters, clock)
        measured = Metrics(store.map_usage, storage_settings.max_map_size) if metrics else None
        server, port, health_servicer = build_server(settings, services, metrics=measured)
        server_module.start(server, health_servicer)
        address = f"127.0.0.1:{port}"
        channel = grpc.insecure_channel(address)
        running = RunningServer(address, channel, pb_grpc.ContextSidecarStub(channel), services, measured)
        started.append((server, running))
        return running

    yield start_with
    for server, running in started:
        running.channel.close()
        server.stop(None).wait()
        running.services.close()


@pytest.fixture
def sidecar(start_server) -> RunningServer:
    """A server with a small budget in the `chars` counter, easy to reason about in tests."""
    return start_server(token_counter="chars", transcript_token_budget=1000)
