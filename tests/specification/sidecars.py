"""The sidecars the specification drives: real gRPC servers over real LMDB folders (and, for the
shared store, a real PostgreSQL database each), started in this process.

Three are fed every request alike and must answer byte for byte alike:

- ``long_lived``: started once per example, caches on;
- ``restarted``: caches on, stopped and started again on its own folder whenever the workload says
  ``restart`` (a new server, new services, the same store: nothing in memory survives);
- ``caches_off``: every in-process cache that can be switched off is (:func:`caches_off`).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
from context_sidecar_client.v1 import sidecar_pb2_grpc as pb_grpc

from sidecar.settings import ClearingSettings, ContextSettings, ServerSettings, Settings, StorageSettings
from sidecar.storage.environment import Store
from sidecar.storage.shared import SharedStore
from sidecar.text.counting import Counters
from sidecar.wire import server as server_module
from sidecar.wire.server import Services, build_server


@dataclass(frozen=True)
class Config:
    """One example's sidecar configuration (the server's settings; the run's come with OpenRun)."""

    token_counter: str  # "o200k_base", "cl100k_base" or "chars"
    budget: int  # the run's transcript_token_budget
    window_policy: str  # "cache_stable" or "max_fill"
    clearing: bool  # [context.clearing] enabled
    summaries: str  # "none", "host", "host-recursive", "extractive" (sliding-window), "extractive-recursive"
    keep_last_turns: int
    transcript_window: int  # 0: no event-count bound
    trim_to_fraction: float

    @property
    def summarization(self) -> bool:
        return self.summaries != "none"

    @property
    def strategy(self) -> str:
        return "recursive" if self.summaries.endswith("recursive") else "sliding-window"

    @property
    def summariser(self) -> str:
        return "extractive" if self.summaries.startswith("extractive") else "none"


def settings_for(folder: Path, config: Config, shared_url: str) -> Settings:
    context = ContextSettings(token_counter=config.token_counter, transcript_token_budget=config.budget,
                              keep_last_turns=config.keep_last_turns, summarization=config.summarization,
                              summarization_strategy=config.strategy, summariser=config.summariser,
                              transcript_window=config.transcript_window, window_policy=config.window_policy,
                              trim_to_fraction=config.trim_to_fraction)
    return Settings(server=ServerSettings(listen="127.0.0.1:0"),
                    storage=StorageSettings(path=str(folder / "lmdb"), map_size=64 << 20, shared=shared_url),
                    context=context, context_clearing=ClearingSettings(enabled=config.clearing))


def caches_off(settings: Settings) -> Settings:
    """The one place that says what "caches off" is: every in-process cache a setting can turn off."""
    return dataclasses.replace(settings, context=dataclasses.replace(settings.context, reassembly_cache=0),
                               cache=dataclasses.replace(settings.cache, enabled=False))


class InProcessSidecar:
    """A real gRPC server on a free loopback port, over its own LMDB folder (and shared store)."""

    def __init__(self, name: str, settings: Settings, counters: Counters) -> None:
        self.name, self.settings, self._counters = name, settings, counters
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        storage = self.settings.storage
        shared = (SharedStore(storage.shared, storage.shared_pool_size, storage.shared_timeout)
                  if storage.shared else None)
        store = Store(storage.path, storage.map_size, storage.max_map_size, shared=shared)
        self.services = Services.build(self.settings, store, self._counters)
        self._server, port, health = build_server(self.settings, self.services)
        server_module.start(self._server, health)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ContextSidecarStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self._server.stop(None).wait()
        self.services.close()

    def restart(self) -> None:
        """A new server and new services on the same folder: nothing kept in memory survives."""
        self.stop()
        self.restarts += 1
        self._start()


class Trio:
    """The three sidecars of one example, each on a folder (and database) of its own."""

    def __init__(self, config: Config, counters: Counters, shared_urls: tuple[str, str, str] | None = None) -> None:
        # Memory-backed when the machine has it: hundreds of examples each create three stores, and
        # their fsyncs on a shared disk, not the sidecar, would be most of the run.
        memory = Path("/dev/shm")
        self.folder = Path(tempfile.mkdtemp(prefix="sidecar-spec-", dir=memory if memory.is_dir() else None))
        urls = shared_urls or ("", "", "")
        self.long_lived = InProcessSidecar(
            "long_lived", settings_for(self.folder / "long_lived", config, urls[0]), counters)
        self.restarted = InProcessSidecar(
            "restarted", settings_for(self.folder / "restarted", config, urls[1]), counters)
        self.caches_off = InProcessSidecar(
            "caches_off", caches_off(settings_for(self.folder / "caches_off", config, urls[2])), counters)
        self.all = (self.long_lived, self.restarted, self.caches_off)

    def close(self) -> None:
        for sidecar in self.all:
            sidecar.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
