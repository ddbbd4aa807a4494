"""Registration: after a node's agent starts, the control plane must list it (``llmgw:registration``). Pure.

The onboarding script's last step told the operator to check by hand that the node appears in `llmgw ctl
nodes`. With ``llmgw:registration`` set, AgentInstall checks it itself, each time it has (re)started the agent
(its create, and each update that reaches the node): it runs the command given, on this machine, until what it
prints lists the node id, for at most ``timeoutSeconds``. A node the control plane never lists fails with
``AgentNotRegisteredError``, naming what was run and what it printed. A preview runs nothing, and a `pulumi up`
that changes nothing does not reach the node and runs nothing either.

    llmgw:registration:
      command: [llmgw, ctl, nodes, --server, cp1.example.net:7443]
      timeoutSeconds: 30

How a listing is read (``listed``): each line of the command's standard output is split on whitespace, and
the node is listed when the first word of a line is its id, exactly. So a command that prints one node id a
line, and one that prints a table whose first column is the node id (under a header line, as `llmgw ctl
nodes` does), both work; a line that merely mentions the id further on (another node's peer, a message)
does not count, nor does ``gpu-1`` for ``gpu-10``.

This module declares the setting and reads a listing; running the command is
llmgw_pulumi.providers._registration's.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..text import printable
from .schema import Problems, nested_settings, setting

DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_TIMEOUT_SECONDS = 3600.0
OUTPUT_SHOWN = 1000
"""At most this many characters of what the command printed are quoted in an error."""
EXAMPLE_COMMAND = ["llmgw", "ctl", "nodes", "--server", "cp1.example.net:7443"]


def valid_command(value: object) -> validate.Problem:
    """An argv list: the program (an absolute path, or a name looked up on PATH) and its arguments, each a
    non-empty printable string. Never a shell string: nothing is split or expanded."""
    fix = f"give the command as a list of arguments, the program first, e.g. {EXAMPLE_COMMAND}"
    if value is None:
        return "is missing", fix
    if isinstance(value, str):
        return f"{value!r} is one string, not a list of arguments", fix
    if not isinstance(value, (list, tuple)) or not value:
        return "is not a list of arguments", fix
    for i, arg in enumerate(value):
        if not isinstance(arg, str) or not arg:
            return f"argument {i} is not a non-empty string", fix
        if not arg.isprintable():
            return f"argument {i} ({printable(arg)!r}) holds a character a terminal does not show as itself", \
                "write each argument as plain text, without newlines, tabs or escapes"
    program = value[0]
    if "/" in program and not os.path.isabs(program):
        return f"the program {program!r} is a relative path", \
            "give the program's absolute path, or a bare name found on PATH (llmgw)"
    return None


def _collect_command(value: Any, problems: Problems, where: str) -> None:
    """A command given as one string gets the `pulumi config set` commands that give it as its words."""
    if isinstance(value, str) and value.strip() and value.isprintable():
        problems.wrong_type(where, value, "a list of arguments (one string is never split)", EXAMPLE_COMMAND)
        return
    problems.check(where, value, valid_command)


def valid_timeout(value: object) -> validate.Problem:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not 0 < value <= MAX_TIMEOUT_SECONDS:  # type: ignore[operator]
        return f"{value!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g}", \
            "give how long the control plane may take to list a node whose agent just started, e.g. 30"
    return None


@dataclass(frozen=True)
class RegistrationCheck:
    """After the agent starts, a command run on this machine must list the node id within a timeout
    (stack config ``llmgw:registration``)."""

    command: tuple[str, ...] = setting(
        "command", collect=_collect_command, convert=tuple,
        doc="The command that lists the nodes the control plane has, as a list of arguments (never a shell "
            "string), run on the machine running Pulumi with its environment but for the stack's config and "
            "secrets: e.g. [llmgw, ctl, nodes, --server, cp1.example.net:7443]. A node is listed when the first "
            "word of a line it prints is the node id.")
    timeout_seconds: float = setting(
        "timeoutSeconds", valid_timeout, convert=float, default=DEFAULT_TIMEOUT_SECONDS,
        doc="How long, in seconds, the command is run again until it lists the node; then the node fails.")


collect = nested_settings(RegistrationCheck, "registration")
"""The collector of a mapping of registration settings (unknown keys named with the nearest known one)."""


def listed(output: str, node_id: str) -> bool:
    """Does a listing (a command's standard output) list ``node_id``: is it the first word of one of its lines?"""
    return any(line.split()[:1] == [node_id] for line in output.splitlines())


QUOTE = "    | "
"""What each line of a command's output is shown after in an error: no line it printed can pass for one of the
error's own (its ``fix:``)."""


def shown(output: str, limit: int = OUTPUT_SHOWN) -> str:
    """What a command printed, as an error quotes it: every character printable, each line after ``QUOTE``, and
    at most ``limit`` characters, its end kept when it is longer (the last lines say the most) and the rest
    counted; "(nothing)" when it printed nothing."""
    text = printable(output.strip(), keep="\n")
    if not text:
        return f"{QUOTE}(nothing)"
    cut = ""
    if len(text) > limit:
        cut = f"{QUOTE}[{len(text) - limit} characters before]\n"
        text = text[-limit:]
    return cut + "\n".join(QUOTE + line for line in text.splitlines())
