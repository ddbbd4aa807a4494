"""The plan of one change to a node: what each file, the binary and the agent's unit will undergo, and why.

Pure: no I/O. ``agent_plan`` and ``identity_plan`` turn what a node should
hold (``observed.Wanted``), what it was last seen holding
(``observed.Observed``) and what changed in the inputs into a ``Plan``:

- per file: ``keep`` it, ``repair`` its mode and owner in place (its bytes
  are right), or ``write`` new bytes (staged, then renamed into place);
- the binary: ``keep``, ``fetch`` (the node downloads the release),
  ``push`` (downloaded and verified here, sent) or ``copy`` (a local build);
- the agent: ``restart``, ``start`` (nothing was replaced, but it is not
  running or not enabled) or ``keep`` running as it is;
- the rollback point: the files whose previous bytes are kept until the
  restarted agent has stayed up (and put back if it does not).

Creation (adopting what a node onboarded by the script has), update, drift
repair and every rollout step are made of the same plan. The node's script
carries the plan out and decides nothing on its own: under the node's lock it
re-checks, step by step, that the node still holds what the plan was made
from (``Step.before``), and when it does not, changes nothing and exits
``EXIT_STALE``; the provider then reads the node again and makes a new plan.
``render`` prints a plan as short text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ..errors import ChecksumMismatchError
from ..releases.policy import binary_name
from . import desired
from .facts import ABSENT
from .observed import ANY, Observed, Seen, Want, Wanted, file_differences


class Do(Enum):
    """What a step does to its file."""

    KEEP = "keep"
    REPAIR = "repair"
    """The bytes are right: the mode and owner are made right in place (same inode)."""
    WRITE = "write"
    FETCH = "fetch"
    """The binary: the node downloads the release and checks its sha256."""
    PUSH = "push"
    """The binary: a release downloaded and verified on this side is sent."""
    COPY = "copy"
    """The binary: the local build is sent."""
    NODE_KEY = "node-key"
    """keyOrigin node: the node's own key for the certificate, kept where it is or the pending one renamed in."""


REPLACING = frozenset({Do.WRITE, Do.FETCH, Do.PUSH, Do.COPY, Do.NODE_KEY})


class Unit(Enum):
    KEEP = "keep"
    START = "start"
    RESTART = "restart"


@dataclass(frozen=True)
class Step:
    path: str
    do: Do
    before: str
    """What the node must hold at ``path`` for this step to be right: a ``Seen`` record, ``absent`` or ``*``."""
    want: Want
    why: str = ""


@dataclass(frozen=True)
class Plan:
    node: str
    steps: tuple[Step, ...]
    unit: Unit = Unit.KEEP
    unit_before: str = ANY
    """The unit's state the plan was made from (``observed.Observed.unit``), re-checked under the lock."""
    trust: bool = False
    """Identity: update-ca-certificates runs (the trust anchor is replaced)."""
    arch: str = ANY
    """The agent: the architecture the binary's sha256 was chosen for, re-checked under the lock."""
    rollback: tuple[str, ...] = ()
    """The agent: the files whose previous bytes are kept until the restarted agent stayed up, and put back
    if it does not (the rollback point)."""

    def step(self, path: str) -> Step:
        (found,) = (s for s in self.steps if s.path == path)
        return found

    @property
    def changes_node(self) -> bool:
        return self.unit is not Unit.KEEP or self.trust or any(s.do is not Do.KEEP for s in self.steps)


def _before(seen: Seen | None, observed: Observed | None, path: str) -> str:
    if observed is None or path not in observed.files:
        return ANY
    return seen.record() if seen else ABSENT


def file_step(path: str, want: Want, observed: Observed | None, replace: Do = Do.WRITE, why: str = "") -> Step:
    """One file's step, from how the node differs there (``observed.file_differences``): its bytes replaced
    (``replace``: write, fetch, ...) when they are not the ones wanted or it is absent, its mode and owner
    repaired when only they differ, else kept."""
    seen = observed.files.get(path) if observed else None
    before = _before(seen, observed, path)
    found = file_differences(path, want, seen)
    what = {d.what for d in found}
    if what & {"absent", "content"}:
        return Step(path, replace, before, want, why or ("not seen yet" if before == ANY else "; ".join(d.text for d in found)))
    if found:
        return Step(path, Do.REPAIR, before, want, "; ".join(d.text for d in found))
    assert seen is not None
    return Step(path, Do.KEEP, before, want, "as wanted" if seen.reads_as is None else "says the same in other words")


@dataclass(frozen=True)
class BinaryWanted:
    """Where the agent's binary comes from: ``fetch``/``push`` a release (its approved sha256 by architecture)
    or ``copy`` a local build (its sha256)."""

    source: Do
    sha256_by_arch: Mapping[str, str]
    version: str = ""


def binary_sha256(node: str, binary: BinaryWanted, arch: str) -> str:
    """The sha256 the binary must have on a node of ``arch``; a release without it is refused."""
    if binary.source is Do.COPY:
        return binary.sha256_by_arch[""]
    want = binary.sha256_by_arch.get(arch)
    if want is None:
        raise ChecksumMismatchError(node, f"checksums.txt of {binary.version} has no line for "
                                          f"{binary_name(binary.version, arch)} (or agent.sha256 no {arch} digest); "
                                          "nothing was installed",
                                    "publish the release for this node's architecture, or pin its sha256")
    return want


def agent_plan(node: str, wanted: Wanted, observed: Observed, arch: str, binary: BinaryWanted,
               changed: frozenset[str] = frozenset()) -> Plan:
    """AgentInstall's plan: the binary, agent.yaml and the unit; the agent restarted when any is replaced, started
    when none is but it is not running and enabled. ``changed``: the inputs that changed (they name the reason)."""
    bin_file = desired.file_with(desired.Content.BINARY, desired.AGENT)
    bin_want = Want(binary_sha256(node, binary, arch), bin_file.mode, bin_file.owner)
    why = "version changed" if {"version", "binary_sha256"} & changed else ""
    steps = [file_step(bin_file.path, bin_want, observed, binary.source, why)]
    for f in desired.files_of(desired.AGENT):
        if f.path in wanted.files:
            steps.append(file_step(f.path, wanted.files[f.path], observed, why="text changed" if _text_key(f) in changed else ""))
    replaced = tuple(s.path for s in steps if s.do in REPLACING)
    if replaced:
        unit = Unit.RESTART
    elif observed.unit != wanted.unit:
        unit = Unit.START
    else:
        unit = Unit.KEEP
    return Plan(node, tuple(steps), unit, observed.unit or ANY, arch=arch, rollback=replaced)


def _text_key(f: desired.NodeFile) -> str:
    return "agent_yaml" if f.content is desired.Content.AGENT_YAML else "unit"


def identity_plan(node: str, wanted: Wanted, observed: Observed, key_on_node: bool) -> Plan:
    """NodeIdentity's plan: the CA, the certificate, the key and the trust anchor. With the key made on the node
    the key step is always ``node-key`` (its bytes are never seen here: the node finds its key by the
    certificate's public key). The agent is restarted (if it runs) when the certificate, key or CA is replaced,
    and update-ca-certificates runs when the trust anchor is."""
    key = desired.file_with(desired.Content.KEY_PEM, desired.IDENTITY)
    steps = []
    for f in desired.files_of(desired.IDENTITY):
        if f.path == key.path and key_on_node:
            steps.append(Step(f.path, Do.NODE_KEY, ANY, wanted.files[f.path], "the node's own key, found by the certificate"))
        elif f.path in wanted.files:
            steps.append(file_step(f.path, wanted.files[f.path], observed))
    replaced = {s.path for s in steps if s.do is Do.WRITE}
    # A renewed identity takes effect when the agent reconnects; a first install has no agent to restart.
    restart = any(s.do is Do.WRITE and s.before != ABSENT and s.path != desired.TRUST_ANCHOR_PATH for s in steps)
    return Plan(node, tuple(steps), Unit.RESTART if restart else Unit.KEEP, trust=desired.TRUST_ANCHOR_PATH in replaced)


def render(plan: Plan) -> str:
    """A plan as short text, one line per step, e.g. for a review of what an `up` will do to a node."""
    lines = [f"{plan.node}:"]
    for s in plan.steps:
        lines.append(f"  {s.do.value:8} {s.path}" + (f"  ({s.why})" if s.why else ""))
    lines.append(f"  agent: {plan.unit.value}")
    if plan.trust:
        lines.append("  trust: update-ca-certificates")
    if plan.rollback:
        lines.append("  rollback point: the previous " + ", ".join(plan.rollback) + ", until the agent stayed up")
    return "\n".join(lines)
