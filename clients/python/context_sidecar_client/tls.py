"""``ClientTls``: the CA a client trusts (and its own certificate, under mTLS), in one option.

    from context_sidecar_client import Client, ClientTls
    tls = ClientTls("ca.pem", cert_file="client.pem", key_file="client.key")
    with Client("sidecar.internal:50051", token, tls=tls) as sidecar: ...

The files are read and checked when the ``ClientTls`` is made (a missing file, or a certificate
and key that do not match, raise there rather than at the first call), and read again for each
client made with it, so a client made after a renewal takes the renewed files.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["ClientTls"]

# A unix socket's path is no host name: the sidecar's certificate is checked against this name
# instead (a certificate for the machine itself), unless channel_options name another.
UNIX_SOCKET_SERVER_NAME = "localhost"
NAME_OVERRIDE = "grpc.ssl_target_name_override"

FilePath = str | os.PathLike[str]


@dataclass(frozen=True)
class ClientTls:
    """TLS for a client's channel.

    ``ca_file``: the CA certificates (PEM) the sidecar's certificate must chain to; None: the
    system's roots (gRPC's bundled ones). ``cert_file`` and ``key_file``, together or neither:
    the client's certificate chain and its unencrypted private key (PEM), which a sidecar with
    ``[server.tls] client_ca_file`` asks for (mTLS). Over a unix socket the sidecar's certificate
    must name ``localhost`` (or the channel option ``grpc.ssl_target_name_override``)."""

    ca_file: FilePath | None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("cert_file", "key_file") if self.cert_file is not None else ("key_file", "cert_file")
            raise ValueError(f"ClientTls: {missing} is required with {given} (a client certificate and its key)")
        self._read()

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials of a secure channel, from the files as they are now."""
        ca, chain, key = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=chain)

    def channel_options(self, target: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``options`` with, for a unix socket target, the name its certificate is checked against."""
        if target.startswith("unix:") and all(name != NAME_OVERRIDE for name, _ in options):
            return [*options, (NAME_OVERRIDE, UNIX_SOCKET_SERVER_NAME)]
        return list(options)

    def _read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        ca, chain, key = (_read("ca_file", self.ca_file), _read("cert_file", self.cert_file),
                          _read("key_file", self.key_file))
        # gRPC would find a bad file only at the first call, as UNAVAILABLE; the standard
        # library's TLS reads the same PEM now, so the error names the file.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if ca is not None:
            try:
                context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as error:  # ValueError: no certificate at all (an empty file)
                raise ValueError(f"ClientTls ca_file: {self.ca_file} holds no PEM CA certificate "
                                 f"({_why(error)})") from None
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except ssl.SSLError as error:
                raise ValueError(f"ClientTls cert_file / key_file: {self.cert_file} and {self.key_file} are not a "
                                 f"PEM certificate chain and its private key ({_why(error)})") from None
        return ca, chain, key


def open_channel(grpc_module: Any, target: str, options: Sequence[tuple[str, Any]], tls: ClientTls | None) -> Any:
    """A channel of ``grpc_module`` (``grpc``, or ``grpc.aio`` for the asyncio client) to
    ``target``: plaintext without ``tls``, else secure with its files as they are now."""
    if tls is None:
        return grpc_module.insecure_channel(target, options=list(options))
    return grpc_module.secure_channel(target, tls.credentials(), options=tls.channel_options(target, options))


def _read(option: str, path: FilePath | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        # The same OSError subclass (FileNotFoundError, PermissionError, ...), naming the option.
        raise type(error)(error.errno, f"ClientTls {option}: cannot read {os.fspath(path)} "
                                       f"({error.strerror})") from None


def _why(error: Exception) -> str:
    """What the standard library's TLS said: OpenSSL's reason when it gave one."""
    return getattr(error, "reason", None) or str(error)
