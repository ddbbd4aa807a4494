"""The one way this package reaches a node: SSH with paramiko.

- Batch mode: public-key authentication only; nothing ever prompts.
- Jump hosts: ``Connection.jump`` lists bastions, outermost first; each one
  authenticates like a node and has its own host-key pin or recorded key. The
  connection to a bastion is pooled like a node's and carries the channels
  (direct-tcpip) to every node behind it.
- Keys, in the order they are tried (OpenSSH's order for an explicit -i):
  1. the configured key, given inline (the llmgw:sshPrivateKey secret) or by
     path, decrypted with ``Connection.passphrase`` if it is protected;
  2. every key of the ssh-agent at ``$SSH_AUTH_SOCK``, in the agent's order.
  A refusal names every key tried, by fingerprint.
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
- Reuse: a ``Pool`` (the provider process's ``runner.Nodes``) keeps one
  connection per (route, user, key), so all resources of one node share one
  SSH handshake per deployment; a connection idle for ``IDLE_SECONDS`` is
  closed by the pool's reaper.

paramiko and socket exceptions are translated here, once, into the package's
errors, each naming the node.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import paramiko

from .errors import (
    AuthenticationError,
    ConfigError,
    HostKeyChangedError,
    RemoteCommandError,
    SudoUnavailableError,
    UnreachableError,
    WaitExpired,
    host_key_fix,
)
from .remote import Result, Script
from .specs import Connection

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds for one TCP connect and for the SSH banner and key exchange (like ssh -o ConnectTimeout=10)."""
IDLE_SECONDS = 600.0
"""A pooled connection idle this long is closed. Long enough to span the wait between a node's
NodeIdentity and its AgentInstall when the engine queues steps: 22.6 s at 30 nodes on 2 cores, over
60 s for half the nodes at 100 (the benchmark counted 1.28 connections per node with a 60 s limit).
A provider process ends with its deployment, and its connections with it: the limit only bounds how
long a long deployment keeps a finished node's connection open."""
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)
"""Back-off between connection attempts while a node refuses; the last value repeats."""


def fingerprint(host_key: str) -> str:
    """OpenSSH-style SHA256 fingerprint of 'type base64' public key text."""
    key_type, blob = host_key.split()[:2]
    return str(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)).fingerprint)


def same_key(expected: str, presented: str) -> bool:
    """Is ``presented`` ('type base64', as the server sent it) the key ``expected`` (pinned or recorded)?"""
    return expected.split()[:2] == presented.split()[:2]


KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
"""The key types an operator's SSH key may be, in the order paramiko is asked to load it."""


def load_private_key(conn: Connection, node: str) -> paramiko.PKey | None:
    """The configured SSH key (OpenSSH or traditional PEM; ed25519, ECDSA or RSA), loaded by paramiko; None if none is.

    Given inline (the llmgw:sshPrivateKey secret) or read now from its path on
    this machine; a protected key is decrypted with the configured passphrase.
    Errors never quote the key or the passphrase.
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
        return None
    field = "connection.private_key" if conn.private_key else "connection.private_key_path"
    for cls in KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text), password=conn.passphrase)
        except paramiko.PasswordRequiredException:  # asked only when no passphrase was given
            raise ConfigError(node, field, "is protected by a passphrase, and none is configured",
                              "set it as a secret: `pulumi config set --secret llmgw:sshKeyPassphrase`, "
                              "or load the key into ssh-agent") from None
        except (paramiko.SSHException, ValueError, TypeError):
            continue  # another type; or, for an encrypted key, a wrong passphrase
    if conn.passphrase is not None and _encrypted(text):
        raise ConfigError(node, field, "cannot be decrypted with the configured passphrase",
                          "fix the llmgw:sshKeyPassphrase secret")
    raise ConfigError(node, field, "cannot be parsed", "give an OpenSSH or PEM private key (ed25519, ECDSA or RSA)")


def _encrypted(text: str) -> bool:
    """Is this private key protected by a passphrase? (paramiko asks for one when loading it without.)"""
    for cls in KEY_CLASSES:
        try:
            cls.from_private_key(io.StringIO(text))
            return False
        except paramiko.PasswordRequiredException:
            return True
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    return False


def agent_keys() -> list[paramiko.AgentKey]:
    """The keys of the ssh-agent at $SSH_AUTH_SOCK (none when there is no agent)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    try:
        return list(paramiko.Agent().get_keys())
    except (paramiko.SSHException, OSError) as exc:
        log.warning("the ssh-agent at $SSH_AUTH_SOCK did not answer (%s); not using it", exc)
        return []


def login(transport: paramiko.Transport, user: str, host: str, conn: Connection, node: str) -> None:
    """Authenticate with the configured key, then with the agent's keys; name every key tried on refusal."""
    candidates: list[tuple[str, paramiko.PKey]] = []
    key = load_private_key(conn, node)
    if key is not None:
        candidates.append((f"key {conn.private_key_path or 'llmgw:sshPrivateKey'}", key))
    candidates += [("ssh-agent key", k) for k in agent_keys()]
    if not candidates:
        raise ConfigError(node, "connection.private_key_path", "no SSH key is configured and no ssh-agent has one",
                          "set llmgw:ssh.privateKeyPath (or the llmgw:sshPrivateKey secret), or add the key to ssh-agent")
    tried = []
    for label, candidate in candidates:
        try:
            transport.auth_publickey(user, candidate)
            return
        except paramiko.AuthenticationException:
            tried.append(f"{label} {candidate.fingerprint}")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise UnreachableError(node, f"the SSH connection to {user}@{host} broke during login: {exc}") from exc
    raise AuthenticationError(node, f"{user}@{host} refused every key tried: {', '.join(tried)}")


CLOUD_INIT_WAIT = """command -v cloud-init >/dev/null 2>&1 || exit 0
case "$(cloud-init status 2>/dev/null)" in *running*|*"not started"*|*"not run"*) ;; *) exit 0 ;; esac
echo waited
exec cloud-init status --wait >/dev/null"""
"""Where the node has cloud-init and it is not done, wait for it, saying so (its exit: 0 done, 2 done with
recoverable errors, 1 errors)."""


class Session:
    """An authenticated SSH connection to one node, able to run Scripts as root."""

    def __init__(self, transport: paramiko.Transport, conn: Connection, node: str, host_key: str,
                 jump_host_keys: dict[str, str]) -> None:
        self._transport = transport
        self.conn = conn
        self.node = node
        self.host_key = host_key
        """The key the node presented ('type base64'), for recording in state."""
        self.jump_host_keys = jump_host_keys
        """The key each jump host presented, by 'host:port', for recording in state."""
        self.sudo = conn.user != "root"
        self._sudo_checked = not self.sudo

    def _exec(self, command: str, stdin: bytes, timeout: float) -> Result:
        try:
            chan = self._transport.open_session(timeout=CONNECT_TIMEOUT)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteCommandError(self.node, f"the SSH connection to {self.conn.target} broke: {exc}",
                                     "run `pulumi up` again; onboarding resumes where the node is", connection_broke=True) from exc
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
        except TimeoutError:
            raise RemoteCommandError(self.node, f"a command on {self.conn.target} printed nothing for {timeout:.0f}s",
                                     "check the node's load and disk; run `pulumi up` again") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteCommandError(self.node, f"the SSH connection to {self.conn.target} broke: {exc}",
                                     "run `pulumi up` again; onboarding resumes where the node is", connection_broke=True) from exc
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
                    "run `pulumi up` again; onboarding resumes where the node is", connection_broke=True)
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

    def cloud_init_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for cloud-init, where the node has it; True if it had to be waited for."""
        try:
            res = self._exec(CLOUD_INIT_WAIT, b"", max(timeout, 1.0))
        except RemoteCommandError:
            raise WaitExpired(self.node, f"cloud-init on {self.conn.host} did not report done within {self.conn.wait:.0f}s "
                                         "(cloud-init status --wait)") from None
        if res.rc == 1:
            log.warning("%s: cloud-init on %s reports errors (cloud-init status --long); going on", self.node, self.conn.host)
        waited = "waited" in res.stdout.split()
        if waited:
            log.info("%s: waited for cloud-init on %s to finish", self.node, self.conn.host)
        return waited

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
        transport.banner_timeout = CONNECT_TIMEOUT
        transport.handshake_timeout = CONNECT_TIMEOUT
        if key_type:
            # An RSA key is verified with SHA-2 signatures (OpenSSH refuses SHA-1 ones).
            transport.get_security_options().key_types = (
                ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if key_type == "ssh-rsa" else [key_type])
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
                log.info("%s: ssh to %s@%s answered after %.0fs", node, end.user, _where(end), time.monotonic() - started)
            return transport, presented
        except (OSError, paramiko.SSHException, EOFError, AuthenticationError) as exc:
            reason = exc.message if isinstance(exc, AuthenticationError) else (str(exc) or type(exc).__name__)
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
            attempt += 1
            if time.monotonic() + delay >= deadline:
                raise WaitExpired(node, f"cannot reach {end.user}@{end.host} over ssh after {conn.wait:.0f}s "
                                        f"(last error: {reason})") from None
            if attempt == 1:  # once per wait: the operator sees that, and why, this node is waited for
                log.info("%s: waiting up to %.0fs for ssh to %s@%s (%s)", node, conn.wait, end.user, _where(end), reason)
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
    """The SSH connections of one provider process (its ``runner.Nodes``).

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
