"""The cluster's certificate authority, for tests: it stands in for `llmgw ctl cert`.

A PKI dir holds `ca.pem` (the root, 0644) and `ca-key.pem` (its key, 0600), as
`llmgw ctl cert init-ca` makes them. From it this module issues the control
plane's server certificate and a node's client certificate, whose common name
is the node id.

Keys are ECDSA P-256, written as unencrypted PKCS#8 PEM, and a key file is
created 0600 before a byte of the key is written to it.

This file is also baked into the llmgw test double (lab/doubles/llmgw.py), which
runs it for `llmgw ctl cert ...`: it must stay a self-contained module that
imports only the standard library and `cryptography`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"

# Certificates start a little in the past, so a node whose clock is slightly
# behind the operator's still accepts them.
_BACKDATE = datetime.timedelta(minutes=5)


def init_ca(pki_dir: Path, days: int = 3650, cn: str = "llmgw test CA") -> None:
    """Create the cluster CA in `pki_dir`: `ca.pem` (0644) and `ca-key.pem` (0600).

    Refuses to replace an existing CA, because every identity issued from it
    would stop being trusted.
    """
    pki_dir = Path(pki_dir)
    if (pki_dir / CA_KEY).exists() or (pki_dir / CA_CERT).exists():
        raise FileExistsError(f"an authority already exists in {pki_dir}; refusing to replace it")
    pki_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pki_dir / CA_KEY, key)
    _write(pki_dir / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def issue_server_cert(
    pki_dir: Path, out_dir: Path, name: str, ips: list[str], dns: list[str], days: int = 365
) -> tuple[Path, Path]:
    """Issue a serverAuth certificate for `ips` and `dns` names (the SANs).

    Writes `<name>.pem` (0644) and `<name>-key.pem` (0600) into `out_dir` and
    returns their paths. The common name is `name`.
    """
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(d) for d in dns]
    if not sans:
        raise ValueError("a server certificate needs at least one IP address or DNS name")
    return _issue(
        pki_dir, out_dir, name, name, ExtendedKeyUsageOID.SERVER_AUTH, days, x509.SubjectAlternativeName(sans)
    )


def issue_client_cert(pki_dir: Path, out_dir: Path, node_id: str, days: int = 365) -> tuple[Path, Path]:
    """Issue a node's identity: a clientAuth certificate whose common name is `node_id`.

    Writes `<node_id>.pem` (0644) and `<node_id>-key.pem` (0600) into `out_dir`,
    replacing earlier ones, and returns their paths.
    """
    if not node_id or "/" in node_id or node_id.startswith("."):
        raise ValueError(f"not a usable node id: {node_id!r}")
    return _issue(pki_dir, out_dir, node_id, node_id, ExtendedKeyUsageOID.CLIENT_AUTH, days, None)


def _issue(
    pki_dir: Path,
    out_dir: Path,
    file_name: str,
    cn: str,
    usage: x509.ObjectIdentifier,
    days: int,
    sans: x509.SubjectAlternativeName | None,
) -> tuple[Path, Path]:
    ca_cert, ca_key = _load_ca(Path(pki_dir))
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out_dir / f"{file_name}.pem", out_dir / f"{file_name}-key.pem"
    _write_key(key_path, key)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path


def _load_ca(pki_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not (pki_dir / CA_KEY).is_file() or not (pki_dir / CA_CERT).is_file():
        raise FileNotFoundError(f"no authority in {pki_dir}; create one first")
    cert = x509.load_pem_x509_certificate((pki_dir / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((pki_dir / CA_KEY).read_bytes(), password=None)
    return cert, key  # type: ignore[return-value]


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(path, pem, 0o600)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` atomically; the file has `mode` from its creation on."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, mode)  # exact, whatever the umask
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if fd != -1:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
