"""A certificate authority and the certificates it signs, for tests of TLS between gpuledger's
own components (the cluster view and explain reading node agents behind --web-config-file).

`fake_apiserver.self_signed_certificate` makes a certificate that is its own CA; here the
CA and the server certificate are separate, as a cert-manager CA issuer makes them
(`ca.crt`, `tls.crt`, `tls.key`), so a test can tell a verified chain from a verified name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Issued:
    ca_file: Path  # the CA's certificate (ca.crt)
    cert_file: Path  # the server's certificate (tls.crt)
    key_file: Path  # its key (tls.key)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(
    directory: Path,
    *,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    ca_name: str = "test-ca",
) -> Issued:
    """A new CA in `directory`, and a server certificate it signs for `dns_names` and `ips`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0] if dns_names else "gpuledger"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    issued = Issued(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    issued.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    issued.cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    issued.key_file.write_bytes(_pem_key(key))
    return issued
