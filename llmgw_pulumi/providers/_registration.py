"""Running ``llmgw:registration``'s command once the agent has (re)started (llmgw_pulumi.config.registration).

AgentInstall calls ``confirm`` as the last step of a create, and of each update that reached the node: never in
a preview (the engine calls no create or update then) and never in a `pulumi up` that changes nothing (no
update is called). The command runs on this machine, as this user, with this process's environment but for the
stack's config and what decrypts it (``child_env.for_child``), with no input, and again every ``POLL_SECONDS``
until it lists the node, as long as ``timeoutSeconds`` leave time for a pause and a run (a run still going
at the timeout is stopped).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

from .. import child_env
from ..config import registration
from ..errors import AgentNotRegisteredError
from ..operator_files import exposed

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
"""The pause between two runs of the command while the node is not listed yet."""
READ_LIMIT = 4 << 20
"""At most this many bytes of what one run printed are read (a listing of many thousand nodes fits)."""


def confirm(node_id: str, check: registration.RegistrationCheck | None, *,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Run the registration command (``check``: AgentInstall's ``registration`` input; None: not configured)
    until it lists ``node_id``; AgentNotRegisteredError when it has not within its timeout."""
    if check is None:
        return
    program = _program(node_id, check.command[0])
    argv = [program, *check.command[1:]]
    shown_command = " ".join(check.command)
    deadline = clock() + check.timeout_seconds
    runs = 0
    while True:
        runs += 1
        status, out, err = _run(argv, deadline - clock())
        if status == 0 and registration.listed(out, node_id):
            # Debug: the expected outcome, for `--debug` and the event log, not a line on each of a fleet's rows.
            log.debug("%s: the control plane lists it (`%s`)", node_id, shown_command)
            return
        if deadline - clock() < 2 * POLL_SECONDS:  # no time left for a pause and a run of at least as long
            break
        sleep(POLL_SECONDS)
    how = "exited 0" if status == 0 else status if isinstance(status, str) else f"exited {status}"
    raise AgentNotRegisteredError(
        node_id, f"the agent runs, but the control plane did not list {node_id} within "
                 f"{check.timeout_seconds:g} s: `{shown_command}` ran {runs} time{'s' if runs != 1 else ''}; the "
                 f"last run {how} and printed (a node is listed by the first word of a line):\n"
                 f"{registration.shown(out)}" + (f"\nand on stderr:\n{registration.shown(err)}" if err.strip() else ""))


def _program(node_id: str, program: str) -> str:
    """The command's program as an absolute path (a bare name looked up on PATH), refused when it is not there or
    another user could change it."""
    found = program if os.path.isabs(program) else shutil.which(program)
    fix = "install it, or give its absolute path as the first item of llmgw:registration.command"
    if found is None or not os.path.isfile(found):
        raise AgentNotRegisteredError(node_id, f"cannot check that the control plane lists the node: the "
                                      f"registration command's program {program} is not on this machine", fix)
    if not os.access(found, os.X_OK):
        raise AgentNotRegisteredError(node_id, f"cannot check that the control plane lists the node: {found} is "
                                      "not executable by this user", fix)
    problem = exposed(found, secret=False)
    if problem is not None:
        raise AgentNotRegisteredError(node_id, f"the registration command's program: {problem[0]}", problem[1])
    return found


def _run(argv: list[str], timeout: float) -> tuple[int | str, str, str]:
    """(exit status, or what happened instead; its stdout; its stderr: at most READ_LIMIT bytes of each) of one
    run of ``argv``, killed with what it started after ``timeout`` seconds."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                                    env=child_env.for_child(), start_new_session=True)
        except OSError as exc:
            return f"could not be run ({exc.strerror})", "", ""
        try:
            status: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # it may have ended just now
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"was stopped after {timeout:.1f} s"
        printed = []
        for f in (out, err):
            f.seek(0)
            printed.append(f.read(READ_LIMIT).decode(errors="replace"))
    return status, printed[0], printed[1]
