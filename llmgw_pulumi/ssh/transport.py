"""The one way this package reaches a node: SSH with paramiko.

- Batch mode: public-key authentication only; nothing ever prompts.
- Jump hosts: ``Connection.jump`` lists bastions, outermost first; each one
  authenticates like a node and has its own host-key pin or recorded key. The
  connection to a bastion is pooled like a node's and carries the channels
  (direct-tcpip) to every node behind it.
- Keys: the configured one, then the ssh-agent's (llmgw_pulumi.ssh.keys).
- Waiting: while the node refuses or drops connections (a fresh VM whose
  cloud-init restarts sshd), or refuses every key (its login user is not
  made yet), keep retrying until ``Connection.wait`` seconds have passed, then
  fail with ``cannot reach <user>@<addr> over ssh after <N>s`` and the last
  reason. Where the node has cloud-init, wait (within the same deadline) until
  it reports done, then connect afresh: cloud-init may have replaced the
  host keys, and the key recorded is the one the node keeps.
- Host keys: a pinned key wins; otherwise the key recorded in state on first
  use; otherwise the first key seen is trusted and returned for recording. A
  key that differs from the expected one is refused, naming both fingerprints.
- Root: when the user is not root every script runs under ``sudo -n``; a sudo
  that wants a password, or a user without sudo, is a clear error.
- Reuse: a ``Pool`` (the provider process's ``sessions.Nodes``) keeps one
  connection per (route, user, key), so all resources of one node share one
  SSH handshake per deployment; a connection idle for ``IDLE_SECONDS`` is
  closed by the pool's reaper.

paramiko and socket exceptions are translated here, once, into the package's
errors, each naming the node.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import paramiko

from ..config.specs import Connection
from ..errors import AuthenticationError, HostKeyChangedError, RemoteCommandError, UnreachableError, WaitExpired, host_key_fix
from .connection import CONNECT_TIMEOUT, Session
from .keys import fingerprint, login, same_key

log = logging.getLogger(__name__)

IDLE_SECONDS = 600.0
"""A pooled connection idle this long is closed. Long enough to span the wait between a node's
NodeIdentity and its AgentInstall when the engine queues steps, which grows with the number of nodes
(a limit of a minute had the benchmark connect to many nodes more than once). A provider process ends
with its deployment, and its connections with it: the limit only bounds how long a long deployment keeps
a finished node's connection open."""
POLL_SECONDS = 1.0
"""How long a connection's paramiko thread waits for the node to send something before it looks whether the
connection was closed, and waits again. paramiko's own 0.1 s wakes the thread ten times as often, at a CPU
cost for every open connection and second (`python -m bench.idle_transports` measures it), and the pool keeps
each node's connection open until it has been idle IDLE_SECONDS: in a large `up`, many connection-seconds in
the provider processes. What the node sends wakes the thread at once whatever this is; a
closed connection's thread ends within it."""
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)
"""Back-off between connection attempts while a node refuses; the last value repeats."""


UNREACHABLE_MEMORY = 30.0
"""Seconds a node that could not be reached is reported unreachable at once, without waiting again:
a refresh of a machine that is gone costs one wait, not one per resource."""


class Endpoint(Protocol):
    """An SSH server on the way to a node, or the node: a jump host or a Connection."""

    @property
    def user(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def host_key(self) -> str | None: ...


def _where(end: Endpoint) -> str:
    return f"{end.host}:{end.port}"


def _open(end: Endpoint, key_type: str | None, via: paramiko.Transport | None, node: str) -> paramiko.Transport:
    """TCP (directly, or as a direct-tcpip channel through ``via``) and the SSH key exchange.

    ``key_type``: the type of the expected host key. Only that type is
    negotiated, so a server that also holds keys of other types is checked
    against the key that was pinned or recorded, not against whichever type
    the client happens to prefer.
    """
    sock: socket.socket | paramiko.Channel
    if via is None:
        sock = socket.create_connection((end.host, end.port), timeout=CONNECT_TIMEOUT)
    else:
        sock = via.open_channel("direct-tcpip", (end.host, end.port), ("127.0.0.1", 0), timeout=CONNECT_TIMEOUT)
    try:
        transport = paramiko.Transport(sock)
        sock.settimeout(POLL_SECONDS)  # paramiko set 0.1 s: see POLL_SECONDS
        transport.banner_timeout = CONNECT_TIMEOUT
        transport.handshake_timeout = CONNECT_TIMEOUT
        if key_type:
            # An RSA key (type ssh-rsa) is verified with SHA-2 signatures: OpenSSH 8.8+ offers no SHA-1 ones, and
            # paramiko 5 does not know them (naming "ssh-rsa" here would be its ValueError "unknown cipher").
            transport.get_security_options().key_types = (
                ["rsa-sha2-512", "rsa-sha2-256"] if key_type == "ssh-rsa" else [key_type])
        try:
            transport.start_client(timeout=CONNECT_TIMEOUT)
        except paramiko.IncompatiblePeer:  # type: ignore[attr-defined]
            transport.close()
            raise HostKeyChangedError(
                node, f"{end.host} no longer offers a {key_type} host key, the type that was pinned or recorded; "
                      "refusing to connect", host_key_fix()) from None
        return transport
    except BaseException:
        sock.close()
        raise


def establish(end: Endpoint, conn: Connection, node: str, recorded: str | None, deadline: float,
              via: paramiko.Transport | None = None) -> tuple[paramiko.Transport, str]:
    """An authenticated transport to ``end`` and the host key it presented, retried until ``deadline``.

    ``recorded``: the key recorded when the node was onboarded (a pin on
    ``end`` wins); None trusts the first key seen. Refused connections, broken
    handshakes and refused logins are retried; a changed host key is not.
    """
    expected = end.host_key or recorded
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            transport = _open(end, expected.split()[0] if expected else None, via, node)
            try:
                key = transport.get_remote_server_key()
                presented = f"{key.get_name()} {key.get_base64()}"
                if expected and not same_key(expected, presented):
                    raise HostKeyChangedError(
                        node, f"{end.host} presented host key {fingerprint(presented)}, but {fingerprint(expected)} "
                              f"was {'pinned' if end.host_key else 'recorded when the node was onboarded'}; "
                              "refusing to connect", host_key_fix(key.get_name(), fingerprint(presented)))
                login(transport, end.user, end.host, conn, node)
            except BaseException:
                transport.close()
                raise
            if attempt:
                log.debug("%s: ssh to %s@%s answered after %.0fs", node, end.user, _where(end), time.monotonic() - started)
            return transport, presented
        except (OSError, paramiko.SSHException, EOFError, AuthenticationError) as exc:
            reason = exc.message if isinstance(exc, AuthenticationError) else (str(exc) or type(exc).__name__)
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
            attempt += 1
            if time.monotonic() + delay >= deadline:
                raise WaitExpired(node, f"cannot reach {end.user}@{end.host} over ssh after {conn.wait:.0f}s "
                                        f"(last error: {reason})") from None
            if attempt == 1:  # once per wait: the operator sees that, and why, this node is waited for
                # Ephemeral, in the stack's row: printed once (a node's row would print it again when it is done).
                log.info("%s: waiting up to %.0fs for ssh to %s@%s (%s)", node, conn.wait, end.user, _where(end), reason,
                         extra={"ephemeral": True, "stack_row": True})
            time.sleep(delay)


# --------------------------------------------------------------------------- pooling


@dataclass
class _Pooled:
    transport: paramiko.Transport
    host_key: str
    session: Session | None = None
    last_used: float = field(default_factory=time.monotonic)
    users: int = 0

    @property
    def alive(self) -> bool:
        return self.transport.is_active()


PoolKey = tuple[str, ...]


class Pool:
    """The SSH connections of one provider process (its ``sessions.Nodes``).

    One connection per route (jump hosts and node) and credentials, handed to
    every resource of that node; a jump host's connection carries every node
    behind it. One handshake at a time per route even when resources run
    concurrently; a reaper thread closes node connections idle for
    ``idle_seconds``; a node found unreachable is reported so at once for
    ``unreachable_memory`` seconds instead of being waited for again.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS, unreachable_memory: float = UNREACHABLE_MEMORY) -> None:
        self.idle_seconds = idle_seconds
        self.unreachable_memory = unreachable_memory
        self._entries: dict[PoolKey, _Pooled] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[PoolKey, threading.Lock] = {}
        self._unreachable: dict[PoolKey, tuple[float, str]] = {}
        self._reaper: threading.Thread | None = None

    @staticmethod
    def _route(conn: Connection, hops: int) -> PoolKey:
        """The pool key of the first ``hops`` jump hosts (all of them and the node: ``len(conn.jump) + 1``)."""
        ends: list[Endpoint] = [*conn.jump, conn]
        ends = ends[:hops]
        creds = hashlib.sha256("\0".join((conn.private_key or conn.private_key_path or "", conn.passphrase or ""))
                               .encode()).hexdigest()
        return (*(f"{e.user}@{_where(e)}" for e in ends), creds)

    def _reap(self) -> None:
        while True:
            time.sleep(self.idle_seconds / 4)
            now = time.monotonic()
            with self._lock:
                for key, entry in list(self._entries.items()):
                    # Jump hosts stay while they live: they carry every node behind them.
                    idle = entry.session is not None and entry.users == 0 and now - entry.last_used > self.idle_seconds
                    if idle or not entry.alive:
                        entry.transport.close()
                        del self._entries[key]

    def _checkout(self, key: PoolKey, end: Endpoint, expected: str | None, node: str,
                  open_: Callable[[], tuple[paramiko.Transport, str]]) -> _Pooled:
        """The pooled connection under ``key``, opened with ``open_`` if there is none alive; its host key checked."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="llmgw-ssh-reaper", daemon=True)
                self._reaper.start()
        with lock:  # one handshake per route even when several resources want it at once
            with self._lock:
                entry = self._entries.get(key)
                if entry and not entry.alive:
                    entry.transport.close()
                    del self._entries[key]
                    entry = None
            if entry is None:
                recent = self._unreachable.get(key)
                if recent and time.monotonic() - recent[0] < self.unreachable_memory:
                    raise UnreachableError(node, recent[1])
                try:
                    transport, presented = open_()
                except WaitExpired as exc:
                    self._unreachable[key] = (time.monotonic(), exc.message)
                    raise
                self._unreachable.pop(key, None)
                entry = _Pooled(transport, presented)
                with self._lock:
                    self._entries[key] = entry
            else:
                want = end.host_key or expected
                if want and not same_key(want, entry.host_key):
                    raise HostKeyChangedError(
                        node, f"{end.host} presented host key {fingerprint(entry.host_key)}, but "
                              f"{fingerprint(want)} was expected; refusing to use it",
                        host_key_fix(entry.host_key.split()[0], fingerprint(entry.host_key)))
            with self._lock:
                entry.users += 1
            return entry

    def _release(self, entry: _Pooled) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()

    @contextmanager
    def session(self, conn: Connection, node: str, expected_host_key: str | None = None,
                expected_jump_keys: Mapping[str, str] | None = None) -> Iterator[Session]:
        """A pooled session to the node, through its jump hosts: reuses open connections, or opens them.

        Host keys are checked on every checkout, so a pooled connection is never
        handed to a resource that expects a different machine.
        """
        deadline = time.monotonic() + conn.wait
        recorded_jumps = dict(expected_jump_keys or {})
        held: list[_Pooled] = []
        try:
            via: paramiko.Transport | None = None
            shown: dict[str, str] = {}
            for i, hop in enumerate(conn.jump):
                recorded = recorded_jumps.get(_where(hop))
                entry = self._checkout(self._route(conn, i + 1), hop, recorded, node,
                                       functools.partial(establish, hop, conn, node, recorded, deadline, via))
                held.append(entry)
                via, shown[_where(hop)] = entry.transport, entry.host_key
            key = self._route(conn, len(conn.jump) + 1)
            target = self._checkout(key, conn, expected_host_key, node,
                                    functools.partial(self._open_node, conn, node, expected_host_key, deadline, via))
            held.append(target)
            with self._lock:  # one Session per connection, even when resources of the node check it out at once
                if target.session is None:
                    target.session = Session(target.transport, conn, node, target.host_key, shown)
                checked_out = target.session
            try:
                yield checked_out
            except RemoteCommandError:
                # A broken connection must not be handed out again.
                with self._lock:
                    if self._entries.get(key) is target and not target.alive:
                        del self._entries[key]
                raise
        finally:
            for entry in held:
                self._release(entry)

    @staticmethod
    def _open_node(conn: Connection, node: str, expected: str | None, deadline: float,
                   via: paramiko.Transport | None) -> tuple[paramiko.Transport, str]:
        """The node's transport, once cloud-init (where the node has it) is done; reconnected if it had to wait."""
        transport, presented = establish(conn, conn, node, expected, deadline, via)
        waited = Session(transport, conn, node, presented, {}).cloud_init_done(deadline - time.monotonic())
        if waited:  # cloud-init may have replaced the host keys and restarted sshd: record the key the node keeps
            transport.close()
            transport, presented = establish(conn, conn, node, expected, deadline, via)
        return transport, presented

    def close_all(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.transport.close()
            self._entries.clear()
