"""What a node was seen holding, in one shape for every resource, and how it differs from what it should hold.

Pure: no I/O. Every resource that installs files on a node records, in its
``observed`` output, what it last saw there (when it installed, or when
`pulumi refresh` read the node):

- per file, by its name (``desired.NodeFile.name``: ``ca``, ``config``, ...),
  the file as ``"<sha256> <mode> <owner>"`` (the digest in unpadded base64url,
  43 characters, see ``short``; mode in octal as ``stat`` prints it, owner as
  user:group), or ``absent``; a text file that says what was wanted in other
  words (``desired.equivalent``: one a script wrote, adopted as it is) carries
  `` = <sha256 of the text wanted>``;
- the agent's unit, as ``"<is-active> <is-enabled>"`` (AgentInstall only).

What the node should hold is a ``Wanted`` (built from the inputs), and
``differences(wanted, observed)`` is the one comparison: the providers' diff,
update (through ``llmgw_pulumi.nodestate.plan``), read and the preview's drift text all
use it.

Outputs carry ``state_version``. A record written by an earlier version of
this package is brought to this shape by ``migrate`` (explicit code, one step
per version, each with a unit test), wherever the providers read old outputs:
an upgrade of the package never mistakes an old record for drift.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import desired
from .facts import ABSENT, NodeFacts

STATE_VERSION = 3
"""The shape of the providers' outputs. 0 (no ``state_version``): written by ca1dd75 or e80e071; 1: by fc02334
(records by path, hex digests, AgentInstall keeping the texts of agent.yaml and the unit); 2: AgentInstall's
``rollout`` holding the stack's whole canary list."""
VERSION_KEY = "state_version"
OBSERVED_KEY = "observed"
ANY = "*"
"""A file whose bytes are not known on this side (a key made on the node): it only has to be there."""
UNIT_KEY = "unit"
DIGEST = "sha256:"
"""How a digest kept in place of a text begins (AgentInstall's ``unit`` input): ``sha256:<short digest>``."""
_NAME_OF = {f.path: f.name for f in desired.NODE_FILES}
_PATH_OF = {f.name: f.path for f in desired.NODE_FILES}
_SHORT = r"[A-Za-z0-9_-]{43}"


def short(sha256_hex: str) -> str:
    """A sha256 as state keeps it: unpadded base64url, 43 characters instead of 64 (``ANY`` as it is)."""
    if sha256_hex == ANY:
        return ANY
    return base64.urlsafe_b64encode(bytes.fromhex(sha256_hex)).decode().rstrip("=")


def hex_of(digest: str) -> str:
    """The hex form of a digest ``short`` wrote (one already in hex is returned as it is)."""
    if re.fullmatch(r"[0-9a-f]{64}", digest) or digest == ANY:
        return digest
    return base64.urlsafe_b64decode(digest + "=").hex()


def text_digest(text: str) -> str:
    """``sha256:<short digest>`` of a text: what state keeps of a text rendered from the inputs."""
    return DIGEST + short(desired.sha256_text(text))


def digest_hex(value: Any) -> str | None:
    """The sha256 (hex) a ``text_digest`` names; None for anything else."""
    if isinstance(value, str) and re.fullmatch(re.escape(DIGEST) + _SHORT, value):
        return hex_of(value.removeprefix(DIGEST))
    return None


@dataclass(frozen=True)
class Seen:
    """A file as a node held it."""

    sha256: str
    mode: int
    owner: str
    """user:group"""
    reads_as: str | None = None
    """The sha256 of the text wanted, when the file says the same in other words (see ``desired.equivalent``)."""

    def record(self) -> str:
        text = f"{short(self.sha256)} {self.mode:o} {self.owner}"
        return text if self.reads_as is None else f"{text} = {short(self.reads_as)}"

    @classmethod
    def parse(cls, text: str) -> Seen | None:
        """A record as ``record`` writes it; None for ``absent`` (or anything else)."""
        m = re.fullmatch(rf"({_SHORT}) ([0-7]{{1,4}}) (\S+)(?: = ({_SHORT}))?", text)
        return cls(hex_of(m[1]), int(m[2], 8), m[3], hex_of(m[4]) if m[4] else None) if m else None


@dataclass(frozen=True)
class Observed:
    """What a node was seen holding: path -> the file (None: absent), and the unit's state (when it was read)."""

    files: Mapping[str, Seen | None]
    unit: str | None = None
    """``"<is-active> <is-enabled>"``"""

    def record(self) -> dict[str, Any]:
        files = {_NAME_OF.get(p, p): s.record() if s else ABSENT for p, s in self.files.items()}
        out: dict[str, Any] = {"files": dict(sorted(files.items()))}
        if self.unit is not None:
            out[UNIT_KEY] = self.unit
        return out

    @classmethod
    def parse(cls, record: Any) -> Observed | None:
        """The ``observed`` output; None when there is none (a resource that never reached its node)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("files"), Mapping):
            return None
        files = {_PATH_OF.get(str(n), str(n)): Seen.parse(str(s)) for n, s in record["files"].items()}
        unit = record.get(UNIT_KEY)
        return cls(files, unit if isinstance(unit, str) else None)

    def sha256(self, path: str) -> str | None:
        seen = self.files.get(path)
        return seen.sha256 if seen else None


@dataclass(frozen=True)
class Want:
    """A file as a node should hold it: its sha256 (``ANY``: any bytes), mode and owner."""

    sha256: str
    mode: int
    owner: str


@dataclass(frozen=True)
class Wanted:
    files: Mapping[str, Want]
    unit: str | None = None
    """The unit's state wanted (``desired.UNIT_STATE``), or None for a resource that has no unit."""


UNIT_WANTED = " ".join(desired.UNIT_STATE.values())


@dataclass(frozen=True)
class Difference:
    """One way a node differs from what it should hold."""

    path: str
    """The file's path, or ``unit``."""
    what: str
    """``absent``, ``content``, ``mode``, ``owner`` or ``state`` (the unit's)."""
    seen: str
    wanted: str

    @property
    def text(self) -> str:
        """What differs, without the path: ``mode 0644, not 0600``."""
        if self.what == "absent":
            return "absent"
        if self.what == "content":
            return f"sha256 {self.seen[:12]}..., not {self.wanted[:12]}..."
        return f"{self.what} {self.seen}, not {self.wanted}"

    def __str__(self) -> str:
        return f"{self.path}: {self.text}"


def content_is(seen: Seen, want: Want) -> bool:
    return want.sha256 in (ANY, seen.sha256, seen.reads_as)


def file_differences(path: str, want: Want, seen: Seen | None) -> list[Difference]:
    if seen is None:
        return [Difference(path, "absent", ABSENT, want.sha256)]
    out = []
    if not content_is(seen, want):
        out.append(Difference(path, "content", seen.sha256, want.sha256))
    if seen.mode != want.mode:
        out.append(Difference(path, "mode", f"{seen.mode:04o}", f"{want.mode:04o}"))
    if seen.owner != want.owner:
        out.append(Difference(path, "owner", seen.owner, want.owner))
    return out


def differences(wanted: Wanted, observed: Observed | None) -> list[Difference]:
    """Every way ``observed`` differs from ``wanted``; a node never seen differs in every file."""
    files = observed.files if observed else {}
    out = [d for path, want in wanted.files.items() for d in file_differences(path, want, files.get(path))]
    if wanted.unit is not None:
        seen_unit = observed.unit if observed else None
        if seen_unit != wanted.unit:
            out.append(Difference(UNIT_KEY, "state", seen_unit or "unknown", wanted.unit))
    return out


def by_path(found: Iterable[Difference]) -> dict[str, str]:
    """The preview's drift text: path -> what differs there (``; ``-separated)."""
    out: dict[str, list[str]] = {}
    for d in found:
        out.setdefault(d.path, []).append(d.text)
    return {path: "; ".join(what) for path, what in out.items()}


def wanted_file(f: desired.NodeFile, sha256: str) -> Want:
    return Want(sha256, f.mode, f.owner)


def from_facts(node: NodeFacts, files: Iterable[desired.NodeFile], reads_as: Mapping[str, str] | None = None,
               unit: bool = False) -> Observed:
    """What a script printed about ``files`` (and the unit), as an ``Observed``. ``reads_as``: path -> the
    sha256 of the text wanted, for the text files found saying the same in other words."""
    seen: dict[str, Seen | None] = {}
    for f in files:
        fact = node.files.get(f.path)
        seen[f.path] = None if fact is None else Seen(fact.sha256, fact.mode, f"{fact.owner}:{fact.group}",
                                                      (reads_as or {}).get(f.path))
    return Observed(seen, f"{node.unit_active or 'unknown'} {node.unit_enabled or 'unknown'}" if unit else None)


# --------------------------------------------------------------------------- migrations


def _v0_file(f: desired.NodeFile, state: Any) -> Seen | None:
    """A file as version 0 recorded it (``facts.file_state``): ``<sha256>[; mode M, not W][; owner O, not W]``."""
    if not isinstance(state, str) or state == ABSENT:
        return None
    sha, *wrong = state.split("; ")
    mode, owner = f.mode, f.owner
    for w in wrong:
        if m := re.fullmatch(r"mode ([0-7]+), not [0-7]+", w):
            mode = int(m[1], 8)
        elif m := re.fullmatch(r"owner (\S+), not \S+", w):
            owner = m[1]
    return Seen(sha, mode, owner)


def _v1_record(files: Mapping[str, Seen | None], unit: str | None = None) -> dict[str, Any]:
    """A record in version 1's shape: by path, ``"<hex sha256> <mode> <owner>[ = <hex sha256>]"``."""
    def one(s: Seen | None) -> str:
        if s is None:
            return ABSENT
        text = f"{s.sha256} {s.mode:o} {s.owner}"
        return text if s.reads_as is None else f"{text} = {s.reads_as}"

    out: dict[str, Any] = {"files": {p: one(s) for p, s in sorted(files.items())}}
    if unit is not None:
        out[UNIT_KEY] = unit
    return out


def _v0_to_v1(outputs: dict[str, Any], resource: str) -> dict[str, Any]:
    """Version 0: NodeIdentity kept ``files`` (path -> file state), AgentInstall ``node_state``
    (``<name>_sha256`` -> file state, ``active``, ``enabled``)."""
    out = dict(outputs)
    if resource == desired.IDENTITY and isinstance(out.get("files"), Mapping):
        files = out.pop("files")
        out[OBSERVED_KEY] = _v1_record({f.path: _v0_file(f, files.get(f.path)) for f in desired.files_of(resource)
                                        if f.path in files})
    if resource == desired.AGENT and isinstance(out.get("node_state"), Mapping):
        state = out.pop("node_state")
        seen = {f.path: _v0_file(f, state.get(f"{f.name}_sha256")) for f in desired.files_of(resource)
                if f"{f.name}_sha256" in state}
        out[OBSERVED_KEY] = _v1_record(seen, f"{state.get('active') or 'unknown'} {state.get('enabled') or 'unknown'}")
    return out


def _v1_file(text: Any) -> Seen | None:
    """A file as version 1 recorded it: ``<hex sha256> <mode> <owner>[ = <hex sha256>]``, or ``absent``."""
    m = re.fullmatch(r"([0-9a-f]{64}) ([0-7]{1,4}) (\S+)(?: = ([0-9a-f]{64}))?", str(text))
    return Seen(m[1], int(m[2], 8), m[3], m[4]) if m else None


RENDERED_KEYS = ("agent_yaml", "unit")
"""AgentInstall's texts rendered from its inputs: its outputs keep them as ``text_digest`` (from version 2)."""


def whole_text(key: str, value: str, props: Mapping[str, Any]) -> str:
    """The text of the file an AgentInstall input's ``value`` stands for: agent.yaml's input leaves out the
    file's two comment lines (``desired.agent_yaml_file`` adds them)."""
    if key == "agent_yaml" and isinstance(props.get("node_id"), str):
        return desired.agent_yaml_file(props["node_id"], value)
    return value


def digested(props: Mapping[str, Any]) -> dict[str, Any]:
    """An AgentInstall's ``props`` with agent.yaml and the unit as its outputs keep them: their ``text_digest``.
    Inputs (the texts) and outputs (their digests) compare equal through it: the provider's diff and the fleet
    rules both judge a change this way."""
    out = dict(props)
    for key in RENDERED_KEYS:
        if isinstance(out.get(key), str) and digest_hex(out[key]) is None:
            out[key] = text_digest(whole_text(key, out[key], props))
    return out


def _v1_to_v2(outputs: dict[str, Any], resource: str) -> dict[str, Any]:
    """Version 1 kept the observed record by path with hex digests, and AgentInstall the texts of agent.yaml and
    the unit: now by file name with short digests (``short``), and the texts as their ``text_digest``."""
    out = dict(outputs)
    record = out.get(OBSERVED_KEY)
    if isinstance(record, Mapping) and isinstance(record.get("files"), Mapping):
        unit = record.get(UNIT_KEY)
        out[OBSERVED_KEY] = Observed({str(p): _v1_file(t) for p, t in record["files"].items()},
                                     unit if isinstance(unit, str) else None).record()
    if resource == desired.AGENT:
        for key in RENDERED_KEYS:
            if isinstance(out.get(key), str) and digest_hex(out[key]) is None:
                out[key] = text_digest(out[key])
    return out


def _v2_to_v3(outputs: dict[str, Any], resource: str) -> dict[str, Any]:
    """Version 2 gave each AgentInstall the stack's whole llmgw:rollout (``canaries``, a list): now the node's
    share of it, ``canary`` (a bool) in place of the list (``specs.NodeRollout``)."""
    out = dict(outputs)
    given = out.get("rollout")
    if resource == desired.AGENT and isinstance(given, Mapping) and "canaries" in given:
        share = {k: v for k, v in given.items() if k != "canaries"}
        canaries = given["canaries"]
        share["canary"] = isinstance(canaries, (list, tuple)) and out.get("node_id") in canaries
        out["rollout"] = share
    return out


_STEPS = {0: _v0_to_v1, 1: _v1_to_v2, 2: _v2_to_v3}
"""version -> the step that brings a record of that version to the next."""


def version_of(outputs: Mapping[str, Any]) -> int:
    v = outputs.get(VERSION_KEY, 0)
    return int(v) if isinstance(v, (int, float)) else 0


def migrate(outputs: Mapping[str, Any], resource: str) -> dict[str, Any]:
    """``outputs`` of ``resource`` (``desired.IDENTITY``, ``desired.AGENT``, ...) in this version's shape.

    A record of a later version than this package knows is returned as it is (the ``state_version`` tells a
    reader why it does not parse)."""
    out = dict(outputs)
    version = version_of(out)
    while version < STATE_VERSION:
        out = _STEPS[version](out, resource)
        version += 1
    if version == STATE_VERSION:
        out[VERSION_KEY] = STATE_VERSION
    return out
