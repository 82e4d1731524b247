"""The Kubernetes sandbox's certificates: one CA per run, serving and client certificates, and the
service-account signing key pair, made with the `cryptography` package (no openssl, no cfssl).

What each certificate is for decides its subject (`certificate_plan`, pure, unit-tested):
- the API server's serving certificate names 127.0.0.1 and the in-cluster names of the `kubernetes`
  Service (kubeadm's list: kubernetes, kubernetes.default, kubernetes.default.svc,
  kubernetes.default.svc.cluster.local, and the Service's first IP);
- clients are identified by their certificate: CN is the user, O the groups (Kubernetes docs,
  "Authenticating", X509 client certificates). The admin is in `system:masters`; the controller
  manager and the scheduler are the users the bootstrap RBAC policy binds their roles to,
  `system:kube-controller-manager` and `system:kube-scheduler`; kwok is `gpufleet:kwok`, bound to
  a ClusterRole of its own (rbac.py);
- etcd serves TLS and requires client certificates of the same CA (the API server's), so nothing
  else on the machine reads the cluster's data; the controller manager and the scheduler serve
  their /healthz with certificates of this CA, so readiness checks verify whom they talk to.
Keys are ECDSA P-256 (fast to make; Go's TLS, etcd and the API server take them); the
service-account key is RSA 2048 (RS256, what every client of projected tokens verifies).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "ca"
SA_KEY = "sa.key"
SA_PUB = "sa.pub"
LOOPBACK_IP = "127.0.0.1"
# The first address of --service-cluster-ip-range (daemons.SERVICE_CIDR): the `kubernetes` Service.
KUBERNETES_SERVICE_IP = "10.96.0.1"
KUBERNETES_SERVICE_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
VALID_DAYS = 30  # a sandbox lives hours; a month outlasts any run without being a long-lived secret
CLOCK_SKEW = dt.timedelta(minutes=5)

ADMIN_USER = "gpufleet-admin"
MASTERS_GROUP = "system:masters"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
NODES_GROUP = "system:nodes"  # the Node authorizer's group; a kubelet is system:node:<name>
KWOK_USER = "gpufleet:kwok"
# The API server's identity towards the kubelets (logs, exec): kubeadm's name for the same pair.
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"


@dataclass(frozen=True)
class CertSpec:
    """One certificate of the run: files `<name>.crt` and `<name>.key`."""

    name: str
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False
    client: bool = False


def certificate_plan() -> tuple[CertSpec, ...]:
    """Every certificate a run makes, by file name (pure)."""
    loopback_dns = ("localhost",)
    return (
        CertSpec(
            "apiserver",
            "kube-apiserver",
            dns_names=(*loopback_dns, *KUBERNETES_SERVICE_NAMES),
            ip_addresses=(LOOPBACK_IP, KUBERNETES_SERVICE_IP),
            server=True,
        ),
        CertSpec(
            "etcd-server",
            "etcd",
            dns_names=loopback_dns,
            ip_addresses=(LOOPBACK_IP,),
            server=True,
            client=True,
        ),  # etcd dials its own client URL (its gRPC gateway) with this pair
        CertSpec("apiserver-etcd-client", "kube-apiserver-etcd-client", client=True),
        CertSpec("apiserver-kubelet-client", KUBELET_CLIENT_USER, client=True),
        CertSpec("admin", ADMIN_USER, organizations=(MASTERS_GROUP,), client=True),
        CertSpec("controller-manager", CONTROLLER_MANAGER_USER, client=True),
        CertSpec("scheduler", SCHEDULER_USER, client=True),
        CertSpec("kwok", KWOK_USER, client=True),
        CertSpec(
            "controller-manager-serving",
            "kube-controller-manager",
            dns_names=loopback_dns,
            ip_addresses=(LOOPBACK_IP,),
            server=True,
        ),
        CertSpec(
            "scheduler-serving",
            "kube-scheduler",
            dns_names=loopback_dns,
            ip_addresses=(LOOPBACK_IP,),
            server=True,
        ),
    )


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_ca(common_name: str, now: dt.datetime, days: int = VALID_DAYS) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: KeyPair, spec: CertSpec, now: dt.datetime, days: int = VALID_DAYS) -> KeyPair:
    """A leaf certificate of `spec`, signed by `ca`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if spec.server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if spec.client else []
    )
    if not usages:
        raise ValueError(f"certificate {spec.name} is neither for a server nor for a client")
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(spec.common_name, spec.organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in spec.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in spec.ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_key_pair() -> tuple[bytes, bytes]:
    """(private PEM, public PEM): the API server signs tokens with the private key
    (--service-account-signing-key-file) and verifies them with the public one
    (--service-account-key-file); the controller manager signs the legacy token Secrets with it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


@dataclass(frozen=True)
class Pki:
    """Paths of a run's certificates and keys (pki/ in the run directory)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / f"{CA_NAME}.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / f"{CA_NAME}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / SA_KEY

    @property
    def sa_pub(self) -> Path:
        return self.dir / SA_PUB

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_pki(pki: Pki, cluster: str, now: dt.datetime | None = None) -> None:
    """Make the CA, every certificate of `certificate_plan()` and the service-account key pair;
    private keys are written 0600 (the folder itself is 0700)."""
    now = now or dt.datetime.now(dt.UTC)
    pki.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = new_ca(f"gpufleet-sandbox-ca-{cluster}", now)
    _write(pki.ca_cert, ca.cert_pem, 0o644)
    _write(pki.ca_key, ca.key_pem, 0o600)
    for spec in certificate_plan():
        pair = issue(ca, spec, now)
        _write(pki.cert(spec.name), pair.cert_pem, 0o644)
        _write(pki.key(spec.name), pair.key_pem, 0o600)
    private, public = service_account_key_pair()
    _write(pki.sa_key, private, 0o600)
    _write(pki.sa_pub, public, 0o644)


def node_cert_specs(node: str) -> tuple[CertSpec, CertSpec]:
    """A kubelet's client certificate (`system:node:<node>` in `system:nodes`, what the Node
    authorizer and NodeRestriction expect) and its serving certificate on loopback (pure)."""
    return (
        CertSpec(f"kubelet-{node}", f"system:node:{node}", organizations=(NODES_GROUP,), client=True),
        CertSpec(f"kubelet-{node}-serving", f"system:node:{node}", dns_names=(node, "localhost"),
                 ip_addresses=(LOOPBACK_IP,), server=True),
    )


def issue_files(pki: Pki, specs: Sequence[CertSpec], now: dt.datetime | None = None) -> None:
    """Issue more certificates with a run's CA (its files), written as write_pki writes them."""
    now = now or dt.datetime.now(dt.UTC)
    ca = KeyPair(pki.ca_cert.read_bytes(), pki.ca_key.read_bytes())
    for spec in specs:
        pair = issue(ca, spec, now)
        _write(pki.cert(spec.name), pair.cert_pem, 0o644)
        _write(pki.key(spec.name), pair.key_pem, 0o600)
