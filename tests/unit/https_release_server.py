"""An HTTPS release server in this process, on loopback, with its own private CA (as agent.releaseCa names one),
serving a directory of releases; /to/<url> redirects to <url>."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lab.release_server import _Handler, _Server

NOW = dt.datetime.now(dt.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def tls_pair(d: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server-key.pem): a private CA and a certificate for 127.0.0.1 that it signed."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    start, end = NOW - dt.timedelta(hours=1), NOW + dt.timedelta(days=1)
    ca = (x509.CertificateBuilder().subject_name(_name("release CA")).issuer_name(_name("release CA"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = d / "ca.pem", d / "server.pem", d / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    return paths


class Redirecting(_Handler):
    """The release server, and two paths that redirect: /to/<url> sends the client to <url>."""

    def do_GET(self) -> None:
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", self.path[len("/to/"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


@contextlib.contextmanager
def https_server(base: Path, root: Path) -> Iterator[tuple[str, str]]:
    """(base URL, agent.releaseCa) of an HTTPS server on loopback serving ``root``, its TLS files in ``base``."""
    import ssl

    ca, cert, key = tls_pair(base)
    httpd = _Server(("127.0.0.1", 0), functools.partial(Redirecting, directory=str(root)))
    httpd.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    httpd.ssl_context.load_cert_chain(str(cert), str(key))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}", str(ca)
    finally:
        httpd.shutdown()
        httpd.server_close()
