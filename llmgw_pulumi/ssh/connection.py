"""An authenticated SSH connection to one node, running scripts as root (``sudo -n`` for another user).

llmgw_pulumi.ssh.transport makes and pools these; a ``Session`` is the ``sessions.Runner`` a provider runs scripts in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import paramiko

from ..config.specs import Connection
from ..errors import RemoteCommandError, SudoUnavailableError, WaitExpired
from ..nodestate.commands import Result, Script

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds for one TCP connect and for the SSH banner and key exchange (like ssh -o ConnectTimeout=10)."""


OUTPUT_LIMIT = 16 << 20
"""The most a command may print on stdout, and on stderr, in bytes (16 MiB): the package's scripts print far less,
so a node that prints more is refused, rather than held in memory without end."""


NO_INPUT = Script("")
"""The stdin of a command that reads none."""
CLOUD_INIT_WAIT = """command -v cloud-init >/dev/null 2>&1 || exit 0
case "$(cloud-init status 2>/dev/null)" in *running*|*"not started"*|*"not run"*) ;; *) exit 0 ;; esac
echo waited
exec cloud-init status --wait >/dev/null"""
"""Where the node has cloud-init and it is not done, wait for it, saying so (its exit: 0 done, 2 done with
recoverable errors, 1 errors)."""


def reads_its_input_to_the_end(command: str) -> str:
    """``command`` (a line for the login shell), then its input read to the end, with its exit status kept.

    The end of our input must reach sshd before the channel closes. paramiko builds the end-of-input message
    under the channel's lock and sends it after releasing it; a command that exits without reading its input
    (most take none) lets sshd close the channel in that gap, paramiko answers the close, and the end of input
    then names a channel sshd has freed: sshd drops the whole connection ("ieof packet referred to nonexistent
    channel"), and the node's next step over the pooled connection fails with "Unable to open channel". Seen
    once in a 1,000-node benchmark (load 56 on 2 CPUs). Reading to the end first means sshd has the end of input
    before the command can exit. The command runs in a subshell so that an ``exec`` in it cannot skip the read.
    """
    return f"(\n{command}\n); rc=$?; cat >/dev/null; exit $rc"


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

    def _exec(self, command: str, stdin: Script, timeout: float) -> Result:
        """Run ``command`` with ``stdin``'s stdin (its file streamed, then its bytes)."""
        command = reads_its_input_to_the_end(command)
        try:
            chan = self._transport.open_session(timeout=CONNECT_TIMEOUT)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteCommandError(self.node, f"the SSH connection to {self.conn.target} broke: {exc}",
                                     "run `pulumi up` again; onboarding resumes where the node is", connection_broke=True) from exc
        chan.settimeout(timeout)  # an inactivity timeout: no output for this long
        out, err = bytearray(), bytearray()
        too_much: list[str] = []

        def drain_stderr() -> None:
            if not _drain(chan.recv_stderr, err, True):
                too_much.append("stderr")
                chan.close()  # the command is stopped; the reader of stdout sees its end

        try:
            chan.exec_command(command)
            # stdin is fed, and stderr drained, by helper threads while this one
            # reads stdout: a large payload can never deadlock against a full
            # output window.
            helpers = [
                threading.Thread(target=_feed, args=(chan, stdin), daemon=True),
                threading.Thread(target=drain_stderr, daemon=True),
            ]
            for t in helpers:
                t.start()
            if not _drain(chan.recv, out):
                too_much.append("stdout")
                chan.close()
            rc = chan.recv_exit_status()
            for t in helpers:
                t.join(timeout=5)
            if too_much:
                raise RemoteCommandError(
                    self.node, f"a command on {self.conn.target} printed more than {OUTPUT_LIMIT >> 20} MiB on "
                    f"{too_much[0]}; it was stopped and its output dropped",
                    "the package's scripts print far less: check what the login shell and the profile scripts of "
                    f"{self.conn.user} print on the node, then run `pulumi up` again")
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
        """Raise SudoUnavailableError, naming sudo's own complaint, unless ``sudo -n`` runs a command here."""
        res = self._exec("sudo -n true", NO_INPUT, 30)
        if res.rc != 0:
            why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit status {res.rc}"
            if "password is required" in why:
                raise SudoUnavailableError(self.node, f"sudo asks {self.conn.user} for a password on {self.conn.host} ({why})")
            raise SudoUnavailableError(self.node, f"{self.conn.user} cannot use sudo on {self.conn.host} ({why})")

    def cloud_init_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for cloud-init, where the node has it; True if it had to be waited for."""
        try:
            res = self._exec(CLOUD_INIT_WAIT, NO_INPUT, max(timeout, 1.0))
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
        """Run a script as root. Returns its result whatever its exit status. How long it took, from the
        command sent to its exit status back (a round trip and the script's time on the node), is a debug line:
        the benchmark's breakdown reads it from the event log (bench/measure.py, ``SCRIPT_TIME``).

        A user other than root runs it under ``sudo -n``, not asked first whether sudo works: that would be
        a command and a round trip more for every connection. A script that exits 0 answers it; when the first
        one to fail does, ``sudo -n true`` tells a sudo that refused (SudoUnavailableError: a refused sudo ran
        nothing of the script) from a script that failed.
        """
        started = time.monotonic()
        result = self._exec(script.command(self.sudo), script, timeout)
        log.debug("%s: %s took %.3fs on %s (exit %d)", self.node, script.name or "a script",
                  time.monotonic() - started, self.conn.host, result.rc)
        if not self._sudo_checked:
            if result.rc != 0:
                self._check_sudo()
            self._sudo_checked = True
        return result


def _drain(recv: Callable[[int], bytes], buf: bytearray, quiet: bool = False) -> bool:
    """Append everything ``recv`` returns to ``buf`` until EOF; False, and no more read, once that would pass
    ``OUTPUT_LIMIT``. ``quiet``: a helper thread, whose errors the reader reports."""
    try:
        while chunk := recv(65536):
            if len(buf) + len(chunk) > OUTPUT_LIMIT:
                return False
            buf += chunk
    except (OSError, paramiko.SSHException, EOFError):  # socket.timeout is an OSError
        if not quiet:
            raise
    return True


STDIN_CHUNK = 1 << 20
"""How much of a script's stdin file is read at a time."""


def stdin_chunks(script: Script) -> Iterator[bytes]:
    """What ``script`` sends to its stdin, a chunk at a time: its file's ``size`` bytes (read as they are sent,
    so a release of any size takes one chunk of memory), then its ``stdin``. A file that ends early sends what
    it has: the script's byte count and sha256 check then refuse it on the node."""
    if script.stdin_file is not None:
        left = script.stdin_file.size
        with open(script.stdin_file.path, "rb") as f:
            while left > 0 and (chunk := f.read(min(STDIN_CHUNK, left))):
                left -= len(chunk)
                yield chunk
    if script.stdin:
        yield script.stdin


def _feed(chan: paramiko.Channel, script: Script) -> None:
    try:
        try:
            for chunk in stdin_chunks(script):
                chan.sendall(chunk)
        finally:
            chan.shutdown_write()  # a file that could not be read ends the input early: the node refuses it
    except (OSError, paramiko.SSHException, EOFError):
        pass  # the reader reports the broken channel
