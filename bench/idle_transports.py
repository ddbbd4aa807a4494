"""What an open, idle SSH connection costs the provider process: paramiko's poll of 0.1 s beside the package's.

    .venv/bin/python -m bench.idle_transports [--connections 300] [--seconds 10]

The pool keeps each node's connection open until it has been idle ``transport.IDLE_SECONDS`` (llmgw_pulumi
.transport), and paramiko's thread for each one wakes every time its socket times out, to see whether the
connection was closed. This opens that many client connections over loopback to a paramiko server in another
process (key exchange and a login each), leaves them idle, and prints the CPU this process spent per connection
and second, first with paramiko's 0.1 s, then with ``transport.POLL_SECONDS``, on the same connections count.
Only loopback is used; the server process ends with the run.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import resource
import socket
import sys
import time
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from llmgw_pulumi.ssh import transport

PARAMIKO_POLL = 0.1
"""paramiko.Transport._active_check_timeout: what each connection's socket timeout is unless changed."""


def _serve(ports: Any) -> None:
    """A paramiko server accepting any login: the other side of every connection, in a process of its own."""
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    host_key = paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))

    class Anyone(paramiko.ServerInterface):
        def get_allowed_auths(self, username: str) -> str:
            return "none"

        def check_auth_none(self, username: str) -> int:
            return paramiko.AUTH_SUCCESSFUL

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    ports.put(listener.getsockname()[1])
    kept = []
    while True:
        sock, _ = listener.accept()
        server = paramiko.Transport(sock)
        sock.settimeout(60.0)  # the server's own polling is not measured: it is another process
        server.add_server_key(host_key)
        server.start_server(server=Anyone())
        kept.append(server)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cost(port: int, connections: int, seconds: float, poll: float) -> float:
    """CPU-s this process spends per connection and second with ``connections`` idle ones polling every ``poll``."""
    opened = []
    try:
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            client = paramiko.Transport(sock)
            sock.settimeout(poll)
            client.start_client(timeout=10)
            client.auth_none("bench")
            opened.append(client)
        time.sleep(1.0)  # the logins' last packets
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds() - cpu0) / (time.monotonic() - wall0) / connections
    finally:
        for client in opened:
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=300, help="idle connections held open (default 300)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long they are measured idle (default 10)")
    args = parser.parse_args(argv)
    ports: Any = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=30)
        costs = {poll: idle_cost(port, args.connections, args.seconds, poll)
                 for poll in (PARAMIKO_POLL, transport.POLL_SECONDS)}
    finally:
        server.kill()
    print(f"{args.connections} idle connections, {args.seconds:g} s each way, CPU of this process:")
    print("| poll s | CPU microseconds per connection-second | CPU-s per 1,000 connections open for 10 minutes |")
    print("|---:|---:|---:|")
    for poll, cost in costs.items():
        print(f"| {poll:g} | {cost * 1e6:.0f} | {cost * 1000 * 600:.1f} |")
    print(f"{transport.POLL_SECONDS:g} s over {PARAMIKO_POLL:g} s: "
          f"{costs[transport.POLL_SECONDS] / costs[PARAMIKO_POLL]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
