"""The programs that change or read a node, as values (pure, no I/O).

The programs are shell, in ``scripts/*.sh`` (package data): ``exits.sh`` (the
exit codes, the one place they are numbered; ``Exit`` is read from it),
``prelude.sh`` (every helper, written once) and one script per operation. A
``Script`` is the three as one POSIX sh text, run as root with
``sh -c TEXT sh ARGS...``, plus the bytes it reads from stdin. The text is
the same for every node: everything variable reaches the script as a
positional argument, so a path like ``/opt/x; touch /tmp/pwned`` stays a
path. File contents, the private key included, travel only over the SSH
channel's stdin into a root-owned 0600 temporary file next to their
destination, which is then renamed into place: at no instant is a key
readable by anyone but root, and a reader never sees a half-written file.

What the scripts are told to install comes from ``desired`` (paths, modes,
owners, the unit); what they print is parsed by ``facts``. Scripts that
change a node take a lock on it, stage everything before they replace
anything, and clean up and undo a begun change however they end (see
``prelude.sh``).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from importlib import resources

from ..config.specs import DEFAULT_IB_ROOT
from . import desired
from .desired import (
    CERT_PATH,
    CONFIG_PATH,
    KEY_PATH,
    PENDING_KEY_PATH,
    TRUST_ANCHOR_PATH,
    UNIT_NAME,
    Content,
    File,
    NodeFile,
    config_owner_prefix,
)
from .facts import INVENTORY_QUERY_FIELDS
from .observed import Seen
from .plan import Do, Plan, Step, Unit

SCRIPTS = ("node-key.sh", "install-identity.sh", "remove-identity.sh", "install-agent.sh", "remove-agent.sh",
           "survey.sh", "probe-engines.sh")
"""The programs that run on nodes; each is run after exits.sh and prelude.sh."""


def script_text(name: str) -> str:
    """One file of ``scripts/`` as shipped in the package."""
    return resources.files(__package__).joinpath("scripts", name).read_text(encoding="utf-8")


_EXIT_LINE = re.compile(r"^EXIT_([A-Z_]+)=(\d+)\b[ \t]*(?:#[ \t]*(\w+))?", re.M)


def parse_exits(text: str) -> dict[str, int]:
    """``EXIT_NAME=N`` lines -> {NAME: N}."""
    return {m[1]: int(m[2]) for m in _EXIT_LINE.finditer(text)}


def exit_errors(text: str) -> dict[int, str]:
    """``EXIT_NAME=N  # ErrorClass`` lines -> {N: the name of the error class (llmgw_pulumi.errors) it means}."""
    return {int(m[2]): m[3] for m in _EXIT_LINE.finditer(text) if m[3]}


_CODES = parse_exits(script_text("exits.sh"))
EXIT_ERRORS = exit_errors(script_text("exits.sh"))
"""Each exit code -> the name of the error class that says what it means (llmgw_pulumi.errors)."""


class Exit(IntEnum):
    """How a script ended: the numbers of scripts/exits.sh (what each means: ``EXIT_ERRORS``)."""

    OK = 0
    RELEASE_FETCH = _CODES["RELEASE_FETCH"]
    CHECKSUM = _CODES["CHECKSUM"]
    AGENT_START = _CODES["AGENT_START"]
    WRITE = _CODES["WRITE"]
    BUSY = _CODES["BUSY"]
    NO_KEYGEN = _CODES["NO_KEYGEN"]
    KEY_MISSING = _CODES["KEY_MISSING"]
    VERSION = _CODES["VERSION"]
    UNSAFE_DIR = _CODES["UNSAFE_DIR"]
    NO_LOCK = _CODES["NO_LOCK"]
    STALE = _CODES["STALE"]


if set(EXIT_ERRORS) != set(_CODES.values()):
    raise ImportError(f"scripts/exits.sh names no error class for exit {sorted(set(_CODES.values()) - set(EXIT_ERRORS))}")
if set(_CODES) != set(Exit.__members__) - {"OK"}:
    raise ImportError(f"scripts/exits.sh and remote.Exit name different exits: {sorted(set(_CODES) ^ set(Exit.__members__))}")


@functools.cache
def program(name: str) -> str:
    """The text run on the node for script ``name``: the exit codes, the prelude, the script."""
    return "".join(script_text(n) for n in ("exits.sh", "prelude.sh", name))


def script(name: str, args: Sequence[str] = (), stdin: bytes = b"", stdin_file: StdinFile | None = None) -> Script:
    """Script ``name`` of scripts/ (its ``program``) with these arguments and input."""
    return Script(program(name), tuple(args), stdin, stdin_file, name)


@dataclass(frozen=True)
class StdinFile:
    """A file on this machine sent to a script's stdin: ``size`` bytes from its start."""

    path: str
    size: int


@dataclass(frozen=True)
class Script:
    text: str
    args: tuple[str, ...] = ()
    stdin: bytes = field(default=b"", repr=False)
    stdin_file: StdinFile | None = None
    """A file whose first ``size`` bytes go to stdin before ``stdin``: a binary pushed or copied, streamed from
    disk (``sessions.stdin_chunks``), never held whole in memory."""
    name: str = ""
    """The script's file in scripts/ (``install-agent.sh``): how a session names it in its debug log."""

    def command(self, sudo: bool) -> str:
        """The command line sshd runs: every argument shell-quoted."""
        argv = ["sh", "-c", self.text, "sh", *self.args]
        if sudo:
            argv = ["sudo", "-n", "--", *argv]
        return shlex.join(argv)


@dataclass(frozen=True)
class Result:
    """How a script ended on the node: its exit status and what it printed."""

    rc: int
    stdout: str
    stderr: str = field(repr=False)


def _mode(mode: int) -> str:
    return f"{mode:04o}"


# Where the package writes: a changing script sweeps leftovers of a run killed outright there.
_WRITE_DIRS = ":".join(desired.WRITE_DIRS)


# --------------------------------------------------------------------------- identity


def read_node_key() -> Script:
    """keyOrigin node: the node's certificate and the public half of its key (see node-key.sh read)."""
    return script("node-key.sh", ("read", CERT_PATH, KEY_PATH, PENDING_KEY_PATH))


def make_node_key(node_id: str) -> Script:
    """keyOrigin node: a new key pair made on the node, pending, and its CSR (see node-key.sh make)."""
    identity_dir = desired.DIRECTORIES[0]
    return script("node-key.sh", ("make", _WRITE_DIRS, identity_dir.path, _mode(identity_dir.mode),
                                  identity_dir.owner, PENDING_KEY_PATH, node_id))


def _before(step: Step) -> str:
    """A step's BEFORE as the scripts compare it (prelude.sh ``now_is``): ``sha256,mode,user:group``, ``absent``, ``*``."""
    seen = Seen.parse(step.before)
    return f"{seen.sha256},{seen.mode:o},{seen.owner}" if seen else step.before


def install_identity(plan: Plan, files: Sequence[File], node_key_spki: str | None = None) -> Script:
    """NodeIdentity's ``plan`` (SPEC steps 3 and 4), carried out with ``files``' bytes (see install-identity.sh).

    ``node_key_spki``: the key was made on the node (keyOrigin node) and is not among ``files``; this is the
    public half of it, as the certificate carries it (base64 DER), for the node to find the key by.
    """
    args = [_WRITE_DIRS, UNIT_NAME, "yes" if plan.unit is Unit.RESTART else "no", TRUST_ANCHOR_PATH,
            "yes" if plan.trust else "no"]
    for d in desired.DIRECTORIES:
        args += ["dir", d.path, _mode(d.mode), d.owner]
    by_path = {f.path: f for f in files}
    sent = b""
    for step in plan.steps:
        if step.do is Do.NODE_KEY:
            if node_key_spki is None:
                raise ValueError("a node-key step needs the certificate's public key")
            args += ["nodekey", step.path, _mode(step.want.mode), step.want.owner, PENDING_KEY_PATH, node_key_spki]
            continue
        content = by_path[step.path].content if step.do is Do.WRITE else b""
        args += ["file", step.do.value, step.path, _mode(step.want.mode), step.want.owner, _before(step), str(len(content))]
        sent += content
    return script("install-identity.sh", tuple(args), sent)


def remove_identity(owned: Mapping[str, str]) -> Script:
    """Remove the identity files (``owned``: path -> the sha256 this resource installed there), but only
    while the node still carries this resource's certificate (see remove-identity.sh); and a key pair the
    node made for a certificate that was never installed."""
    args = [_WRITE_DIRS, TRUST_ANCHOR_PATH, CERT_PATH, owned.get(CERT_PATH, "")]
    for path, sha in sorted(owned.items()):
        args += ["file", path, sha]
    args += ["pending", PENDING_KEY_PATH]
    for d in desired.DIRECTORIES:
        if d.removed_when_empty:
            args += ["dir", d.path]
    return script("remove-identity.sh", tuple(args))


# --------------------------------------------------------------------------- agent


def install_agent(plan: Plan, config: str, unit: str, *, version: str = "", release_url: str = "",
                  binary: StdinFile | None = None, settle_seconds: float = 1.5) -> Script:
    """AgentInstall's ``plan`` (SPEC steps 5, 6 and 8) as one transaction (see install-agent.sh).

    ``binary``: the file of a ``push`` or ``copy`` step, streamed; ``version`` and ``release_url``: the release a
    ``fetch`` downloads (``<url>/<tag>/llmgw-<tag>-linux-<arch>``) and a fetched or pushed binary must report.
    The restarted agent must stay up for ``settle_seconds``, or the previous binary, config and unit are put back.
    """
    bin_file = desired.file_with(Content.BINARY, desired.AGENT)
    cfg, unit_file = desired.agent_files(config, unit)
    texts = {cfg.path: cfg.content, unit_file.path: unit_file.content}
    ticks = max(1, round(settle_seconds / 0.1))
    bin_step = plan.step(bin_file.path)
    arch = plan.arch if bin_step.do in (Do.FETCH, Do.PUSH) else "*"
    args = [_WRITE_DIRS, UNIT_NAME, str(ticks), plan.unit.value, plan.unit_before if plan.unit is Unit.KEEP else "*",
            arch, version, release_url.rstrip("/")]
    pushed = binary if bin_step.do in (Do.PUSH, Do.COPY) else None
    if bin_step.do in (Do.PUSH, Do.COPY) and pushed is None:
        raise ValueError(f"a {bin_step.do.value} step needs the binary's file")
    sent = b""
    args += [bin_step.do.value, bin_step.path, _mode(bin_step.want.mode), bin_step.want.owner, _before(bin_step),
             str(pushed.size if pushed else 0), bin_step.want.sha256]
    for path in (cfg.path, unit_file.path):
        step = plan.step(path)
        content = texts[path] if step.do is Do.WRITE else b""
        args += [step.do.value, path, _mode(step.want.mode), step.want.owner, _before(step), str(len(content)), "-"]
        sent += content
    return script("install-agent.sh", tuple(args), sent, pushed)


def remove_agent(node_id: str) -> Script:
    """Stop (only the agent's main process: KillMode=process leaves engines running), disable, remove;
    only while agent.yaml is still this node's (its first line names the node id)."""
    paths = [f.path for f in desired.files_of(desired.AGENT)]
    return script("remove-agent.sh", (_WRITE_DIRS, UNIT_NAME, CONFIG_PATH, config_owner_prefix(node_id), *paths))


# --------------------------------------------------------------------------- reading a node


def survey(files: Sequence[NodeFile] = desired.NODE_FILES, texts: Sequence[NodeFile] = ()) -> Script:
    """Read, in one round trip, what the node looks like now: see facts.parse_survey. ``texts``: files whose
    text is read too (small text files, such as agent.yaml and the unit)."""
    return script("survey.sh", (UNIT_NAME, *(f.path for f in files), "--text", *(f.path for f in texts)))


ENGINE_PROBE_TIMEOUT = 30
"""Seconds an engine's --version (then --help) may take."""


def probe_engines(engines: Sequence[tuple[str, str]], nvidia_smi: str | None = None,
                  ib_root: str = DEFAULT_IB_ROOT) -> Script:
    """SPEC step 7: each engine path exists, is executable, and really runs; and, in the same run, the node's
    inventory: nvidia-smi at ``nvidia_smi`` (None: on PATH) and the HCAs under ``ib_root`` (see probe-engines.sh)."""
    args = [str(ENGINE_PROBE_TIMEOUT), nvidia_smi or "", ib_root, ",".join(INVENTORY_QUERY_FIELDS)]
    for name, path in engines:
        args += [name, path]
    return script("probe-engines.sh", tuple(args))
