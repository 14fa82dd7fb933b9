"""TLS for the gRPC server (``[server.tls]``), and its certificates re-read without a restart.

gRPC's dynamic server credentials ask, before each new connection's handshake, whether the
certificates changed: :meth:`ServerCertificates.reload` (on SIGHUP) reads the files and hands the
new ones to the next handshake. Connections already open keep theirs, so no call or open stream is
dropped by a reload; a reload whose files are unreadable or do not match keeps the certificates in
use and says why in the log.
"""

from __future__ import annotations

import logging
import ssl
import threading

import grpc

from sidecar.settings import ConfigError, ServerTlsSettings

log = logging.getLogger(__name__)


class ServerCertificates:
    """``[server.tls]``'s files, read now (a ConfigError naming the key when one cannot be used)
    and again on :meth:`reload`."""

    def __init__(self, tls: ServerTlsSettings) -> None:
        self._tls = tls
        self._initial = self._read()
        self._lock = threading.Lock()
        self._renewed: grpc.ServerCertificateConfiguration | None = None

    @property
    def mutual(self) -> bool:
        """Whether every client must present a certificate (a client CA is set)."""
        return bool(self._tls.client_ca_file)

    def credentials(self) -> grpc.ServerCredentials:
        # grpc-stubs type the fetcher as never answering None, which gRPC documents as "no change".
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._renewed_since_asked,  # type: ignore[arg-type]
            require_client_authentication=self.mutual)

    def reload(self) -> bool:
        """Read the files again for the connections that come next; False (logged) when they
        cannot be used, and the certificates in use stay."""
        try:
            renewed = self._read()
        except ConfigError as error:
            log.error("TLS certificates not reloaded, the ones in use stay: %s", error)
            return False
        with self._lock:
            self._renewed = renewed
        log.info("TLS certificates reloaded from %s", self._tls.cert_file)
        return True

    def _renewed_since_asked(self) -> grpc.ServerCertificateConfiguration | None:
        # gRPC calls this before every handshake; None keeps the configuration it has.
        with self._lock:
            renewed, self._renewed = self._renewed, None
        return renewed

    def _read(self) -> grpc.ServerCertificateConfiguration:
        tls = self._tls
        chain, key = _read_file("cert_file", tls.cert_file), _read_file("key_file", tls.key_file)
        client_ca = _read_file("client_ca_file", tls.client_ca_file) if tls.client_ca_file else None
        # gRPC finds a bad file only at the first handshake, and then refuses every client; the
        # standard library's TLS reads them the same way now, so the error names the file.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)  # opens the files again, by their paths
        except ssl.SSLError as error:
            raise ConfigError(f"[server.tls] cert_file / key_file: {tls.cert_file} and {tls.key_file} are not a "
                              f"PEM certificate chain and its private key ({_why(error)})") from None
        except OSError as error:  # replaced since read: a renewal caught between its writes
            raise ConfigError(f"[server.tls] cert_file / key_file: cannot read {tls.cert_file} and {tls.key_file}: "
                              f"{error.strerror}") from None
        if client_ca is not None:
            try:
                context.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as error:  # ValueError: no certificate at all (an empty file)
                raise ConfigError(f"[server.tls] client_ca_file: {tls.client_ca_file} holds no PEM CA "
                                  f"certificate ({_why(error)})") from None
        # The check read the files by their paths: gRPC gets the bytes read before it only if they
        # are still what the files hold (not a renewal's certificate beside the old key).
        if (_read_file("cert_file", tls.cert_file), _read_file("key_file", tls.key_file)) != (chain, key):
            raise ConfigError(f"[server.tls] cert_file / key_file: {tls.cert_file} and {tls.key_file} changed while "
                              "they were read; send SIGHUP again once both are written")
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=client_ca)


def _read_file(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ConfigError(f"[server.tls] {key}: cannot read {path}: {error.strerror}") from None


def _why(error: Exception) -> str:
    """What the standard library's TLS said: OpenSSL's reason when it gave one."""
    return getattr(error, "reason", None) or str(error)
