"""Scripts of a user other than root run under ``sudo -n`` at once; ``sudo -n true`` is asked only when a script
fails and sudo has not yet been seen to work on the connection.

The node is a stand-in for paramiko's transport (the session only opens channels, runs one command in each, reads
and feeds them and closes them): it records each command and answers as its sudo is configured.
"""

from __future__ import annotations

import pytest

from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.errors import SudoUnavailableError
from llmgw_pulumi.nodestate.commands import Script
from llmgw_pulumi.ssh import connection

SUDO_CHECK = "sudo -n true"
PASSWORD = "sudo: a password is required"


class Channel:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.out = b""
        self.err = b""
        self.rc = -1

    def settimeout(self, _: float) -> None:
        pass

    def exec_command(self, command: str) -> None:
        self.node.commands.append(command)
        if "sudo -n" in command and self.node.sudo_refuses:
            self.rc, self.err = 1, (PASSWORD + "\n").encode()
        elif SUDO_CHECK in command:
            self.rc = 0
        else:
            self.rc, self.out = self.node.script_rc, b"ran\n"

    def recv(self, n: int) -> bytes:
        out, self.out = self.out, b""
        return out

    def recv_stderr(self, n: int) -> bytes:
        err, self.err = self.err, b""
        return err

    def sendall(self, _: bytes) -> None:
        pass

    def shutdown_write(self) -> None:
        pass

    def recv_exit_status(self) -> int:
        return self.rc

    def close(self) -> None:
        pass


class Node:
    """A node whose sudo refuses (``sudo_refuses``) or not, and whose scripts exit with ``script_rc``."""

    def __init__(self, sudo_refuses: bool = False, script_rc: int = 0) -> None:
        self.sudo_refuses = sudo_refuses
        self.script_rc = script_rc
        self.commands: list[str] = []

    def open_session(self, timeout: float) -> Channel:
        return Channel(self)

    def is_active(self) -> bool:
        return True

    def checks(self) -> int:
        return sum(SUDO_CHECK in c for c in self.commands)


def session(node: Node, user: str = "deploy") -> connection.Session:
    return connection.Session(node, Connection(host="10.0.0.11", user=user), "gpu-01",  # type: ignore[arg-type]
                              "ssh-ed25519 AAAA", {})


SCRIPT = Script("echo ran", name="survey.sh")


def test_a_working_sudo_costs_no_command_of_its_own() -> None:
    node = Node()
    s = session(node)
    results = [s.run(SCRIPT), s.run(SCRIPT)]
    assert [r.rc for r in results] == [0, 0]
    assert len(node.commands) == 2 and node.checks() == 0
    assert all("sudo -n -- sh -c" in c for c in node.commands), node.commands


def test_root_runs_its_scripts_without_sudo() -> None:
    node = Node(sudo_refuses=True)
    assert session(node, user="root").run(SCRIPT).rc == 0
    assert len(node.commands) == 1 and "sudo" not in node.commands[0]


def test_a_sudo_that_asks_for_a_password_is_a_clear_error() -> None:
    node = Node(sudo_refuses=True)
    with pytest.raises(SudoUnavailableError) as err:
        session(node).run(SCRIPT)
    assert err.value.node == "gpu-01"
    assert "sudo asks deploy for a password on 10.0.0.11" in err.value.message and PASSWORD in err.value.message
    assert "passwordless sudo" in err.value.fix
    assert node.checks() == 1  # the refused script, then the check that names why


def test_a_failing_script_with_a_working_sudo_is_the_scripts_own_result_and_checked_once() -> None:
    node = Node(script_rc=3)
    s = session(node)
    first, second = s.run(SCRIPT), s.run(SCRIPT)
    assert (first.rc, first.stdout, second.rc) == (3, "ran\n", 3)
    assert node.checks() == 1 and len(node.commands) == 3


def test_once_a_script_succeeded_a_failing_one_asks_sudo_nothing() -> None:
    node = Node()
    s = session(node)
    assert s.run(SCRIPT).rc == 0
    node.script_rc = 3
    assert s.run(SCRIPT).rc == 3
    assert node.checks() == 0 and len(node.commands) == 2
