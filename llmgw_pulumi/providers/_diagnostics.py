"""What a provider tells the operator, shown by the CLI under the resource it is about.

A Python dynamic provider has no logging API of its own: ``pulumi.log`` in
the provider process only prints, and the engine passes a provider's stdout
and stderr through as info lines that belong to no resource
(docs/operations.md, "What the CLI shows"). But the engine gives every
provider plugin its address (the plugin's first argument), and its ``Log``
call takes the URN of the resource a message is about. So:

- the package's modules log with the standard ``logging`` module
  (``logging.getLogger(__name__)``), knowing nothing of Pulumi;
- each provider call runs inside ``about(urn)``, the URN of the resource it
  serves (each resource carries it as the hidden input ``__urn``, computed by
  the program with ``pulumi.resource.create_urn``);
- a handler on the ``llmgw_pulumi`` logger sends INFO and WARNING records to
  the engine under that URN. Outside a provider process (unit tests), or for
  a resource without ``__urn``, a record is printed to stderr instead, which
  the engine still shows, unattributed.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, cast

import pulumi

from ..text import printable

URN_KEY = "__urn"
"""The hidden input naming the resource itself; the CLI does not display inputs starting with '__'."""

_urn: contextvars.ContextVar[str | None] = contextvars.ContextVar("llmgw_resource_urn", default=None)


def resource_urn(name: str, resource_type: str, opts: pulumi.ResourceOptions | None) -> pulumi.Output[str]:
    """The URN the engine will give a resource of this name and type under ``opts.parent``.

    The parent's URN is taken without its dependency on the parent: a child
    whose input depended on its own parent component would be a cycle.
    """
    parent = opts.parent if opts else None
    if parent is None:
        return pulumi.resource.create_urn(name, resource_type)
    urn = parent.urn
    known_urn = cast("Awaitable[str]", urn.future())  # a registered parent's URN is always known
    return pulumi.resource.create_urn(name, resource_type, parent=pulumi.Output(set(), known_urn, urn.is_known(),
                                                                                urn.is_secret()))


@contextlib.contextmanager
def about(props: Any) -> Iterator[None]:
    """Attribute what is logged in this block to the resource whose inputs or outputs are ``props``."""
    urn = props.get(URN_KEY) if isinstance(props, dict) else None
    token = _urn.set(urn if isinstance(urn, str) and urn else None)
    try:
        yield
    finally:
        _urn.reset(token)


class _EngineHandler(logging.Handler):
    """Sends records to the engine's Log call under the current resource's URN."""

    def __init__(self, engine_address: str | None) -> None:
        super().__init__(level=logging.INFO)
        self._address = engine_address
        self._stub: Any = None
        self._lock = threading.Lock()

    def _engine(self) -> Any:
        with self._lock:
            if self._stub is None and self._address:
                import grpc
                from pulumi.runtime.proto import engine_pb2_grpc

                self._stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel(self._address))
            return self._stub

    def emit(self, record: logging.LogRecord) -> None:
        # A record may quote a node's text (a hostname, a reason): nothing unprintable reaches the terminal.
        message = printable(self.format(record), keep="\n")
        urn = _urn.get()
        engine = self._engine() if urn else None
        if urn and engine is not None:
            from pulumi.runtime.proto import engine_pb2

            severity = engine_pb2.WARNING if record.levelno >= logging.WARNING else engine_pb2.INFO
            try:
                engine.Log(engine_pb2.LogRequest(severity=severity, message=message, urn=urn), timeout=10)
                return
            except Exception:  # the engine went away: say it where the operator can still see it
                pass
        prefix = "warning" if record.levelno >= logging.WARNING else "info"
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def _engine_address() -> str | None:
    """The engine's address when this process is a dynamic-provider plugin (`python -m pulumi.dynamic ADDRESS`)."""
    if len(sys.argv) > 1 and sys.argv[0].replace("\\", "/").endswith("pulumi/dynamic/__main__.py"):
        return sys.argv[1]
    return None


def install() -> None:
    """Route the package's INFO and WARNING records to the engine (once per process)."""
    logger = logging.getLogger("llmgw_pulumi")
    if any(isinstance(h, _EngineHandler) for h in logger.handlers):
        return
    logger.addHandler(_EngineHandler(_engine_address()))
    logger.setLevel(logging.INFO)
    logger.propagate = False
