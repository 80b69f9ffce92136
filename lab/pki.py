"""The lab cluster's certificates, service-account keys and kubeconfigs, generated locally with `cryptography`.

One CA signs the API server's serving certificate and one client certificate per identity. Identities follow what
kubeadm gives a real cluster (system:kube-controller-manager, system:kube-scheduler, an admin in system:masters), so
RBAC decides for them exactly as on a real control plane. kwok and the device-plugin double stand in for kubelets and
device plugins on hundreds of simulated nodes; they get a lab identity in system:masters and are named as such.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from _common import write_if_changed

VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclasses.dataclass(frozen=True)
class Identity:
    file_stem: str
    common_name: str
    groups: tuple[str, ...]


CLIENT_IDENTITIES = (
    Identity("admin", "gpu-lab-admin", ("system:masters",)),
    Identity("controller-manager", "system:kube-controller-manager", ()),
    Identity("scheduler", "system:kube-scheduler", ()),
    Identity("kwok", "gpu-lab:kwok", ("system:masters",)),
    Identity("device-plugin-double", "gpu-lab:device-plugin-double", ("system:masters",)),
    Identity("dra-driver-double", "gpu-lab:dra-driver-double", ("system:masters",)),
    Identity("controller-runner", "gpu-lab:controller-runner", ("system:masters",)),
)


def apiserver_sans(service_cidr: str) -> tuple[list[str], list[str]]:
    """DNS names and IPs the API server answers to: loopback and the in-cluster `kubernetes` Service."""
    first_service_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"]
    return names, ["127.0.0.1", first_service_ip]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5)).not_valid_after(_now() + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, common_name: str, *,
          groups: tuple[str, ...] = (), server_names: tuple[list[str], list[str]] | None = None,
          not_after: datetime.datetime | None = None,
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by the CA, valid for VALIDITY from now unless not_after says otherwise (tests issue
    expired ones: then it starts a day before it ends)."""
    key = _key()
    not_after = not_after or _now() + VALIDITY
    not_before = min(_now() - datetime.timedelta(minutes=5), not_after - datetime.timedelta(days=1))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, groups)).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server_names:
        names, ips = server_names
        sans = [x509.DNSName(name) for name in names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def kubeconfig(cluster: str, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    """A kubeconfig with everything inline, so it can be copied anywhere (CI artefacts, another shell)."""
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": cluster, "preferences": {},
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem),
                                          "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
    }
    return yaml.safe_dump(document, sort_keys=False)


def needs_renewal(cert_path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return True
    return cert.not_valid_after_utc - _now() < RENEW_BEFORE


def ensure_pki(pki_dir: Path, *, cluster: str, server: str, service_cidr: str) -> dict[str, Path]:
    """Create (or keep) every key, certificate and kubeconfig; return kubeconfig paths by identity.

    Kept when present and valid for another month, so a warm `up` reuses them and clients keep working.
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    pki_dir.chmod(0o700)
    ca_key_path, ca_cert_path = pki_dir / "ca.key", pki_dir / "ca.crt"
    fresh_ca = needs_renewal(ca_cert_path) or not ca_key_path.is_file()
    if fresh_ca:
        ca_key, ca_cert = make_ca(f"{cluster}-ca")
        write_if_changed(ca_key_path, _pem_key(ca_key), 0o600)
        write_if_changed(ca_cert_path, _pem_cert(ca_cert))
    else:
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_pem = _pem_cert(ca_cert)

    server_cert = pki_dir / "apiserver.crt"
    if fresh_ca or needs_renewal(server_cert):
        key, cert = issue(ca_key, ca_cert, "kube-apiserver", server_names=apiserver_sans(service_cidr))
        write_if_changed(pki_dir / "apiserver.key", _pem_key(key), 0o600)
        write_if_changed(server_cert, _pem_cert(cert))

    if fresh_ca or not (pki_dir / "sa.key").is_file():
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_if_changed(pki_dir / "sa.key", _pem_key(sa_key), 0o600)
        write_if_changed(pki_dir / "sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    kubeconfigs = {}
    for identity in CLIENT_IDENTITIES:
        cert_path = pki_dir / f"{identity.file_stem}.crt"
        config_path = pki_dir / f"{identity.file_stem}.kubeconfig"
        key_path = pki_dir / f"{identity.file_stem}.key"
        if fresh_ca or needs_renewal(cert_path) or not key_path.is_file():
            key, cert = issue(ca_key, ca_cert, identity.common_name, groups=identity.groups)
            write_if_changed(key_path, _pem_key(key), 0o600)
            write_if_changed(cert_path, _pem_cert(cert))
        # Rendered every time (unchanged files are not rewritten) so a new port in lab.yml reaches every client.
        write_if_changed(config_path, kubeconfig(cluster, server, ca_pem, cert_path.read_bytes(), key_path.read_bytes(),
                                                 identity.common_name), 0o600)
        kubeconfigs[identity.file_stem] = config_path
    return kubeconfigs
