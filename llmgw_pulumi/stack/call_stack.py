"""How many frames of the program's call stack the SDK records in the state of the resources the package registers.

For every resource it registers, the Python SDK records the frames of the program's call stack below the
resource class's ``__init__``: the state's ``stackTrace``, and its first frame again as ``sourcePosition``. A
node's four resources were registered 10 frames deep and its ``Node`` 7, a large part of a node's state, every
byte of it rewritten to the backend at each step of a `pulumi up` (docs/benchmark-method.md). Those frames say
little:

- for the four resources they are always the same lines of this package (``node.onboard``, ``Node.__init__``),
  then the program's, the event loop's and the language host's;
- for the ``Node``, the first frame is the line of the operator's program that made it (``Node(...)`` in their
  own program, or llmgw_pulumi.stack.program's registration), and the rest the event loop's and the language host's.

So the four record none, and the ``Node`` its first only (``recorded_frames``): its ``sourcePosition``, where a
program's reader looks. The package's own program (llmgw_pulumi.stack.program) makes every ``Node`` on the same line,
so there the ``Node`` records none either: every node's copy of one line said nothing. A block
nested in another records at most as many frames as the outer one allows.

Nothing else of a registration changes (URNs, inputs, dependencies), no step is added: a state holding the longer
stacks gets the short ones with the same steps of the next `pulumi up`, and a preview shows no difference (the
engine does not diff them).

The SDK has no setting for this. It takes the frames in ``pulumi.runtime.resource._get_stack_trace``, called
synchronously from the resource's constructor; ``recorded_frames`` wraps that function while the constructor
runs, and cuts its answer to the frames asked for. Where an SDK has no such function, its stacks are recorded
whole and nothing else differs (tests/e2e/test_state_size.py then fails, as it counts the frames).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pulumi.runtime.resource as _sdk_resource

__all__ = ["recorded_frames"]

RECORDER = "_get_stack_trace"
"""The SDK function that takes a new resource's call stack (pulumi.runtime.resource)."""


@contextlib.contextmanager
def recorded_frames(count: int) -> Iterator[None]:
    """While in this block, a resource constructed records at most ``count`` frames of the program's call stack,
    the innermost first (0: none, and no source position)."""
    if count < 0:
        raise ValueError(f"recorded_frames: count must be 0 or more, not {count}")
    record = getattr(_sdk_resource, RECORDER, None)
    if not callable(record):
        yield
        return

    def shortened() -> Any:
        trace = record()
        del trace.frames[count:]
        return trace

    # Construction is synchronous, on the program's one thread. A nested block cuts what the outer one's function
    # returns (so the fewer frames of the two are recorded), and restores the outer one's when it ends.
    setattr(_sdk_resource, RECORDER, shortened)
    try:
        yield
    finally:
        setattr(_sdk_resource, RECORDER, record)
