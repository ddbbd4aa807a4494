"""An SSH server in this process, on loopback, whose host key the test chooses: it records each login, command,
forwarded channel and connection, so a test sees a refusal come before any of them. tests/unit/conftest.py's
``server`` fixture serves one with new ed25519 keys."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from llmgw_pulumi.config.specs import Connection


def ed25519_pair() -> tuple[paramiko.Ed25519Key, str]:
    """A new ed25519 key as paramiko loads it, and its private half as OpenSSH text."""
    text = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()
    return paramiko.Ed25519Key.from_private_key(io.StringIO(text)), text


def public_text(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


@dataclass
class Server:
    """An SSH server on 127.0.0.1 that accepts one client key and answers every command with exit status 0."""

    host_key: paramiko.PKey
    client_key: paramiko.PKey
    client_text: str
    """The client key's private half, as the operator's side configures it."""
    logins: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    port: int = 0
    refuse_logins: int = 0
    """The first this many logins are refused (a user not made yet), then the client key is accepted."""
    forwards: list[tuple[str, int]] = field(default_factory=list)
    """Where direct-tcpip channels (ssh -J through this server) were opened to; each is carried to that address."""
    _tcpip: dict[int, tuple[str, int]] = field(default_factory=dict)
    printed: Callable[[Server, str], bytes | None] | None = None
    """What a command prints (None: nothing), or None from it: the command never ends; it may change the server,
    as cloud-init replacing the host keys."""
    refused_key_types: tuple[str, ...] = ()
    """Host-key algorithms this server does not offer (e.g. ssh-rsa: RSA with SHA-1 signatures, as OpenSSH 8.8+)."""
    connections: list[paramiko.Transport] = field(default_factory=list)
    """The server's end of every connection made to it, in order."""
    forwards_held: threading.Event | None = None
    """While given and not set, a direct-tcpip channel is not answered (a jump host that hangs)."""

    def serve(self) -> Iterator[Server]:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]

        def accept() -> None:
            while True:
                try:
                    sock, _ = listener.accept()
                except OSError:
                    return
                t = paramiko.Transport(sock, disabled_algorithms={"keys": list(self.refused_key_types)})
                t.add_server_key(self.host_key)
                self.connections.append(t)
                try:
                    t.start_server(server=_Interface(self))
                except (OSError, EOFError, paramiko.SSHException):
                    continue  # a client that hung up in the handshake (one refusing the key types offered)
                threading.Thread(target=self._carry, args=(t,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield self
        finally:
            listener.close()
            for t in self.connections:
                t.close()


    def _carry(self, t: paramiko.Transport) -> None:
        """Carry each direct-tcpip channel the client opens to the address it asked for, both ways."""
        while t.is_active():
            try:
                chan = t.accept(timeout=0.5)
            except (OSError, EOFError, paramiko.SSHException):
                return  # the client went away
            destination = self._tcpip.get(chan.get_id()) if chan is not None else None
            if destination is None:
                continue  # a session channel, answered by check_channel_exec_request
            out = socket.create_connection(destination)

            def pump(read: Callable[[int], bytes], write: Callable[[bytes], object]) -> None:
                with contextlib.suppress(OSError, EOFError):
                    while data := read(65536):
                        write(data)

            threading.Thread(target=pump, args=(chan.recv, out.sendall), daemon=True).start()
            threading.Thread(target=pump, args=(out.recv, chan.sendall), daemon=True).start()


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: Server) -> None:
        self.server = server

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.server.logins.append(username)
        if self.server.refuse_logins:
            self.server.refuse_logins -= 1
            return paramiko.AUTH_FAILED
        same = key.get_base64() == self.server.client_key.get_base64()
        return paramiko.AUTH_SUCCESSFUL if same else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.server.forwards.append(destination)
        if self.server.forwards_held is not None:
            self.server.forwards_held.wait(120)
        self.server._tcpip[chanid] = destination
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.server.commands.append(command.decode())
        printed = self.server.printed(self.server, command.decode()) if self.server.printed else b""

        def answer() -> None:
            # The client sends its end of input only once its exec request was answered: reply after that.
            while channel.recv(65536):
                pass
            if printed is None:
                return  # a command that never ends
            channel.sendall(printed)
            channel.send_exit_status(0)
            channel.shutdown_write()
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


def connection(srv: Server, pin: str | None = None) -> Connection:
    return Connection.from_props({"host": "127.0.0.1", "port": srv.port, "user": "deploy", "wait": 5.0,
                                  "private_key": srv.client_text, "host_key": pin}, "gpu-01")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
