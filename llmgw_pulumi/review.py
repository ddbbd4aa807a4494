"""A fleet change summary for a pull request: what each node goes through, from `pulumi preview --json`.

    pulumi preview --json --diff [--refresh] | python -m llmgw_pulumi.review > summary.md

The preview of a fleet is four resources per node with their property diffs;
this turns it into one screen of Markdown: how many nodes are onboarded,
upgraded (from which version to which), reconfigured (with the agent.yaml lines
that change), get a new certificate and why, have files repaired, are removed
or untouched; which agents will restart, in the order the rollout
(``llmgw:rollout``) lets them, and which restart outside it; the standing
problems (engines, hardware, nodes that could not be read); and the node ids
of each group, long lists folded.

It reads the preview's JSON only (each step's old and new inputs and outputs,
the diagnostics) and reaches no node. The JSON does not carry the providers'
diff reasons, so a change is told by comparing old and new inputs by name: every
name read is in the block below, so a rename in the providers is one edit here.
Whatever came from a node (a hostname in agent.yaml, a problem, a warning) is
printed through ``text.printable``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .providers._glue import normalise  # engine values compared as the providers' diff compares them
from .text import printable

# --------------------------------------------------------------------------- names read from the preview
NODE_TYPE = "llmgw:index:Node"
CERTIFICATE, IDENTITY, AGENT, ENGINES = "ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck"
"""The last part of each dynamic resource's type (``pulumi-python:dynamic/llmgw:AgentInstall``)."""
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
"""How the engine's JSON writes a value a preview cannot know yet (a certificate still to be issued)."""
VERSION, BINARY_SHA256 = "version", "binary_sha256"
AGENT_YAML, DRIFT, ROLLOUT = "agent_yaml", "drift", "rollout"
MAX_PARALLEL, CANARIES = "max_parallel", "canaries"
NOT_AFTER, RENEW_BEFORE_HOURS, CA_NOT_AFTER = "not_after", "renew_before_hours", "ca_not_after"
CA_FINGERPRINT, NODE_KEY, NODE_KEY_HELD, KEY_ORIGIN = "ca_fingerprint", "node_key", "held", "key_origin"
CERT_PEM, KEY_PEM, SERIAL = "cert_pem", "key_pem", "serial"
PROBLEMS, PROBLEM, HINT = "problems", "problem", "hint"
CONNECTION = "connection"
OPERATOR_SIDE = frozenset({"user", "wait", "jump", "private_key", "private_key_path", "passphrase"})
"""Connection fields that change only how the operator's side reaches a node: never a change to it."""
NOT_NODE_CHANGES = frozenset({"__provider", "__urn", "pki_dir", "signer", "known_jump_host_keys", "rollout",
                              "release_sha256", "signing_key", "release_ca", "fetch", "ca_key_passphrase", DRIFT})
"""Inputs whose change alone does not touch the node (how certificates are signed, how a release is verified
and carried, how updates are spread, what a refresh found)."""
UNREADABLE = ("cannot reach", "could not be read", "its state is kept as it was")
"""What the providers' warnings say when a refresh could not read a node."""
REISSUE_WHY = {"expiry": "expiry", "ca": "CA rotation", "key": "key lost", "origin": "keyOrigin changed"}
# ---------------------------------------------------------------------------

FOLD_AFTER = 8
"""A group of more node ids than this is folded (``<details>``), ranges of numbered ids shortened."""
MAX_CONFIG_DIFFS = 5
"""Distinct agent.yaml changes shown; the rest are counted."""
MAX_PROBLEMS = 10


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
    rollout: Mapping[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

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
        canary_order = list((rollout or {}).get(CANARIES) or [])
        canaries = [c for c in canary_order if any(r.node == c for r in gated)]
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


def touches_node(changes: Iterable[str]) -> bool:
    return any(c not in NOT_NODE_CHANGES and not (c.startswith(f"{CONNECTION}.") and c.split(".", 1)[1] in OPERATOR_SIDE)
               for c in changes)


def _parse_time(value: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def certificate_reasons(old_in: Mapping[str, Any], old_out: Mapping[str, Any], new_in: Mapping[str, Any],
                        now: dt.datetime) -> tuple[str, ...]:
    """Why the same machine gets a new certificate, from the recorded certificate and the new inputs."""
    reasons = []
    not_after, ca_not_after = _parse_time(old_out.get(NOT_AFTER)), _parse_time(old_out.get(CA_NOT_AFTER))
    before = new_in.get(RENEW_BEFORE_HOURS)
    if not_after and isinstance(before, (int, float)) and not (ca_not_after and not_after >= ca_not_after) \
            and not_after - dt.timedelta(hours=before) <= now:
        reasons.append(REISSUE_WHY["expiry"])
    old_ca = old_out.get(CA_FINGERPRINT) or old_in.get(CA_FINGERPRINT)
    if old_ca and new_in.get(CA_FINGERPRINT) and old_ca != new_in[CA_FINGERPRINT]:
        reasons.append(REISSUE_WHY["ca"])
    if old_out.get(NODE_KEY) not in (None, NODE_KEY_HELD) and new_in.get(KEY_ORIGIN, "node") == "node":
        reasons.append(REISSUE_WHY["key"])
    if old_in.get(KEY_ORIGIN, "node") != new_in.get(KEY_ORIGIN, "node"):
        reasons.append(REISSUE_WHY["origin"])
    return tuple(reasons)


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
        if kind == AGENT and isinstance(new_in.get(ROLLOUT), Mapping):
            node.rollout = new_in[ROLLOUT]
        if kind == ENGINES and not node.removed:
            source = old_out if not ops & {"update", "create", "create-replacement", "replace"} else {}
            for problem in source.get(PROBLEMS) or []:
                if isinstance(problem, Mapping):
                    node.problems.append(printable(f"{problem.get(PROBLEM)} (fix: {problem.get(HINT)})"))
    for diag in preview.get("diagnostics") or []:
        _diagnostic(nodes, diag)
    return FleetReview(nodes, stack)


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
            node.upgrade = (str(old_in.get(VERSION)), str(new_in.get(VERSION)))
        if AGENT_YAML in changes and not drifted:
            node.config_lines = config_lines(old_in.get(AGENT_YAML), new_in.get(AGENT_YAML))
        node.restart_gated = touches_node(changes) or bool(drifted)
    elif kind == IDENTITY:
        renewed = {CERT_PEM, KEY_PEM} & changes
        node.restart_ungated = bool(renewed or drifted) and touches_node(changes | set(drifted))


def _diagnostic(nodes: Mapping[str, NodeReview], diag: Mapping[str, Any]) -> None:
    urn = diag.get("urn")
    if not isinstance(urn, str) or diag.get("severity") not in ("warning", "error"):
        return
    node = nodes.get(_node_of(urn))
    if node is None:
        return
    message = printable(" ".join(str(diag.get("message", "")).split())).removeprefix("warning: ")
    if any(marker in message for marker in UNREADABLE):
        if message not in node.unreadable:  # each of the node's resources says so
            node.unreadable.append(message)
    elif kind_of(urn) == ENGINES and not any(p.split(" (fix: ")[0] in message for p in node.problems):
        node.problems.append(message)


# --------------------------------------------------------------------------- writing the summary


def fold_ids(ids: Sequence[str]) -> str:
    """Node ids as Markdown: all of them when few, else the first ones with the whole list folded."""
    if not ids:
        return "none"
    shown = ", ".join(f"`{i}`" for i in _ranges(ids))
    if len(ids) <= FOLD_AFTER:
        return shown
    head = ", ".join(f"`{i}`" for i in ids[:3])
    return f"{head}, … <details><summary>all {len(ids)}</summary>\n\n{shown}\n\n</details>"


def _ranges(ids: Sequence[str]) -> list[str]:
    """Runs of numbered ids with one prefix and width shortened: gpu-001, gpu-002, gpu-003 -> gpu-001..003."""
    out: list[str] = []
    run: list[tuple[str, str]] = []

    def flush() -> None:
        if len(run) >= 3:
            out.append(f"{run[0][0]}{run[0][1]}..{run[-1][1]}")
        else:
            out.extend(p + n for p, n in run)
        run.clear()

    for node_id in ids:
        m = re.fullmatch(r"(.*?)(\d+)", node_id)
        if m and run and m.group(1) == run[-1][0] and len(m.group(2)) == len(run[-1][1]) \
                and int(m.group(2)) == int(run[-1][1]) + 1:
            run.append((m.group(1), m.group(2)))
            continue
        flush()
        if m:
            run.append((m.group(1), m.group(2)))
        else:
            out.append(node_id)
    flush()
    return out


def markdown(fleet: FleetReview) -> str:
    """The summary, as Markdown for a pull-request comment."""
    g = fleet.group
    total = len(fleet.nodes)
    lines = [f"### Fleet change{f' — `{printable(fleet.stack)}`' if fleet.stack else ''}: {total} nodes", ""]
    upgrades: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        if r.upgrade:
            upgrades[r.upgrade].append(r.node)
    certs: dict[str, list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        for why in r.certificate:
            certs[why].append(r.node)
    rows = [
        ("onboarded", g(lambda r: r.onboarded and not r.replaced)),
        ("onboarded again (another machine)", g(lambda r: r.replaced)),
        *((f"agent upgraded {printable(a)} → {printable(b)}", sorted(ids, key=natural)) for (a, b), ids in sorted(upgrades.items())),
        ("config changed", g(lambda r: bool(r.config_lines))),
        *((f"certificate {'renewed' if why == REISSUE_WHY['expiry'] else 're-issued'} ({why})", sorted(ids, key=natural))
          for why, ids in sorted(certs.items())),
        ("files repaired after drift", g(lambda r: bool(r.repaired))),
        ("removed", g(lambda r: r.removed)),
        ("untouched", g(lambda r: r.untouched)),
    ]
    lines += ["| what the node goes through | nodes | ids |", "|---|---:|---|"]
    lines += [f"| {what} | {len(ids)} | {fold_ids(ids)} |".replace("\n", " ") for what, ids in rows if ids]
    lines.append("")

    canaries, rest, outside, max_parallel = fleet.restart_order()
    restarting = len(canaries) + len(rest) + len(outside)
    lines.append(f"**Agents that will restart: {restarting}**")
    if canaries or rest:
        limit = f"at most {max_parallel} at once" if max_parallel else "no limit on how many at once"
        lines.append(f"- under `llmgw:rollout` ({limit}), in this order:")
        if canaries:
            lines.append(f"  1. the canaries, in any order: {fold_ids(canaries)}")
        if rest:
            lines.append(f"  {2 if canaries else 1}. then, in any order: {fold_ids(rest)}")
    if outside:
        lines.append(f"- **without a rollout** ({len(outside)}): {fold_ids(outside)}")
    lines.append("")

    config = [r for r in fleet.nodes.values() if r.config_lines]
    if config:
        by_diff: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for r in config:
            by_diff[r.config_lines].append(r.node)
        lines.append("**agent.yaml changes:**")
        for diff, ids in sorted(by_diff.items(), key=lambda kv: -len(kv[1]))[:MAX_CONFIG_DIFFS]:
            lines += [f"- {fold_ids(sorted(ids, key=natural))}:", "  ```diff", *(f"  {d}" for d in diff), "  ```"]
        if len(by_diff) > MAX_CONFIG_DIFFS:
            lines.append(f"- … and {len(by_diff) - MAX_CONFIG_DIFFS} other distinct changes")
        lines.append("")
    repaired = [r for r in fleet.nodes.values() if r.repaired]
    if repaired:
        lines.append("**Files repaired:** " + "; ".join(
            f"`{r.node}`: {', '.join(r.repaired)}" for r in sorted(repaired, key=lambda r: natural(r.node))[:MAX_PROBLEMS]))
        lines.append("")

    problems = [(r.node, p) for r in fleet.nodes.values() for p in r.problems]
    unreadable = [(r.node, p) for r in fleet.nodes.values() for p in r.unreadable]
    if problems or unreadable:
        lines.append("**Standing problems:**")
        for title, found in (("engines and hardware", problems), ("could not be read", unreadable)):
            if found:
                ids = sorted({n for n, _ in found}, key=natural)
                lines.append(f"- {title} ({len(ids)} nodes): {fold_ids(ids)}")
                lines += [f"  - `{n}`: {p}" for n, p in sorted(found, key=lambda x: natural(x[0]))[:MAX_PROBLEMS]]
                if len(found) > MAX_PROBLEMS:
                    lines.append(f"  - … {len(found) - MAX_PROBLEMS} more")
        lines.append("")
    return "\n".join(lines)


MAX_POLICY_LINES = 60


def policy_verdict(cli_output: str) -> str:
    """The ``Policies:`` block of a `pulumi preview --policy-pack` run, as Markdown (a preview's JSON holds no
    policy results): each pack's verdict and every violation, under the resource it names."""
    lines = printable(cli_output, keep="\n").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Policies:"), None)
    if start is None:
        return "**Policies:** the policy preview printed no verdict (see the job's log)."
    block = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        block.append(line)
    while block and not block[-1].strip():
        block.pop()
    failed = any("\u274c" in line or "[mandatory]" in line for line in block)
    shown = block[:MAX_POLICY_LINES]
    if len(block) > MAX_POLICY_LINES:
        shown.append(f"    ... {len(block) - MAX_POLICY_LINES} more lines")
    verdict = "a mandatory rule is violated" if failed else "no mandatory rule is violated"
    violations = sum(1 for line in block if "[advisory]" in line or "[mandatory]" in line)
    return "\n".join([f"**Policies: {verdict}** ({violations} violations)", "",
                      "<details><summary>the policy pack's report</summary>", "", "```",
                      *(line.replace("`", "'") for line in shown), "```", "", "</details>"])


def main(argv: Sequence[str] | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw_pulumi.review", description=__doc__.splitlines()[0])
    parser.add_argument("preview", nargs="?", help="the JSON of `pulumi preview --json` (default: standard input)")
    parser.add_argument("--policy", metavar="FILE",
                        help="the output of `pulumi preview --policy-pack ...`: its verdict is appended")
    args = parser.parse_args(argv)
    text = Path(args.preview).read_text() if args.preview else stdin.read()
    try:
        preview = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"llmgw_pulumi.review: the input is not the JSON of `pulumi preview --json` ({e}); "
              "run `pulumi preview --json | python -m llmgw_pulumi.review`", file=sys.stderr)
        return 2
    stdout.write(markdown(review(preview)) + "\n")
    if args.policy:
        stdout.write(policy_verdict(Path(args.policy).read_text(errors="replace")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
