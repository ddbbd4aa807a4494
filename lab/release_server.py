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
binary is not the one its checksums.txt lists.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def release_name(tag: str, arch: str) -> str:
    return f"llmgw-{tag}-linux-{arch}"


def publish_release(
    root: Path, tag: str, binaries: dict[str, bytes], tamper: dict[str, bytes] | None = None
) -> None:
    """Write `root/<tag>/`: a binary per arch and `checksums.txt` listing their sha256.

    For an arch in `tamper`, the file served holds `tamper[arch]` while
    checksums.txt still lists the sha256 of `binaries[arch]`.
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
