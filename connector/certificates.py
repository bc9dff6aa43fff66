"""A small certificate authority for local clusters and tests (`ledger cluster start --tls`).

Not a production PKI: keys are written unencrypted (mode 0600) next to the cluster. Node certificates name
127.0.0.1, ::1 and localhost, the addresses a local node registers and clients dial, so clients verify them
without overriding the target name.
"""
from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")
VALID_DAYS = 825


@dataclasses.dataclass(frozen=True)
class Issued:
    cert: pathlib.Path
    key: pathlib.Path


@dataclasses.dataclass(frozen=True)
class CertificateAuthority:
    cert: pathlib.Path
    key: pathlib.Path

    @classmethod
    def create(cls, directory: str | os.PathLike, name: str = "ledger-store local CA") -> "CertificateAuthority":
        directory = pathlib.Path(directory)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(subject, subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(*_write(directory, "ca", cert, key))

    def issue(self, directory: str | os.PathLike, name: str, hosts: tuple[str, ...] = LOCAL_NAMES,
              client: bool = False) -> Issued:
        """A certificate for a server naming hosts (subjectAltNames), or with client=True one for a client."""
        ca_cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                                            critical=False)
        return Issued(*_write(pathlib.Path(directory), name, builder.sign(ca_key, hashes.SHA256()), key))


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(directory: pathlib.Path, name: str, cert: x509.Certificate, key) -> tuple[pathlib.Path, pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return cert_path, key_path
