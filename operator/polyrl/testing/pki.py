"""Certificates and keys for a loopback control plane, generated fresh for every start.

One CA signs the API server's serving certificate and the client certificates of the
admin, the controller manager and the scheduler; RBAC's bootstrap policy already knows the
last two by their common names, so no extra bindings are needed. A separate RSA key pair
signs and verifies service-account tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Pki:
    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    sa_key: Path
    sa_pub: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        usage = x509.KeyUsage(True, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def self_signed(directory: Path, stem: str, common: str) -> KeyPair:
    """A serving certificate for 127.0.0.1 signed by its own key (the node agent's kubelet
    endpoint: the test API server does not verify kubelets)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(subject=_name(common), key=key, issuer=_name(common), issuer_key=key, server=True)
    pair = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)
    return pair


def serving(directory: Path, ca: KeyPair, *, common: str) -> KeyPair:
    """A serving certificate for 127.0.0.1 signed by the control plane's CA, written as
    `tls.crt` and `tls.key` (what controller-runtime's webhook server reads): the API server
    calls a webhook on loopback and trusts it through the CA bundle its configuration names."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        subject=_name(common), key=key, issuer=ca_cert.subject, issuer_key=ca_key, server=True
    )
    pair = KeyPair(directory / "tls.crt", directory / "tls.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)
    return pair


def _name(common: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def generate(directory: Path) -> Pki:
    """Write a fresh CA, serving and client certificates and SA keys into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("polyrl-test-ca")
    ca_cert = _issue(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, ca=True)

    def pair(stem: str, subject: x509.Name, *, server: bool = False) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(subject=subject, key=key, issuer=ca_name, issuer_key=ca_key, server=server)
        kp = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
        kp.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(kp.key, key)
        return kp

    ca = KeyPair(directory / "ca.crt", directory / "ca.key")
    ca.cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca.key, ca_key)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_key_path, sa_key)
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=ca,
        apiserver=pair("apiserver", _name("kube-apiserver"), server=True),
        admin=pair("admin", _name("polyrl-admin", "system:masters")),
        controller_manager=pair("controller-manager", _name("system:kube-controller-manager")),
        scheduler=pair("scheduler", _name("system:kube-scheduler")),
        sa_key=sa_key_path,
        sa_pub=sa_pub_path,
    )
