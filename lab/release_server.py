"""A release server for tests: static files laid out as llmgw releases are.

    <root>/<tag>/llmgw-<tag>-linux-<arch>
    <root>/<tag>/checksums.txt          sha256sum format: "<hex>  <name>"

Run it as a process (the test hosts reach it over the lab network):

    python -m lab.release_server --root DIR --bind IP --port PORT [--cert C --key K] [--delay S]

HTTPS when --cert and --key are given, else HTTP. --port 0 picks a free port.
When ready it prints one line to stdout, `listening on <url>`, and it logs each
request to stderr as `<method> <path> <status>`. --delay sleeps before each
response, for tests of a slow server. Directories are not listed.

`publish_release()` writes a release into a root, optionally one whose served
binary is not the one its checksums.txt lists, and signs its checksums.txt
(`checksums.txt.sig`, `ssh-keygen -Y sign` in the namespace `llmgw-release`)
with a key `make_signing_key()` made at run time. The fixtures a test of the
operator's checks needs are releases like any other:

- a tampered binary with a matching checksums.txt: `publish_release(root, tag,
  {arch: evil})`, signed by a key the stack does not trust, or by none;
- a bad signature: `sign_with` a key other than the stack's `signingKey`, or
  `corrupt_signature()` afterwards;
- a binary that reports another tag: `publish_release(root, "v9.0.0",
  {"amd64": build_llmgw("v1.4.2")})`, whose checksums.txt and signature match.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any


def release_name(tag: str, arch: str) -> str:
    return f"llmgw-{tag}-linux-{arch}"


SIGNATURE_NAMESPACE = "llmgw-release"
"""The namespace llmgw_pulumi.releases.approval verifies checksums.txt's signature in (stated here, not imported)."""


def make_signing_key(directory: Path, name: str = "release-signing") -> tuple[Path, str]:
    """A new ed25519 key for signing releases, made with ssh-keygen: (its private key file, its public line)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True,
                   capture_output=True)
    return key, key.with_suffix(".pub").read_text().strip()


def sign(path: Path, key: Path) -> Path:
    """`path`.sig: the OpenSSH signature of `path` by `key` (`ssh-keygen -Y sign -n llmgw-release`)."""
    sig = path.with_name(path.name + ".sig")
    sig.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, str(path)],
                   check=True, capture_output=True)
    return sig


def corrupt_signature(root: Path, tag: str) -> None:
    """Flip one byte inside the signature blob of `root/<tag>/checksums.txt.sig` (it stays well-formed armour)."""
    sig = Path(root) / tag / "checksums.txt.sig"
    lines = sig.read_text().splitlines()
    middle = len(lines) // 2
    line = lines[middle]
    lines[middle] = line[:10] + ("A" if line[10] != "A" else "B") + line[11:]
    sig.write_text("\n".join(lines) + "\n")


def publish_release(
    root: Path, tag: str, binaries: dict[str, bytes], tamper: dict[str, bytes] | None = None,
    sign_with: Path | None = None,
) -> None:
    """Write `root/<tag>/`: a binary per arch and `checksums.txt` listing their sha256.

    For an arch in `tamper`, the file served holds `tamper[arch]` while
    checksums.txt still lists the sha256 of `binaries[arch]`. With `sign_with`
    (a key from `make_signing_key`), checksums.txt is signed: `checksums.txt.sig`.
    """
    tamper = tamper or {}
    if not set(tamper) <= set(binaries):
        raise ValueError(f"tamper names arches with no binary: {sorted(set(tamper) - set(binaries))}")
    directory = Path(root) / tag
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for arch in sorted(binaries):
        name = release_name(tag, arch)
        (directory / name).write_bytes(tamper.get(arch, binaries[arch]))
        lines.append(f"{hashlib.sha256(binaries[arch]).hexdigest()}  {name}\n")
    (directory / "checksums.txt").write_text("".join(lines))
    (directory / "checksums.txt.sig").unlink(missing_ok=True)
    if sign_with is not None:
        sign(directory / "checksums.txt", sign_with)


@contextmanager
def serving(lab: Any, root: Path, addr: str, port: int, cert: Path | str, key: Path | str, *, delay: float = 0.0,
            log: IO[bytes] | int = subprocess.DEVNULL) -> Iterator[str]:
    """Another release server serving ``root`` over HTTPS, in the netns of the lab's release server (``lab`` is a
    `lab.hosts.Lab`), its request log written to ``log``; yields its base URL and stops it on exit."""
    proc = lab.run_in_netns(
        [sys.executable, "-m", "lab.release_server", "--root", str(root), "--bind", addr, "--port", str(port),
         "--cert", str(cert), "--key", str(key), "--delay", str(delay)],
        netns_suffix="repo", addr_index=2, cwd=str(Path(__file__).resolve().parent.parent), stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        assert proc.stdout is not None
        assert b"listening" in proc.stdout.readline(), "release server did not start"
        yield f"https://{addr}:{port}"
    finally:
        type(lab)._stop_extra(proc)


class _Handler(SimpleHTTPRequestHandler):
    delay = 0.0
    timeout = 30  # a client that stalls does not hold a thread forever

    def send_head(self):  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        return super().send_head()

    def list_directory(self, path):  # type: ignore[no-untyped-def]
        self.send_error(HTTPStatus.NOT_FOUND, "no directory listing")
        return None

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        print(f"{self.command} {self.path} {int(code) if isinstance(code, HTTPStatus) else code}",
              file=sys.stderr, flush=True)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        print(format % args, file=sys.stderr, flush=True)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    """The listen backlog, as a web server's (socketserver's default is 5): with the benchmark's 500 nodes
    fetching while both CPUs are busy, 5 pending connections overflowed and a node's connect failed."""
    ssl_context: ssl.SSLContext | None = None

    def __init__(self, address: tuple[str, int], handler: Callable[..., BaseHTTPRequestHandler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)

    def finish_request(self, request, client_address):  # type: ignore[no-untyped-def]
        # The TLS handshake happens here, in the request's thread, not in accept().
        if self.ssl_context is not None:
            request.settimeout(_Handler.timeout)
            request = self.ssl_context.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        print(f"error: {client_address[0]}: {sys.exc_info()[1]}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.release_server", description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=Path, help="directory of releases")
    parser.add_argument("--bind", required=True, help="address to listen on")
    parser.add_argument("--port", required=True, type=int, help="port (0: any free port)")
    parser.add_argument("--cert", help="server certificate (PEM); with --key, serve HTTPS")
    parser.add_argument("--key", help="its private key (PEM)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each response")
    args = parser.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        parser.error("--cert and --key go together")
    if not args.root.is_dir():
        parser.error(f"no such directory: {args.root}")

    handler = type("Handler", (_Handler,), {"delay": args.delay})
    server = _Server((args.bind, args.port), functools.partial(handler, directory=os.fspath(args.root)))
    scheme = "http"
    if args.cert:
        server.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.ssl_context.load_cert_chain(args.cert, args.key)
        scheme = "https"
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in str(host) else host
    print(f"listening on {scheme}://{host}:{port}/ serving {args.root}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
