"""The seam between the providers and the nodes: what a provider needs of a node, and who provides it.

Providers never talk SSH themselves. They ask the current ``Nodes`` for a
session to a node (``session(conn, node, expected_host_key)``) and run
scripts in it; a session is a ``Runner``. In a provider process the current
``Nodes`` is the SSH connection pool of ``transport`` (created on first use,
so previews never import paramiko). Tests install another one with ``use``:
tests/fakenode.py runs the real scripts against a directory on the test
machine, so the providers' create, update, read and delete run in seconds,
without root and without SSH.

Imports run one way: ``remote`` (Script, Result) <- ``sessions`` <- ``transport``
(imported by ``current`` on first use); ``transport`` never imports this module.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

from ..nodestate.commands import Result as Result  # a session's answer, defined beside the Script it answers

if TYPE_CHECKING:
    from ..config.specs import Connection
    from ..nodestate.commands import Script


class Runner(Protocol):
    """A session with one node: runs scripts as root."""

    host_key: str
    """The SSH host key the node presented ('type base64'), recorded in state on first use."""
    jump_host_keys: dict[str, str]
    """The host key each jump host presented, by 'host:port', recorded like the node's."""

    def run(self, script: Script, timeout: float = 900) -> Result:
        """Run ``script`` as root; return its result whatever its exit status."""
        ...


class Nodes(Protocol):
    """Hands out sessions to nodes, checking each node's host key."""

    def session(self, conn: Connection, node: str, expected_host_key: str | None = None,
                expected_jump_keys: Mapping[str, str] | None = None) -> AbstractContextManager[Runner]:
        """A session to the node ``conn`` names, through its jump hosts.

        ``expected_host_key``: the node's recorded key (a pin in ``conn`` wins); None trusts on first use.
        ``expected_jump_keys``: the jump hosts' recorded keys, by 'host:port'.
        """
        ...

    def close_all(self) -> None:
        """Close every session this holds."""
        ...


_current: Nodes | None = None
_current_lock = threading.Lock()


def current() -> Nodes:
    """The ``Nodes`` in use in this process: the SSH pool unless a test installed another.

    Made once, under a lock: the provider answers several calls at once, and
    two pools would mean two connections to the same node.
    """
    global _current
    with _current_lock:
        if _current is None:
            from .transport import Pool

            _current = Pool()
        return _current


@contextmanager
def use(nodes: Nodes) -> Iterator[Nodes]:
    """Make ``nodes`` the current ``Nodes`` inside the block (tests)."""
    global _current
    before, _current = _current, nodes
    try:
        yield nodes
    finally:
        nodes.close_all()
        _current = before
