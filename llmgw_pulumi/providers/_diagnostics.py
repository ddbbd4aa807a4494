"""What a provider tells the operator, shown by the CLI under the resource it is about.

A Python dynamic provider has no logging API of its own: ``pulumi.log`` in
the provider process only prints, and the engine passes a provider's stdout
and stderr through as info lines that belong to no resource
(docs/operations.md, "What the CLI shows"). But the engine gives every
provider plugin its address (the plugin's first argument), and its ``Log``
call takes the URN of the resource a message is about. So:

- the package's modules log with the standard ``logging`` module
  (``logging.getLogger(__name__)``), knowing nothing of Pulumi;
- each provider call runs inside ``about()``, which finds the URN of the
  resource it serves in the engine's request: the SDK's dynamic-provider
  server (pulumi.dynamic.__main__) answers each Create, Read, Update,
  Delete, Diff and Check with the request, which names the resource, as a
  local of its handler, the frame the provider is called from. (A hidden
  ``__urn`` input used to carry it, in every resource's state.)
- a handler on the ``llmgw_pulumi`` logger sends DEBUG, INFO and WARNING
  records to the engine under that URN, each with its severity, and
  ephemeral when the record says so (``extra={"ephemeral": True}``: the CLI
  shows it in the resource's row, not again under Diagnostics). A record
  with ``extra={"stack_row": True}`` goes to the stack's row instead: the CLI
  prints a resource's row again, with its last message, when the resource
  is done, but not the stack's, so a message there is printed once. The CLI
  shows a debug diagnostic only with `--debug`; the event log
  (`--event-log`, the Automation API) keeps it: what a node's install does
  is said there, not on every node's row (one screen for a fleet). Outside
  a provider process (unit tests), or where no request is found, an INFO
  or WARNING record is printed to stderr instead, which the engine still
  shows, unattributed; a DEBUG record is dropped there.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from ..text import printable
from . import _server

_urn: contextvars.ContextVar[str | None] = contextvars.ContextVar("llmgw_resource_urn", default=None)

REQUESTS = ("CreateRequest", "ReadRequest", "UpdateRequest", "DeleteRequest", "DiffRequest", "CheckRequest")
"""The engine's requests a dynamic provider answers, each naming its resource's URN (pulumi.runtime.proto)."""


def served_urn(frame: types.FrameType | None) -> str | None:
    """The URN in the engine's request being answered: the nearest caller of ``frame`` (itself included) holding,
    as its local ``request``, one of the REQUESTS with a URN; None if none does."""
    from pulumi.runtime.proto import provider_pb2

    kinds = tuple(getattr(provider_pb2, name) for name in REQUESTS)
    while frame is not None:
        request = frame.f_locals.get("request")
        if isinstance(request, kinds) and request.urn:
            return str(request.urn)
        frame = frame.f_back
    return None


@contextlib.contextmanager
def about() -> Iterator[None]:
    """Attribute what is logged in this block to the resource of the engine's request being answered."""
    token = _urn.set(served_urn(sys._getframe(1)))
    try:
        yield
    finally:
        _urn.reset(token)


class _EngineHandler(logging.Handler):
    """Sends records to the engine's Log call under the current resource's URN."""

    def __init__(self, engine_address: str | None) -> None:
        super().__init__(level=logging.DEBUG)
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
        if urn and getattr(record, "stack_row", False):
            urn = stack_urn(urn) or urn
        engine = self._engine() if urn else None
        if urn and engine is not None:
            from pulumi.runtime.proto import engine_pb2

            severity = engine_pb2.WARNING if record.levelno >= logging.WARNING else \
                engine_pb2.INFO if record.levelno >= logging.INFO else engine_pb2.DEBUG
            try:
                engine.Log(engine_pb2.LogRequest(severity=severity, message=message, urn=urn,
                                                 ephemeral=bool(getattr(record, "ephemeral", False))), timeout=10)
                return
            except Exception:  # the engine went away: say it where the operator can still see it
                pass
        if record.levelno < logging.INFO:
            return  # a detail for `--debug` and the event log: never printed unattributed
        prefix = "warning" if record.levelno >= logging.WARNING else "info"
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def _engine_address() -> str | None:
    """The engine's address when this process is a dynamic-provider plugin (`python -m pulumi.dynamic ADDRESS`)."""
    if len(sys.argv) > 1 and sys.argv[0].replace("\\", "/").endswith("pulumi/dynamic/__main__.py"):
        return sys.argv[1]
    return None


def install() -> None:
    """Route the package's DEBUG, INFO and WARNING records to the engine (once per process); in a dynamic-provider
    process, errors shown without Python frames (``quiet_tracebacks``), and every call the engine sends served at
    once (``_server.serve_every_call``: install runs in the first call a provider serves)."""
    logger = logging.getLogger("llmgw_pulumi")
    if any(isinstance(h, _EngineHandler) for h in logger.handlers):
        return
    if _engine_address() is not None:
        quiet_tracebacks()
        _server.serve_every_call()
    logger.addHandler(_EngineHandler(_engine_address()))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False


def quiet_tracebacks() -> None:
    """The SDK's dynamic-provider server answers a failed call with ``traceback.format_exc()``, which the CLI
    prints under the resource: its own frames, then the package's. With ``sys.tracebacklimit`` 0 that is the
    error's class and message alone; the package's errors say what happened and the fix, and an unexpected
    error keeps the package's frames as a note (``providers.base.operator_errors``). Only in a provider process."""
    sys.tracebacklimit = 0


STACK_TYPE = "pulumi:pulumi:Stack"


def stack_urn(urn: str) -> str | None:
    """The URN of the stack a resource's URN belongs to (``urn:pulumi:<stack>::<project>::...``), or None."""
    parts = urn.split("::")
    if len(parts) < 4 or not parts[0].startswith("urn:pulumi:"):
        return None
    stack, project = parts[0].removeprefix("urn:pulumi:"), parts[1]
    return f"urn:pulumi:{stack}::{project}::{STACK_TYPE}::{project}-{stack}"


def report_failed(line: str) -> None:
    """Say, as an error of the stack, that a node failed (``errors.failed_line``). The CLI prints the stack's
    diagnostics after every resource's, at the end of the run: each failed node's line there, once, makes one
    list of the nodes that failed, whichever provider process each ran in. Outside a provider process, stderr."""
    message = printable(line, keep="")
    urn = _urn.get()
    stack = stack_urn(urn) if urn else None
    handler = next((h for h in logging.getLogger("llmgw_pulumi").handlers if isinstance(h, _EngineHandler)), None)
    engine = handler._engine() if handler is not None and stack else None
    if engine is not None and stack is not None:
        from pulumi.runtime.proto import engine_pb2

        try:
            engine.Log(engine_pb2.LogRequest(severity=engine_pb2.ERROR, message=message, urn=stack), timeout=10)
            return
        except Exception:  # the engine went away
            pass
    print(f"error: {message}", file=sys.stderr, flush=True)
