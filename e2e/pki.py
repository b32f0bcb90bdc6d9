"""Certificates and keys for the local control plane, generated with `cryptography`.

One CA signs the API server's serving certificate and the aggregator's client certificate (the front
proxy towards extension API servers such as the suite's external metrics API); a separate RSA key pair
signs and verifies ServiceAccount tokens. The admin client authenticates with a static token, which keeps the kubeconfig
simple for kubectl, helm, kopf and the Python client alike.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)
SERVICE_CLUSTER_IP = "10.0.0.1"
FRONT_PROXY_CLIENT = "front-proxy-client"  # the aggregator's client certificate's CN (requestheader-allowed-names)


@dataclass(frozen=True)
class Pki:
    """Paths of the generated material (all under one directory)."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    sa_public: Path
    sa_private: Path
    token_file: Path
    admin_token: str
    kubelet_client_cert: Path
    kubelet_client_key: Path
    proxy_client_cert: Path  # the aggregator's client certificate towards extension API servers
    proxy_client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str | x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject) if isinstance(subject, str) else subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _serving_names(extra_ips: list[str]) -> x509.SubjectAlternativeName:
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns.append("kubernetes.default.svc.cluster.local")
    ips = list(dict.fromkeys(["127.0.0.1", SERVICE_CLUSTER_IP, *extra_ips]))
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return x509.SubjectAlternativeName(names)


def generate(directory: Path, extra_ips: list[str] | None = None) -> Pki:
    """Create CA, API server serving and kubelet-client certs, SA keys and the admin token in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _builder("pd-e2e-ca", _name("pd-e2e-ca"), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        _builder("kube-apiserver", ca_cert.subject, server_key.public_key())
        .add_extension(_serving_names(extra_ips or []), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    kubelet_client_key = ec.generate_private_key(ec.SECP256R1())
    kubelet_client_cert = (
        _builder("kube-apiserver-kubelet-client", ca_cert.subject, kubelet_client_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    proxy_client_key = ec.generate_private_key(ec.SECP256R1())
    proxy_client_cert = (
        _builder(FRONT_PROXY_CLIENT, ca_cert.subject, proxy_client_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        server_cert=directory / "apiserver.crt",
        server_key=directory / "apiserver.key",
        sa_public=directory / "sa.pub",
        sa_private=directory / "sa.key",
        token_file=directory / "tokens.csv",
        admin_token=secrets.token_hex(24),
        kubelet_client_cert=directory / "kubelet-client.crt",
        kubelet_client_key=directory / "kubelet-client.key",
        proxy_client_cert=directory / "front-proxy-client.crt",
        proxy_client_key=directory / "front-proxy-client.key",
    )
    pki.proxy_client_cert.write_bytes(proxy_client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.proxy_client_key, proxy_client_key)
    pki.kubelet_client_cert.write_bytes(kubelet_client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.kubelet_client_key, kubelet_client_key)
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    _write_key(pki.sa_private, sa_key)
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    pki.token_file.write_text(f'{pki.admin_token},pd-e2e-admin,pd-e2e-admin,"system:masters"\n')
    pki.token_file.chmod(0o600)
    return pki


def self_signed_serving_cert(directory: Path, name: str, ips: list[str]) -> tuple[Path, Path]:
    """A throwaway self-signed serving certificate (the external metrics API's); returns (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = x509.SubjectAlternativeName([x509.DNSName(name), *[x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]])
    cert = _builder(name, _name(name), key.public_key()).add_extension(names, critical=False).sign(key, hashes.SHA256())
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def client_cert(pki_dir: Path, name: str, common_name: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A client certificate signed by the cluster's CA (in `pki_dir`), for user `common_name` in `groups`
    (a real node's kubelet as system:node:NAME in system:nodes, its kube-proxy, its CoreDNS)."""
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    cert = (
        _builder(x509.Name(subject), ca_cert.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = pki_dir / f"{name}.crt", pki_dir / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path
