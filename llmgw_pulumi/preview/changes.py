"""What each node of the fleet goes through in a change, read from `pulumi preview --json` (pure).

The preview of a fleet is four resources per node with their property diffs;
``review`` reads them into one ``NodeReview`` per node (onboarded, upgraded,
reconfigured, re-issued and why, repaired, removed, restarting, its standing
problems), gathered in a ``FleetReview``. llmgw_pulumi.preview.markdown writes
it for a pull request, llmgw_pulumi.preview.rules judges it.

It reads the preview's JSON only (each step's old and new inputs and outputs,
the diagnostics) and reaches no node. The JSON does not carry the providers'
diff reasons, so a change is told by comparing old and new inputs by name: every
name read is in the block below, so a rename in the providers is one edit here.
Whatever came from a node (a hostname in agent.yaml, a problem, a warning) is
made printable (``text.printable``) as it is read.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import decisions
from ..config.schema import normalise  # engine values compared as the providers' diff compares them
from ..decisions import touches_node as touches_node  # what restarts the agent: the providers' decision
from ..releases import policy
from ..text import printable

if TYPE_CHECKING:
    from . import trust_roots

# --------------------------------------------------------------------------- names read from the preview
NODE_TYPE, CERTIFICATE, IDENTITY, AGENT, ENGINES = (decisions.NODE_TYPE, decisions.CERTIFICATE, decisions.IDENTITY,
                                                   decisions.AGENT, decisions.ENGINES)
"""The Node's type token, and the last part of each dynamic resource's (``pulumi-python:dynamic/llmgw:AgentInstall``),
as the providers declare them."""
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
"""How the engine's JSON writes a value a preview cannot know yet (a certificate still to be issued)."""
VERSION, BINARY_SHA256 = "version", "binary_sha256"
AGENT_YAML, DRIFT, ROLLOUT = "agent_yaml", "drift", "rollout"
MAX_PARALLEL, CANARY = "max_parallel", "canary"
KEY_ORIGIN = "key_origin"
CERT_PEM, KEY_PEM, SERIAL = "cert_pem", "key_pem", "serial"
PROBLEMS, PROBLEM, HINT = "problems", "problem", "hint"
CONNECTION, HOST_KEY, JUMP = "connection", "host_key", "jump"
FABRICS, FABRIC_NAME, BINARY_PATH = "fabrics", "name", "binary_path"
VERIFICATION = "verification"
"""How the agent's binary is verified, as the program records it (policy.VERIFICATIONS)."""
NEW_LOCAL_BUILD = "a new local build (its version is read by pulumi up)"
"""The new version of a local build a preview did not run (its version is empty there): another sha256."""
REISSUE_WHY = {decisions.EXPIRES: "expiry", decisions.CA_CHANGED: "CA rotation", decisions.KEY_LOST: "key lost",
               decisions.KEY_ORIGIN_CHANGED: "keyOrigin changed"}
"""How the summary names each reason of ``decisions.reissue``."""
PINNED, FIRST_USE = "pinned", "trusted on first use"
"""How a host key is trusted: pinned in the config (``hostKey``), or the first key seen recorded."""
# ---------------------------------------------------------------------------


@dataclass
class NodeReview:
    """What one node goes through in this change."""

    node: str
    onboarded: bool = False
    replaced: bool = False
    removed: bool = False
    upgrade: tuple[str, str] | None = None
    config_lines: tuple[str, ...] = ()
    certificate: tuple[str, ...] = ()
    """Why a new certificate is issued (REISSUE_WHY values); empty: none."""
    repaired: tuple[str, ...] = ()
    """The paths (or unit states) a refresh found drifted and this change puts back."""
    restart_gated: bool = False
    """The agent restarts in AgentInstall's update, under the rollout when one is set."""
    restart_ungated: bool = False
    """The agent restarts in NodeIdentity's update (a new certificate, repaired files): never under the rollout."""
    version: str | None = None
    """An onboarded node's agent version (AgentInstall's input), printable."""
    local_build: bool = False
    """The onboarded node's agent is a local build, copied as is (no release)."""
    fabrics: tuple[str, ...] = ()
    """The InfiniBand fabrics an onboarded node is cabled to, by name, printable."""
    host_keys: tuple[str, ...] = ()
    """How an onboarded node's host key, then each jump host's, is trusted (PINNED or FIRST_USE)."""
    rollout: Mapping[str, Any] | None = None
    trust_roots: tuple[trust_roots.Change, ...] = ()
    """The trust roots this change changes for the node (``trust_roots.Change``, sorted, each once). They touch no
    node: a node whose only change is here is still untouched."""
    problems: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    unverified_release: bool = False
    """Its agent installs a release nothing verifies (agent.allowUnverifiedRelease): the program's warning."""

    @property
    def restarts(self) -> bool:
        return self.restart_gated or self.restart_ungated

    @property
    def untouched(self) -> bool:
        return not (self.onboarded or self.removed or self.upgrade or self.config_lines or self.certificate
                    or self.repaired or self.restarts)


@dataclass
class FleetReview:
    nodes: dict[str, NodeReview]
    stack: str = ""

    def group(self, predicate: Callable[[NodeReview], bool]) -> list[str]:
        """The ids of the nodes ``predicate`` holds for, in natural order."""
        return sorted((n for n, r in self.nodes.items() if predicate(r)), key=natural)

    def restart_order(self) -> tuple[list[str], list[str], list[str], int | None]:
        """(canaries, then the others under the rollout, restarts outside any rollout, maxParallel)."""
        gated = [r for r in self.nodes.values() if r.restart_gated and not r.restart_ungated and r.rollout]
        rollout = gated[0].rollout if gated else None
        canaries = sorted((r.node for r in gated if r.rollout and r.rollout.get(CANARY) is True), key=natural)
        rest = sorted((r.node for r in gated if r.node not in canaries), key=natural)
        outside = self.group(lambda r: r.restarts and r.node not in canaries and r.node not in rest)
        max_parallel = (rollout or {}).get(MAX_PARALLEL)
        return canaries, rest, outside, int(max_parallel) if isinstance(max_parallel, (int, float)) else None


def natural(node_id: str) -> tuple[Any, ...]:
    """Sort key that puts gpu-2 before gpu-10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", node_id))


# --------------------------------------------------------------------------- reading the preview


def kind_of(urn: str) -> str:
    type_ = urn.split("::")[-2]
    return NODE_TYPE if type_.endswith(NODE_TYPE) and "$" not in type_ else type_.rsplit(":", 1)[-1]


def _node_of(urn: str) -> str:
    return urn.split("::")[-1]


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """Input names whose value differs, a connection field by field (``connection.user``); unknowns count."""
    found = set()
    for key in set(old) | set(new):
        a, b = old.get(key), new.get(key)
        if key == CONNECTION and isinstance(a, Mapping) and isinstance(b, Mapping):
            found |= {f"{CONNECTION}.{k}" for k in set(a) | set(b)
                      if normalise(a.get(k)) != normalise(b.get(k)) and not (k in ("host_key", "private_key", "private_key_path")
                                                                    and b.get(k) is None)}
        elif normalise(a) != normalise(b):
            found.add(key)
    return found


def certificate_reasons(old_in: Mapping[str, Any], old_out: Mapping[str, Any], new_in: Mapping[str, Any],
                        now: dt.datetime) -> tuple[str, ...]:
    """Why the same machine gets a new certificate (REISSUE_WHY values), from the recorded certificate and the new
    inputs: the providers' own decision (``decisions.reissue``)."""
    return tuple(REISSUE_WHY[r] for r in decisions.reissue({**old_in, **old_out}, new_in, now).reasons)


def config_lines(old: Any, new: Any) -> tuple[str, ...]:
    """The agent.yaml lines that change, as ``- old`` / ``+ new`` (comments left out), printable."""
    if not isinstance(old, str) or not isinstance(new, str) or new == UNKNOWN:
        return ()
    lines = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")) or line[1:].lstrip().startswith("#"):
            continue
        lines.append(printable(f"{line[0]} {line[1:]}"))
    return tuple(lines)


def _steps_by_urn(steps: Iterable[Mapping[str, Any]]) -> dict[str, tuple[list[Mapping[str, Any]], Mapping[str, Any]]]:
    """URN -> (its plan steps, what its refresh read: the refreshed state, or {}).

    A --refresh preview's plan steps start from the refreshed state. Without
    --show-sames the JSON lists no step for a resource that does not change: a
    node seen only in refresh steps (or in none) is untouched.
    """
    by_urn: dict[str, tuple[list[Mapping[str, Any]], dict[str, Any]]] = {}
    for step in steps:
        urn = step.get("urn")
        if not isinstance(urn, str):
            continue
        plan, refreshed = by_urn.setdefault(urn, ([], {}))
        if step.get("op") in ("refresh", "read"):
            refreshed.update(step.get("newState") or {})
        else:
            plan.append(step)
    return {urn: (plan, refreshed) for urn, (plan, refreshed) in by_urn.items()}


def review(preview: Mapping[str, Any], now: dt.datetime | None = None) -> FleetReview:
    """Every node's review, from the parsed JSON of `pulumi preview --json`."""
    now = now or dt.datetime.now(dt.UTC)
    nodes: dict[str, NodeReview] = {}
    stack = ""
    for urn, (steps, refreshed) in _steps_by_urn(preview.get("steps") or []).items():
        kind, name = kind_of(urn), _node_of(urn)
        if kind.endswith("Stack"):
            stack = urn.split("::")[0].removeprefix("urn:pulumi:")
            continue
        if kind not in (NODE_TYPE, CERTIFICATE, IDENTITY, AGENT, ENGINES):
            continue
        node = nodes.setdefault(name, NodeReview(name))
        ops = {s.get("op") for s in steps}
        step = steps[-1] if steps else {}
        old = step.get("oldState") or refreshed
        new = step.get("newState") or {}
        old_in, old_out, new_in = old.get("inputs") or {}, old.get("outputs") or {}, new.get("inputs") or {}
        if ops & {"create-replacement", "replace", "delete-replaced"}:
            node.onboarded = node.replaced = True
        elif "create" in ops:
            node.onboarded = True
        elif "delete" in ops:
            node.removed = True
        elif "update" in ops:
            _review_update(node, kind, old_in, old_out, new_in, now)
        if ops & {"create", "create-replacement", "replace"}:
            _review_onboarding(node, kind, new_in)
        _review_trust_roots(node, kind, steps)
        if kind == AGENT and isinstance(new_in.get(ROLLOUT), Mapping):
            node.rollout = new_in[ROLLOUT]
        if kind == ENGINES and not node.removed:
            source = old_out if not ops & {"update", "create", "create-replacement", "replace"} else {}
            for problem in source.get(PROBLEMS) or []:
                if isinstance(problem, Mapping):
                    node.problems.append(printable(problem_line(problem)))
    for diag in preview.get("diagnostics") or []:
        _diagnostic(nodes, diag)
    return FleetReview(nodes, stack)


def problem_line(problem: Mapping[str, Any]) -> str:
    """One standing problem with its fix; one of the readiness verdict's (llmgw_pulumi.health.readiness) says its
    severity first (``critical: GPU 3 (...) on gpu-01: a row remap pending; ...``)."""
    severity = f"{problem['severity']}: " if "check" in problem and problem.get("severity") else ""
    return f"{severity}{problem.get(PROBLEM)} (fix: {problem.get(HINT)})"


def _review_update(node: NodeReview, kind: str, old_in: Mapping[str, Any], old_out: Mapping[str, Any],
                   new_in: Mapping[str, Any], now: dt.datetime) -> None:
    changes = changed_inputs(old_in, new_in)
    drift = old_in.get(DRIFT)
    drifted = tuple(sorted(printable(str(p)) for p in drift)) if isinstance(drift, Mapping) else ()
    node.repaired = tuple(sorted({*node.repaired, *drifted}))
    if kind == CERTIFICATE:
        node.certificate = certificate_reasons(old_in, old_out, new_in, now)
    elif kind == AGENT:
        if {VERSION, BINARY_SHA256} & changes:
            node.upgrade = (str(old_in.get(VERSION)), str(new_in.get(VERSION) or NEW_LOCAL_BUILD))
        if AGENT_YAML in changes and not drifted:
            node.config_lines = config_lines(old_in.get(AGENT_YAML), new_in.get(AGENT_YAML))
        node.restart_gated = touches_node(changes) or bool(drifted)
    elif kind == IDENTITY:
        renewed = {CERT_PEM, KEY_PEM} & changes
        node.restart_ungated = bool(renewed or drifted) and touches_node(changes | set(drifted))


def _review_trust_roots(node: NodeReview, kind: str, steps: Iterable[Mapping[str, Any]]) -> None:
    """The trust roots a step that has both the recorded and the new inputs changes (an update, a resource left
    as it is, a replacement; not a creation or a deletion)."""
    from . import trust_roots  # it reads the names declared above

    for step in steps:
        old, new = step.get("oldState"), step.get("newState")
        if isinstance(old, Mapping) and isinstance(new, Mapping) and isinstance(new.get("inputs"), Mapping):
            found = trust_roots.changes(kind, old.get("inputs") or {}, new["inputs"])
            node.trust_roots = tuple(sorted({*node.trust_roots, *found}))
            return


def _review_onboarding(node: NodeReview, kind: str, new_in: Mapping[str, Any]) -> None:
    """What a node is onboarded with: its agent's version and fabrics, and how its host keys are trusted."""
    if kind == AGENT:
        node.version = printable(str(new_in[VERSION])) if new_in.get(VERSION) not in (None, "") else None
        node.local_build = bool(new_in.get(BINARY_PATH))
        fabrics = new_in.get(FABRICS)
        node.fabrics = tuple(printable(str(f.get(FABRIC_NAME))) for f in fabrics if isinstance(f, Mapping)) \
            if isinstance(fabrics, (list, tuple)) else ()
    elif kind == IDENTITY:
        connection = new_in.get(CONNECTION)
        if isinstance(connection, Mapping):
            jumps = connection.get(JUMP)
            hops = [h for h in jumps if isinstance(h, Mapping)] if isinstance(jumps, (list, tuple)) else []
            node.host_keys = tuple(PINNED if h.get(HOST_KEY) else FIRST_USE for h in (connection, *hops))


def preview_errors(preview: Mapping[str, Any], log: str = "") -> list[tuple[str, str]]:
    """What a failed preview said went wrong, as (node id or "", message), printable, each once: its diagnostics
    of severity error, then the ``error:`` lines of what it wrote to standard error (``log``)."""
    found: list[tuple[str, str]] = []
    for diag in preview.get("diagnostics") or []:
        if isinstance(diag, Mapping) and diag.get("severity") == "error":
            urn = diag.get("urn")
            urn = urn if isinstance(urn, str) and "::" in urn else ""
            of_node = urn and kind_of(urn) in (NODE_TYPE, CERTIFICATE, IDENTITY, AGENT, ENGINES)
            found.append((printable(_node_of(urn)) if of_node else "", _one_line(diag.get("message", ""))))
    found += [("", _one_line(line)) for line in log.splitlines() if line.strip().startswith("error:")]
    unique: list[tuple[str, str]] = []
    said: set[str] = set()
    for node, message in found:
        message = message.removeprefix("error: ")
        if message and message not in said:
            said.add(message)
            unique.append((node, message))
    return unique


def _one_line(message: Any) -> str:
    """A message on one line, its runs of white space one space, printable."""
    return printable(" ".join(str(message).split()))


def _diagnostic(nodes: dict[str, NodeReview], diag: Mapping[str, Any]) -> None:
    urn = diag.get("urn")
    if not isinstance(urn, str) or diag.get("severity") not in ("warning", "error"):
        return
    message = _one_line(diag.get("message", "")).removeprefix("warning: ")
    if kind_of(urn) == AGENT and policy.UNVERIFIED_WARNING in message:
        # Said under every node that opted out, changed or not: a node with no step is listed for it.
        nodes.setdefault(_node_of(urn), NodeReview(_node_of(urn))).unverified_release = True
        return
    node = nodes.get(_node_of(urn))
    if node is None:
        return
    unreadable = decisions.unreadable_reason(message)  # a refresh could not read the node, as the providers mark it
    if unreadable is not None:
        if unreadable not in node.unreadable:  # each of the node's resources says so
            node.unreadable.append(unreadable)
    elif kind_of(urn) == ENGINES and not any(p.split(" (fix: ")[0] in message for p in node.problems):
        node.problems.append(message)
