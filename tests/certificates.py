"""Certificates the TLS tests make for themselves: a CA of their own, server certificates for
loopback, client certificates, and a second CA that the sidecar does not trust.

Every suite that talks TLS to a sidecar uses these files: each runs ``python -m tests.certificates
FOLDER`` (Python's, Node.js's, Go's, Java's and Rust's), so each language's client is
tested against the same certificates, made fresh by each run: nothing secret is committed.

Files written to the folder (PEM):
- ``ca.pem``: the CA the sidecar's clients trust and whose client certificates the sidecar accepts;
- ``server.pem`` / ``server.key`` and ``server-renewed.pem`` / ``server-renewed.key``: two server
  certificates from that CA for ``localhost``, ``127.0.0.1`` and ``::1`` (different serials and
  common names, so that a reload can be seen by which one a client is shown);
- ``client.pem`` / ``client.key``: a client certificate from that CA;
- ``other-ca.pem``, ``other-client.pem`` / ``other-client.key``: a CA nobody trusts and a client
  certificate it signed (refused under mTLS);
- ``other-server.pem`` / ``other-server.key``: a server certificate the other CA signed (a client
  that trusts only ``ca.pem`` refuses it).
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                  x509.IPAddress(ipaddress.ip_address("::1")))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "context-sidecar tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)) \
        .not_valid_after(now + datetime.timedelta(days=2))


def _authority(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = _validity(x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
                        .public_key(key.public_key()).serial_number(x509.random_serial_number()))
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).add_extension(
        x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                      key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                      decipher_only=False), critical=True)
    return builder.sign(key, hashes.SHA256()), key


def _leaf(common_name: str, authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
          server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_certificate, ca_key = authority
    key = _key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _validity(x509.CertificateBuilder().subject_name(_name(common_name))
                        .issuer_name(ca_certificate.subject).public_key(key.public_key())
                        .serial_number(x509.random_serial_number()))
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(LOOPBACK_NAMES)), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(folder: Path, stem: str, certificate: x509.Certificate,
           key: ec.EllipticCurvePrivateKey | None = None) -> None:
    (folder / f"{stem}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path = folder / f"{stem}.key"
        # PKCS#8, unencrypted: what gRPC's C core, grpc-js, Go and Netty all read.
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)


def make_certificates(folder: Path) -> None:
    """Write a fresh CA, its server and client certificates, and an untrusted CA's, to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = _authority("context-sidecar test CA")
    other = _authority("an untrusted CA")
    _write(folder, "ca", authority[0])
    _write(folder, "other-ca", other[0])
    _write(folder, "server", *_leaf("sidecar server", authority, server=True))
    _write(folder, "server-renewed", *_leaf("sidecar server, renewed", authority, server=True))
    _write(folder, "client", *_leaf("agent host", authority, server=False))
    _write(folder, "other-client", *_leaf("a stranger", other, server=False))
    _write(folder, "other-server", *_leaf("an impostor", other, server=True))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.certificates FOLDER")
    make_certificates(Path(sys.argv[1]))
