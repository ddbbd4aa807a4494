"""The one way this package reaches a node: SSH with paramiko.

- Batch mode: public-key authentication only; nothing ever prompts.
- Waiting: while the node refuses or drops connections (a fresh VM whose
  cloud-init restarts sshd), keep retrying until ``Connection.wait`` seconds
  have passed, then fail with ``cannot reach <user>@<addr> over ssh after <N>s``.
- Host keys: a pinned key wins; otherwise the key recorded in state on first
  use; otherwise the first key seen is trusted and returned for recording. A
  key that differs from the expected one is refused, naming both fingerprints.
- Root: when the user is not root every script runs under ``sudo -n``; a sudo
  that wants a password, or a user without sudo, is a clear error.
- Reuse: a ``Pool`` (the provider process's ``runner.Nodes``) keeps one
  connection per (address, port, user, key), so all resources of one node
  share one SSH handshake per deployment; a connection idle for
  ``IDLE_SECONDS`` is closed by the pool's reaper.

paramiko and socket exceptions are translated here, once, into the package's
errors, each naming the node.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import paramiko

from .errors import (
    AuthenticationError,
    ConfigError,
    HostKeyChangedError,
    RemoteCommandError,
    SudoUnavailableError,
    UnreachableError,
)
from .remote import Script
from .runner import Result
from .specs import Connection

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds for one TCP connect and for the SSH banner and key exchange (like ssh -o ConnectTimeout=10)."""
IDLE_SECONDS = 60.0
"""A pooled connection idle this long is closed. Long enough to span the wait between a node's
NodeIdentity and its AgentInstall when the engine queues steps (seen: 22.6 s at 30 nodes on 2 cores)."""
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)
"""Back-off between connection attempts while a node refuses; the last value repeats."""


def fingerprint(host_key: str) -> str:
    """OpenSSH-style SHA256 fingerprint of 'type base64' public key text."""
    key_type, blob = host_key.split()[:2]
    return str(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)).fingerprint)


KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
"""The key types an operator's SSH key may be, in the order paramiko is asked to load it."""


def load_private_key(conn: Connection, node: str) -> paramiko.PKey:
    """The operator's SSH key (OpenSSH or traditional PEM; ed25519, ECDSA or RSA), loaded by paramiko.

    Given inline (the llmgw:sshPrivateKey secret) or read now from its path on
    this machine. Errors never quote the key.
    """
    text = conn.private_key
    if not text and conn.private_key_path:
        try:
            with open(conn.private_key_path) as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(node, "connection.private_key_path", f"cannot read {conn.private_key_path}: {exc.strerror}",
                              "run Pulumi where the operator's SSH key is, or fix llmgw:ssh.privateKeyPath") from None
    if not text:
        raise ConfigError(node, "connection.private_key", "is not available on this machine",
                          "set llmgw:ssh.privateKeyPath to a readable key, or the llmgw:sshPrivateKey secret")
    for cls in KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text))
        except paramiko.PasswordRequiredException:
            break
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    raise ConfigError(node, "connection.private_key", "cannot be parsed (or is passphrase-protected)",
                      "give an unencrypted OpenSSH or PEM private key (ed25519, ECDSA or RSA)")


class Session:
    """An authenticated SSH connection to one node, able to run Scripts as root."""

    def __init__(self, transport: paramiko.Transport, conn: Connection, node: str, host_key: str) -> None:
        self._transport = transport
        self.conn = conn
        self.node = node
        self.host_key = host_key
        """The key the node presented ('type base64'), for recording in state."""
        self.sudo = conn.user != "root"
        self._sudo_checked = not self.sudo

    @property
    def alive(self) -> bool:
        return self._transport.is_active()

    def close(self) -> None:
        self._transport.close()

    def _exec(self, command: str, stdin: bytes, timeout: float) -> Result:
        try:
            chan = self._transport.open_session(timeout=CONNECT_TIMEOUT)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteCommandError(self.node, f"the SSH connection to {self.conn.target} broke: {exc}",
                                     "run `pulumi up` again; onboarding resumes where the node is") from exc
        chan.settimeout(timeout)  # an inactivity timeout: no output for this long
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(command)
            # stdin is fed, and stderr drained, by helper threads while this one
            # reads stdout: a large payload can never deadlock against a full
            # output window.
            helpers = [
                threading.Thread(target=_feed, args=(chan, stdin), daemon=True),
                threading.Thread(target=_drain, args=(chan.recv_stderr, err, True), daemon=True),
            ]
            for t in helpers:
                t.start()
            _drain(chan.recv, out)
            rc = chan.recv_exit_status()
            for t in helpers:
                t.join(timeout=5)
        except socket.timeout:
            raise RemoteCommandError(self.node, f"a command on {self.conn.target} printed nothing for {timeout:.0f}s",
                                     "check the node's load and disk; run `pulumi up` again") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteCommandError(self.node, f"the SSH connection to {self.conn.target} broke: {exc}",
                                     "run `pulumi up` again; onboarding resumes where the node is") from exc
        finally:
            chan.close()
        if rc == -1:
            # paramiko's value when the channel closed without an exit status:
            # the connection died (sshd killed, the node rebooting), or the
            # command was killed by a signal. Either way it may have stopped
            # half-way; the scripts undo or finish their change on the node.
            if not self._transport.is_active():
                raise RemoteCommandError(
                    self.node, f"the SSH connection to {self.conn.target} broke while a command was running",
                    "run `pulumi up` again; onboarding resumes where the node is")
            raise RemoteCommandError(
                self.node, f"a command on {self.conn.target} was killed before it finished (no exit status)",
                "check the node's journal for what killed it (OOM killer, shutdown); run `pulumi up` again")
        return Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def _check_sudo(self) -> None:
        if self._sudo_checked:
            return
        res = self._exec("sudo -n true", b"", 30)
        if res.rc != 0:
            why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit status {res.rc}"
            if "password is required" in why:
                raise SudoUnavailableError(self.node, f"sudo asks {self.conn.user} for a password on {self.conn.host} ({why})")
            raise SudoUnavailableError(self.node, f"{self.conn.user} cannot use sudo on {self.conn.host} ({why})")
        self._sudo_checked = True

    def run(self, script: Script, timeout: float = 900) -> Result:
        """Run a script as root. Returns its result whatever its exit status."""
        self._check_sudo()
        return self._exec(script.command(self.sudo), script.stdin, timeout)


def _drain(recv: Callable[[int], bytes], buf: bytearray, quiet: bool = False) -> None:
    """Append everything ``recv`` returns to ``buf`` until EOF. ``quiet``: a helper thread, whose errors the reader reports."""
    try:
        while chunk := recv(65536):
            buf += chunk
    except (OSError, paramiko.SSHException, EOFError):  # socket.timeout is an OSError
        if not quiet:
            raise


def _feed(chan: paramiko.Channel, data: bytes) -> None:
    try:
        if data:
            chan.sendall(data)
        chan.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError):
        pass  # the reader reports the broken channel


UNREACHABLE_MEMORY = 30.0
"""Seconds a node that could not be reached is reported unreachable at once, without waiting again:
a refresh of a machine that is gone costs one wait, not one per resource."""


class WaitExpired(UnreachableError):
    """The node did not answer SSH within its wait: remembered by the pool, so it is not waited for again at once."""


def _handshake(conn: Connection, node: str, key_type: str | None) -> paramiko.Transport:
    """TCP connect + SSH key exchange, retried until the wait deadline.

    ``key_type``: the type of the expected host key. Only that type is
    negotiated, so a server that also holds keys of other types is checked
    against the key that was pinned or recorded, not against whichever type
    the client happens to prefer.
    """
    started = time.monotonic()
    deadline = started + conn.wait
    attempt = 0
    while True:
        sock = None
        try:
            sock = socket.create_connection((conn.host, conn.port), timeout=CONNECT_TIMEOUT)
            transport = paramiko.Transport(sock)
            transport.banner_timeout = CONNECT_TIMEOUT
            transport.handshake_timeout = CONNECT_TIMEOUT
            if key_type:
                # An RSA key is verified with SHA-2 signatures (OpenSSH refuses SHA-1 ones).
                transport.get_security_options().key_types = (
                    ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if key_type == "ssh-rsa" else [key_type])
            try:
                transport.start_client(timeout=CONNECT_TIMEOUT)
            except paramiko.IncompatiblePeer:
                transport.close()
                raise HostKeyChangedError(
                    node, f"{conn.host} no longer offers a {key_type} host key, the type that was pinned or recorded; "
                          "refusing to connect") from None
            if attempt:
                log.info("%s: ssh to %s answered after %.0fs", node, conn.target, time.monotonic() - started)
            return transport
        except (OSError, paramiko.SSHException, EOFError) as exc:
            if sock is not None:
                sock.close()
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
            attempt += 1
            if time.monotonic() + delay >= deadline:
                message = f"cannot reach {conn.user}@{conn.host} over ssh after {conn.wait:.0f}s (last error: {exc or type(exc).__name__})"
                raise WaitExpired(node, message) from None
            if attempt == 1:  # once per wait: the operator sees that, and why, this node is waited for
                log.info("%s: waiting up to %.0fs for ssh to %s (%s)", node, conn.wait, conn.target, exc or type(exc).__name__)
            time.sleep(delay)


def connect(conn: Connection, node: str, expected_host_key: str | None) -> Session:
    """A new authenticated session. ``expected_host_key``: pinned or recorded key, or None to trust on first use."""
    expected = conn.host_key or expected_host_key
    transport = _handshake(conn, node, expected.split()[0] if expected else None)
    try:
        key = transport.get_remote_server_key()
        presented = f"{key.get_name()} {key.get_base64()}"
        if expected and expected.split()[:2] != presented.split()[:2]:
            raise HostKeyChangedError(
                node,
                f"{conn.host} presented host key {fingerprint(presented)}, but {fingerprint(expected)} "
                f"was {'pinned' if conn.host_key else 'recorded when the node was onboarded'}; refusing to connect",
            )
        pkey = load_private_key(conn, node)
        try:
            transport.auth_publickey(conn.user, pkey)
        except paramiko.AuthenticationException:
            raise AuthenticationError(node, f"{conn.user}@{conn.host} refused the SSH key {pkey.fingerprint}") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise UnreachableError(node, f"the SSH connection to {conn.user}@{conn.host} broke during login: {exc}") from exc
        return Session(transport, conn, node, presented)
    except BaseException:
        transport.close()
        raise


# --------------------------------------------------------------------------- pooling


@dataclass
class _Pooled:
    session: Session
    last_used: float
    users: int = 0


PoolKey = tuple[str, int, str, str]


class Pool:
    """The SSH connections of one provider process (its ``runner.Nodes``).

    One connection per (address, port, user, key), handed to every resource
    of that node; one handshake at a time per node even when its resources run
    concurrently; a reaper thread closes connections idle for
    ``idle_seconds``; a node found unreachable is reported so at once for
    ``unreachable_memory`` seconds instead of being waited for again.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS, unreachable_memory: float = UNREACHABLE_MEMORY) -> None:
        self.idle_seconds = idle_seconds
        self.unreachable_memory = unreachable_memory
        self._entries: dict[PoolKey, _Pooled] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[PoolKey, threading.Lock] = {}
        self._unreachable: dict[tuple[str, int], tuple[float, str]] = {}
        self._reaper: threading.Thread | None = None

    @staticmethod
    def _key(conn: Connection) -> PoolKey:
        return (conn.host, conn.port, conn.user,
                hashlib.sha256((conn.private_key or conn.private_key_path or "").encode()).hexdigest())

    def _reap(self) -> None:
        while True:
            time.sleep(self.idle_seconds / 4)
            now = time.monotonic()
            with self._lock:
                for key, entry in list(self._entries.items()):
                    if entry.users == 0 and (now - entry.last_used > self.idle_seconds or not entry.session.alive):
                        entry.session.close()
                        del self._entries[key]

    def _connect(self, conn: Connection, node: str, expected_host_key: str | None) -> Session:
        where = (conn.host, conn.port)
        recent = self._unreachable.get(where)
        if recent and time.monotonic() - recent[0] < self.unreachable_memory:
            raise UnreachableError(node, recent[1])
        try:
            opened = connect(conn, node, expected_host_key)
        except WaitExpired as exc:
            self._unreachable[where] = (time.monotonic(), exc.message)
            raise
        self._unreachable.pop(where, None)
        return opened

    @contextmanager
    def session(self, conn: Connection, node: str, expected_host_key: str | None = None) -> Iterator[Session]:
        """A pooled session: reuses the node's open connection, or opens one.

        The host key is checked on every checkout, so a pooled connection is never
        handed to a resource that expects a different machine.
        """
        key = self._key(conn)
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="llmgw-ssh-reaper", daemon=True)
                self._reaper.start()
        with lock:  # one handshake per node even when its resources run concurrently
            with self._lock:
                entry = self._entries.get(key)
                if entry and not entry.session.alive:
                    entry.session.close()
                    del self._entries[key]
                    entry = None
            if entry is None:
                entry = _Pooled(self._connect(conn, node, expected_host_key), time.monotonic())
                with self._lock:
                    self._entries[key] = entry
            else:
                expected = conn.host_key or expected_host_key
                if expected and expected.split()[:2] != entry.session.host_key.split()[:2]:
                    raise HostKeyChangedError(
                        node, f"{conn.host} presented host key {fingerprint(entry.session.host_key)}, but "
                              f"{fingerprint(expected)} was expected; refusing to use it")
            with self._lock:
                entry.users += 1
        try:
            yield entry.session
        except RemoteCommandError:
            # A broken connection must not be handed out again.
            with self._lock:
                if self._entries.get(key) is entry and not entry.session.alive:
                    del self._entries[key]
            raise
        finally:
            with self._lock:
                entry.users -= 1
                entry.last_used = time.monotonic()

    def close_all(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.session.close()
            self._entries.clear()
