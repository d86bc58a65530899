"""The deployment engine's credentials: TLS for every connection to the SuperLink, and a key
pair per SuperNode, whose public key the SuperLink must have registered before that
SuperNode may join (Flower's SuperNode authentication, `--enable-supernode-auth`).

For a run on this machine `local_credentials` makes a certificate authority, the SuperLink's
certificate (for 127.0.0.1 and localhost) and the SuperNodes' P-384 key pairs; a user's own
CA and certificate are taken as they are (`Certificates`).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..errors import UbitrainError


@dataclass(frozen=True)
class Certificates:
    """The SuperLink's TLS files (PEM): the CA that signed its certificate (what SuperNodes
    and `flwr` trust), the certificate and its private key."""

    ca: Path
    certificate: Path
    key: Path

    def check(self) -> Certificates:
        missing = [str(p) for p in (self.ca, self.certificate, self.key) if not Path(p).is_file()]
        if missing:
            raise UbitrainError(f"TLS files {missing} do not exist: give the PEM files of the "
                                "CA, the SuperLink's certificate and its key")
        return Certificates(*(Path(p).resolve() for p in (self.ca, self.certificate, self.key)))


def _write_key(key, path: Path, ssh: bool = False) -> Path:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH if ssh else serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def local_certificates(directory: Path, days: int = 7) -> Certificates:
    """A CA and a certificate it signed for the SuperLink on 127.0.0.1 / localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("ubitrain fleet CA"))
          .issuer_name(_name("ubitrain fleet CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(_name("ubitrain fleet SuperLink"))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA384()))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "superlink.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Certificates(directory / "ca.crt", directory / "superlink.crt",
                        _write_key(key, directory / "superlink.key"))


def supernode_keys(directory: Path, name: str) -> tuple[Path, Path]:
    """(private key, public key) of a SuperNode, P-384 in OpenSSH's formats (what Flower
    reads): the private key stays with the SuperNode (`--auth-supernode-private-key`); the
    public key is what the SuperLink registers (`flwr supernode register`)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    public = directory / f"{name}.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return _write_key(key, directory / f"{name}.key", ssh=True), public
