"""The plan of a change, as data: each row is a situation (what the node should hold, what it was last seen
holding, what changed) and the plan expected for it, step by step."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.nodestate import desired, plan
from llmgw_pulumi.nodestate.observed import Observed, Seen, Want, Wanted

NAMES = {f.path: f.name for f in desired.NODE_FILES}
PATHS = {f.name: f for f in desired.NODE_FILES}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def as_wanted(name: str, content: str = "") -> Seen:
    """The file ``name`` as wanted: the bytes ``content`` (default: the file's name), its SPEC mode and owner."""
    f = PATHS[name]
    return Seen(sha(content or name), f.mode, f.owner)


def want(name: str, content: str = "") -> Want:
    seen = as_wanted(name, content)
    return Want(seen.sha256, seen.mode, seen.owner)


AGENT_WANTED = Wanted({PATHS[n].path: want(n) for n in ("config", "unit")}, "active enabled")
RELEASE = plan.BinaryWanted(plan.Do.FETCH, {"amd64": sha("binary")}, "v1.2.3")


@dataclass(frozen=True)
class Row:
    situation: str
    seen: dict[str, Seen | None]
    expected: dict[str, str]
    """file name -> the step's action"""
    agent: str
    rollback: tuple[str, ...] = ()
    unit: str = "active enabled"
    binary: plan.BinaryWanted = RELEASE
    changed: frozenset[str] = field(default_factory=frozenset)


EVERYTHING = {n: as_wanted(n) for n in ("binary", "config", "unit")}
AGENT_ROWS = [
    Row("a fresh node", {n: None for n in EVERYTHING},
        {"binary": "fetch", "config": "write", "unit": "write"}, "restart", ("binary", "config", "unit"),
        unit="inactive unknown"),
    Row("a re-run: the node holds what is wanted", EVERYTHING,
        {"binary": "keep", "config": "keep", "unit": "keep"}, "keep"),
    Row("adoption: the script's agent.yaml says the same in other words",
        {**EVERYTHING, "config": Seen(sha("# by the script\n"), 0o644, "root:root", reads_as=sha("config"))},
        {"binary": "keep", "config": "keep", "unit": "keep"}, "keep"),
    Row("adoption: the script's agent.yaml says something else",
        {**EVERYTHING, "config": Seen(sha("other"), 0o644, "root:root")},
        {"binary": "keep", "config": "write", "unit": "keep"}, "restart", ("config",)),
    Row("a new version", {**EVERYTHING, "binary": as_wanted("binary", "the old release")},
        {"binary": "fetch", "config": "keep", "unit": "keep"}, "restart", ("binary",),
        changed=frozenset({"version"})),
    Row("a new version pushed from here (fetch: operator)", {**EVERYTHING, "binary": as_wanted("binary", "old")},
        {"binary": "push", "config": "keep", "unit": "keep"}, "restart", ("binary",),
        binary=plan.BinaryWanted(plan.Do.PUSH, {"amd64": sha("binary")}, "v1.2.3")),
    Row("a dev build, changed", {**EVERYTHING, "binary": as_wanted("binary", "old build")},
        {"binary": "copy", "config": "keep", "unit": "keep"}, "restart", ("binary",),
        binary=plan.BinaryWanted(plan.Do.COPY, {"": sha("binary")})),
    Row("drift: the binary's mode", {**EVERYTHING, "binary": Seen(sha("binary"), 0o777, "root:root")},
        {"binary": "repair", "config": "keep", "unit": "keep"}, "keep"),
    Row("drift: agent.yaml's owner", {**EVERYTHING, "config": Seen(sha("config"), 0o644, "nobody:root")},
        {"binary": "keep", "config": "repair", "unit": "keep"}, "keep"),
    Row("drift: the agent stopped and disabled", EVERYTHING,
        {"binary": "keep", "config": "keep", "unit": "keep"}, "start", unit="inactive disabled"),
    Row("drift: the binary replaced and the agent stopped", {**EVERYTHING, "binary": as_wanted("binary", "evil")},
        {"binary": "fetch", "config": "keep", "unit": "keep"}, "restart", ("binary",), unit="failed enabled"),
    Row("drift: the unit file deleted", {**EVERYTHING, "unit": None},
        {"binary": "keep", "config": "keep", "unit": "write"}, "restart", ("unit",)),
]


@pytest.mark.parametrize("row", AGENT_ROWS, ids=[r.situation for r in AGENT_ROWS])
def test_agent_plan(row: Row) -> None:
    seen = Observed({PATHS[n].path: s for n, s in row.seen.items()}, row.unit)
    made = plan.agent_plan("gpu-01", AGENT_WANTED, seen, "amd64", row.binary, row.changed)
    assert {NAMES[s.path]: s.do.value for s in made.steps} == row.expected
    assert made.unit.value == row.agent
    assert tuple(NAMES[p] for p in made.rollback) == row.rollback
    # Every step says what the node held when the plan was made: the script re-checks it under the lock.
    assert {NAMES[s.path]: s.before for s in made.steps} == \
        {n: s.record() if s else "absent" for n, s in row.seen.items()}


def test_a_release_without_a_digest_for_the_nodes_architecture_is_refused() -> None:
    seen = Observed({PATHS[n].path: s for n, s in EVERYTHING.items()}, "active enabled")
    with pytest.raises(errors.ChecksumMismatchError, match="no line for llmgw-v1.2.3-linux-arm64"):
        plan.agent_plan("gpu-01", AGENT_WANTED, seen, "arm64", RELEASE)


IDENTITY = ("ca", "cert", "key", "trust_anchor")


def identity_wanted(**contents: str) -> Wanted:
    ca = contents.get("ca", "ca")
    return Wanted({PATHS[n].path: want(n, ca if n in ("ca", "trust_anchor") else contents.get(n, n)) for n in IDENTITY})


IDENTITY_ROWS: list[tuple[str, dict[str, Any], dict[str, Seen | None], bool, dict[str, str], str, bool]] = [
    # situation, wanted contents, seen, key made on the node, steps, agent, update-ca-certificates
    ("a fresh node", {}, {n: None for n in IDENTITY}, False,
     {"ca": "write", "cert": "write", "key": "write", "trust_anchor": "write"}, "keep", True),
    ("a re-run", {}, {n: as_wanted(n, "ca" if n == "trust_anchor" else n) for n in IDENTITY}, False,
     {n: "keep" for n in IDENTITY}, "keep", False),
    ("a renewal", {"cert": "new cert", "key": "new key"},
     {n: as_wanted(n, "ca" if n == "trust_anchor" else n) for n in IDENTITY}, False,
     {"ca": "keep", "cert": "write", "key": "write", "trust_anchor": "keep"}, "restart", False),
    ("a rotated CA", {"ca": "new ca"}, {n: as_wanted(n, "ca" if n == "trust_anchor" else n) for n in IDENTITY}, False,
     {"ca": "write", "cert": "keep", "key": "keep", "trust_anchor": "write"}, "restart", True),
    ("drift: the key's mode", {},
     {**{n: as_wanted(n, "ca" if n == "trust_anchor" else n) for n in IDENTITY}, "key": Seen(sha("key"), 0o644, "root:root")},
     False, {"ca": "keep", "cert": "keep", "key": "repair", "trust_anchor": "keep"}, "keep", False),
    ("the key made on the node, a renewal", {"cert": "new cert"},
     {n: as_wanted(n, "ca" if n == "trust_anchor" else n) for n in IDENTITY}, True,
     {"ca": "keep", "cert": "write", "key": "node-key", "trust_anchor": "keep"}, "restart", False),
]


@pytest.mark.parametrize("situation,contents,seen,on_node,steps,agent,trust", IDENTITY_ROWS,
                         ids=[r[0] for r in IDENTITY_ROWS])
def test_identity_plan(situation: str, contents: dict[str, str], seen: dict[str, Seen | None], on_node: bool,
                       steps: dict[str, str], agent: str, trust: bool) -> None:
    wanted = identity_wanted(**contents)
    made = plan.identity_plan("gpu-01", wanted, Observed({PATHS[n].path: s for n, s in seen.items()}), on_node)
    assert {NAMES[s.path]: s.do.value for s in made.steps} == steps, situation
    assert (made.unit.value, made.trust) == (agent, trust), situation
    assert made.rollback == (), "NodeIdentity renames each file into place: it has no rollback point"


def test_a_plan_reads_as_short_text() -> None:
    seen = Observed({**{PATHS[n].path: s for n, s in EVERYTHING.items()},
                     PATHS["binary"].path: as_wanted("binary", "old")}, "active enabled")
    text = plan.render(plan.agent_plan("gpu-01", AGENT_WANTED, seen, "amd64", RELEASE, frozenset({"version"})))
    assert text.splitlines() == [
        "gpu-01:",
        "  fetch    /usr/local/bin/llmgw  (version changed)",
        "  keep     /etc/llmgw/agent.yaml  (as wanted)",
        "  keep     /etc/systemd/system/llmgw-agent.service  (as wanted)",
        "  agent: restart",
        "  rollback point: the previous /usr/local/bin/llmgw, until the agent stayed up",
    ]
