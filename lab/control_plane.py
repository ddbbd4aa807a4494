"""A control plane for tests: the server side of the llmgw double's stream.

It runs in the test process, one thread accepting and one thread per stream.
Mutual TLS with the cluster CA: its server certificate is issued from the PKI
dir for the address it binds, and it requires a client certificate signed by
the same CA. Then the line protocol of lab/doubles/llmgw.py:

    agent: HELLO <node id>    server: OK | REFUSED <reason>
    agent: PING               server: PONG        (every 2 s while connected)

It refuses a stream whose node id differs from its certificate's common name
(`REFUSED cn-mismatch`), and a standby refuses every stream (`REFUSED standby`).

`llmgw ctl nodes` asks it, over the same mutual TLS (any client certificate of
the cluster CA), which nodes it has:

    ctl: NODES                server: NODE <node id>   (one line per node with an accepted stream open now)
                              server: END

Every outcome is recorded in `events`, refusals and listings included, for tests to assert on.

With `netns=` (a lab netns, e.g. `Lab.add_netns("cp", 3, segment="private")`) its
listening socket is made in that network namespace while its threads stay here:
hosts on the lab's private segment reach it, the root namespace does not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from lab import pki
from lab.hosts import entered_netns

HELLO_TIMEOUT = 10.0
# The agent pings every 2 s; a stream silent for this long is dead.
IDLE_TIMEOUT = 10.0


class Event(NamedTuple):
    """One thing that happened to a stream.

    outcome is one of: "accepted", "refused cn-mismatch", "refused standby",
    "closed" (an accepted stream ended), "listed <n>" (`ctl nodes` got the n nodes connected then; node_id None,
    cn the asker's), "tls-failed <reason>", "protocol-error <what>".
    node_id and cn are None when not known yet.
    """

    time: float
    node_id: str | None
    cn: str | None
    outcome: str


class ControlPlane:
    """A control plane listening on `host:port` (port 0: any free port), in network namespace `netns` if given."""

    def __init__(self, pki_dir: Path, host: str, port: int = 0, standby: bool = False, netns: str | None = None,
                 server_cert: Callable[[Path, list[str], list[str]], tuple[Path, Path]] | None = None) -> None:
        """``server_cert(out_dir, ips, dns)``: makes the server's certificate and key (default: issued from pki_dir's
        ca-key.pem; a CA whose key is in a token signs through it, lab.hsm)."""
        self.pki_dir = Path(pki_dir)
        self._server_cert = server_cert
        self.host = host
        self.port = port
        self.netns = netns
        # May be changed while running: it applies to the next HELLO.
        self.standby = standby
        self.events: list[Event] = []
        self._lock = threading.Condition()
        self._streams: dict[ssl.SSLSocket, str] = {}  # accepted stream -> node id
        self._open: set[socket.socket] = set()  # every socket a thread is serving
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._cert_dir: Path | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> ControlPlane:
        self._cert_dir = Path(tempfile.mkdtemp(prefix="llmgw-control-plane-"))
        try:
            ipaddress.ip_address(self.host)
            ips, dns = [self.host], []
        except ValueError:
            ips, dns = [], [self.host]
        if self._server_cert is not None:
            cert, key = self._server_cert(self._cert_dir, ips, dns)
        else:
            cert, key = pki.issue_server_cert(self.pki_dir, self._cert_dir, "control-plane", ips, dns)
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.verify_mode = ssl.CERT_REQUIRED
        self._context.load_verify_locations(self.pki_dir / pki.CA_CERT)
        self._context.load_cert_chain(cert, key)

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with entered_netns(self.netns) if self.netns else contextlib.nullcontext():
            self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, self.port))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Close the listener and every stream, and wait for the threads."""
        self._stopping.set()
        with self._lock:
            for sock in self._open:
                _shutdown(sock)
        for thread in list(self._threads):
            thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._cert_dir is not None:
            shutil.rmtree(self._cert_dir, ignore_errors=True)
            self._cert_dir = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def connected(self) -> set[str]:
        """Node ids with an accepted stream open right now."""
        with self._lock:
            return set(self._streams.values())

    def wait_for(self, node_ids: Iterable[str], timeout: float) -> bool:
        """Wait until every one of `node_ids` is connected; False on timeout."""
        wanted = {node_ids} if isinstance(node_ids, str) else set(node_ids)
        with self._lock:
            return self._lock.wait_for(lambda: wanted <= set(self._streams.values()), timeout)

    def wait_for_event(self, predicate: Callable[[Event], bool], timeout: float) -> Event | None:
        """The first event (past or future) matching `predicate`; None on timeout."""
        def find() -> Event | None:
            return next((e for e in self.events if predicate(e)), None)

        with self._lock:
            self._lock.wait_for(lambda: find() is not None, timeout)
            return find()

    # ------------------------------------------------------------------ internals

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"control-plane-{self.port}")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _record(self, node_id: str | None, cn: str | None, outcome: str) -> None:
        with self._lock:
            self.events.append(Event(time.time(), node_id, cn, outcome))
            self._lock.notify_all()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        """One connection: the TLS handshake, then the stream, then the bookkeeping."""
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                return
            self._open.add(sock)
        sock.settimeout(HELLO_TIMEOUT)
        try:
            conn = self._context.wrap_socket(sock, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self._record(None, None, f"tls-failed {getattr(exc, 'reason', None) or exc}")
            with self._lock:
                self._open.discard(sock)
            sock.close()
            return
        with self._lock:  # the SSLSocket replaced sock, which is now detached
            self._open.discard(sock)
            self._open.add(conn)
        cn = _common_name(conn.getpeercert())
        try:
            if not self._stopping.is_set():
                self._stream(conn, cn)
        except (OSError, ssl.SSLError):
            pass  # the stream ended
        finally:
            with self._lock:
                node_id = self._streams.pop(conn, None)
                self._open.discard(conn)
            conn.close()
            if node_id is not None:
                self._record(node_id, cn, "closed")

    def _stream(self, conn: ssl.SSLSocket, cn: str | None) -> None:
        with conn.makefile("rb") as reader:
            hello = reader.readline(256).decode(errors="replace").strip()
            if hello == "NODES":
                self._list(conn, cn)
                return
            if not hello.startswith("HELLO ") or not hello[6:]:
                self._record(None, cn, f"protocol-error expected HELLO, got {hello!r}")
                return
            node_id = hello[6:]
            if node_id != cn:
                self._refuse(conn, node_id, cn, "cn-mismatch")
                return
            if self.standby:
                self._refuse(conn, node_id, cn, "standby")
                return
            conn.sendall(b"OK\n")
            with self._lock:
                self._streams[conn] = node_id
            self._record(node_id, cn, "accepted")
            conn.settimeout(IDLE_TIMEOUT)
            while (line := reader.readline(256)) == b"PING\n":
                conn.sendall(b"PONG\n")
            if line:
                self._record(node_id, cn, f"protocol-error got {line!r}")

    def _list(self, conn: ssl.SSLSocket, cn: str | None) -> None:
        """`ctl nodes`: the nodes with an accepted stream open now, one line each, then END."""
        nodes = sorted(self.connected())
        conn.sendall("".join(f"NODE {node}\n" for node in nodes).encode() + b"END\n")
        self._record(None, cn, f"listed {len(nodes)}")

    def _refuse(self, conn: ssl.SSLSocket, node_id: str, cn: str | None, reason: str) -> None:
        self._record(node_id, cn, f"refused {reason}")
        try:
            conn.sendall(f"REFUSED {reason}\n".encode())
        except OSError:
            pass


def _common_name(peercert: dict[str, Any] | None) -> str | None:
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _shutdown(sock: socket.socket) -> None:
    """Wake a thread blocked reading `sock`, without touching its TLS state."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
