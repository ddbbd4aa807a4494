"""The fleet review (llmgw_pulumi.preview.changes) as Markdown for a pull-request comment, and the policy pack's
verdict beside it (pure).

One screen: a table of what the nodes go through, with their ids (long lists
folded, runs of numbered ids shortened), each trust root the change changes a
row of its own (``trust_roots``: old -> new, as fingerprints); which agents will restart, in the
order the rollout lets them, and which restart outside it; the agent.yaml
lines that change, the files repaired and the standing problems, each list
capped. ``policy_verdict`` turns the ``Policies:`` block that `pulumi preview
--policy-pack` prints (the preview's JSON holds no policy results) into a
verdict and one line per rule violated, with the resources it names folded.

Every value read from the preview or the policy pack's output (node ids,
versions, agent.yaml lines, paths, what nodes printed, the pack's messages)
is written through ``text.inert``, as a code span: whatever Markdown or HTML
it holds is shown, not rendered. A table row escapes the ``|`` that would
end its cell (``_row``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import decisions
from ..releases.policy import OPT_OUT_SETTING
from ..text import inert, printable
from .changes import REISSUE_WHY, FleetReview, NodeReview, natural

FOLD_AFTER = 8
"""Node ids are shown with runs of numbered ids shortened (``gpu-001..040``); when that leaves more entries than
this, the list is folded (``<details>``)."""
MAX_CONFIG_DIFFS = 5
"""Distinct agent.yaml changes shown; the rest are counted."""
MAX_PROBLEMS = 10


def fold_ids(ids: Sequence[str]) -> str:
    """Node ids as Markdown, runs shortened: all of them when that is few, else the first ones with the whole list
    folded."""
    if not ids:
        return "none"
    ranges = _ranges(ids)
    shown = ", ".join(inert(i) for i in ranges)
    if len(ranges) <= FOLD_AFTER:
        return shown
    head = ", ".join(inert(i) for i in ids[:3])
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


def _row(*cells: str) -> str:
    """One row of a GFM table. GFM splits a row into cells before it reads code spans, so a ``|`` in a cell, even
    in a code span, is escaped (``\\|``): in a code span it then shows as ``|``."""
    return "| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |"


def _onboarding(node: NodeReview) -> str:
    """What a node is onboarded with: ``agent `v1.4.2`, fabric `ib-east`, host key pinned``."""
    version = f"agent {inert(node.version)}" if node.version else "agent version not known yet"
    if node.local_build:
        version += " (a local build)"
    fabrics = f"fabric{'s' if len(node.fabrics) > 1 else ''} {', '.join(inert(f) for f in node.fabrics)}" \
        if node.fabrics else "no fabric"
    trust = f"host key {node.host_keys[0]}" if node.host_keys else "host key trust not known"
    if node.host_keys[1:]:
        trust += f", jump host keys {', '.join(node.host_keys[1:])}"
    return f"{version}, {fabrics}, {trust}"


def markdown(fleet: FleetReview) -> str:
    """The summary, as Markdown for a pull-request comment."""
    g = fleet.group
    total = len(fleet.nodes)
    lines = [f"### Fleet change{f' — {inert(fleet.stack)}' if fleet.stack else ''}: {total} nodes", ""]
    upgrades: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        if r.upgrade:
            upgrades[r.upgrade].append(r.node)
    certs: dict[str, list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        for why in r.certificate:
            certs[why].append(r.node)
    trust: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        for change in r.trust_roots:
            trust[(change.setting, change.old, change.new)].append(r.node)
    onboarded: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in fleet.nodes.values():
        if r.onboarded:
            onboarded[("onboarded again (another machine)" if r.replaced else "onboarded", _onboarding(r))].append(r.node)
    rows = [
        *((f"{what}: {how}", sorted(ids, key=natural)) for (what, how), ids in sorted(onboarded.items())),
        *((f"agent upgraded {inert(a)} → {inert(b)}", sorted(ids, key=natural)) for (a, b), ids in sorted(upgrades.items())),
        ("config changed", g(lambda r: bool(r.config_lines))),
        *((f"certificate {'renewed' if why == REISSUE_WHY[decisions.EXPIRES] else 're-issued'} ({why})", sorted(ids, key=natural))
          for why, ids in sorted(certs.items())),
        ("files repaired after drift", g(lambda r: bool(r.repaired))),
        ("removed", g(lambda r: r.removed)),
        *((f"trust root {inert(setting)} changed: {inert(old)} → {inert(new)}", sorted(ids, key=natural))
          for (setting, old, new), ids in sorted(trust.items())),
        ("untouched", g(lambda r: r.untouched)),
    ]
    lines += ["| what the node goes through | nodes | ids |", "|---|---:|---|"]
    lines += [_row(what, str(len(ids)), fold_ids(ids)) for what, ids in rows if ids]
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

    unverified = fleet.group(lambda r: r.unverified_release)
    if unverified:
        lines.append(f"**Unverified releases** (`agent.{OPT_OUT_SETTING}`: no signature, no sha256 pin) "
                     f"({len(unverified)} nodes): {fold_ids(unverified)}")
        lines.append("")

    config = [r for r in fleet.nodes.values() if r.config_lines]
    if config:
        by_diff: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for r in config:
            by_diff[r.config_lines].append(r.node)
        lines.append("**agent.yaml changes:**")
        for diff, ids in sorted(by_diff.items(), key=lambda kv: -len(kv[1]))[:MAX_CONFIG_DIFFS]:
            lines += [f"- {fold_ids(sorted(ids, key=natural))}:", *(f"  - {inert(d)}" for d in diff)]
        if len(by_diff) > MAX_CONFIG_DIFFS:
            lines.append(f"- … and {len(by_diff) - MAX_CONFIG_DIFFS} other distinct changes")
        lines.append("")
    repaired = sorted((r for r in fleet.nodes.values() if r.repaired), key=lambda r: natural(r.node))
    if repaired:
        lines.append("**Files repaired:** " + "; ".join(
            f"{inert(r.node)}: {', '.join(inert(p) for p in r.repaired)}" for r in repaired[:MAX_PROBLEMS]))
        lines.append("")

    problems = [(r.node, p) for r in fleet.nodes.values() for p in r.problems]
    unreadable = [(r.node, p) for r in fleet.nodes.values() for p in r.unreadable]
    if problems or unreadable:
        lines.append("**Standing problems:**")
        for title, found in (("engines and hardware", problems), ("could not be read", unreadable)):
            if found:
                ids = sorted({n for n, _ in found}, key=natural)
                lines.append(f"- {title} ({len(ids)} nodes): {fold_ids(ids)}")
                lines += [f"  - {inert(n)}: {inert(p)}" for n, p in sorted(found, key=lambda x: natural(x[0]))[:MAX_PROBLEMS]]
                if len(found) > MAX_PROBLEMS:
                    lines.append(f"  - … {len(found) - MAX_PROBLEMS} more")
        lines.append("")
    return "\n".join(lines)


def failed_markdown(stack: str, status: int, unreadable: str | None, errors: Sequence[tuple[str, str]]) -> str:
    """The summary of a preview that failed (``status``, not 0) or whose JSON could not be read (``unreadable``
    says why): it says so in its first line, and lists the preview's errors, (node id or "", message)."""
    why = [f"exit status {status}"] if status else []
    why += [unreadable] if unreadable else []
    lines = [f"### Fleet change{f' — {inert(stack)}' if stack else ''}: the preview FAILED ({'; '.join(why)})", "",
             "This summary cannot say what the change does to the fleet: the preview did not plan all of it.", ""]
    if errors:
        lines.append(f"**The preview's errors** ({len(errors)}):")
        lines += [f"- {inert(node) + ': ' if node else ''}{inert(message)}" for node, message in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            lines.append(f"- … {len(errors) - MAX_PROBLEMS} more (see the job's log)")
    else:
        lines.append("**The preview's errors:** none was found in its JSON or its log (see the job's log).")
    lines.append("")
    return "\n".join(lines)


POLICY_LEVELS = ("mandatory", "advisory")
PACK_LINE = re.compile(r" {4}(\S+) \S+@v\S+.*")
"""A policy pack's line in the CLI's ``Policies:`` block: ``    ❌ llmgw-fleet@v0.1.0 (local: ...)``."""
VIOLATION_LINE = re.compile(r" {8}- \[(mandatory|advisory)\](?: \[severity: [^]]*\])?  (\S+)(?:  \(\S+: (.*)\))?")
"""A violation's first line: ``        - [mandatory]  release-verified  (pulumi-python:dynamic/llmgw:AgentInstall: gpu-01)``;
a stack-level violation names no resource. The CLI indents each line of the violation's message (the rule's
description, then what the rule reported) by ten spaces, so nothing a message holds can make a line of this
shape."""
MESSAGE_INDENT = " " * 10


@dataclass
class RuleViolations:
    """One rule's violations in a policy run: the resources it names, and what it reported of them."""

    level: str
    rule: str
    count: int = 0
    ids: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    """Distinct, in the order reported, each without the resource's name it starts with."""


def policy_violations(block: Sequence[str]) -> tuple[bool, dict[tuple[str, str], RuleViolations]]:
    """(a pack says it failed, each rule's violations by (level, rule)) from the lines of a ``Policies:`` block."""
    failed_pack = False
    rules: dict[tuple[str, str], RuleViolations] = {}
    current: tuple[RuleViolations, str | None, list[str]] | None = None

    def done() -> None:
        if current is None:
            return
        rule, name, message = current
        said = " ".join(message[1:]) or " ".join(message)  # the rule's description first, then what it reported
        if name and said.startswith(f"{name}: "):
            said = said.removeprefix(f"{name}: ")
        if said and said not in rule.messages:
            rule.messages.append(said)

    for line in block:
        violation = VIOLATION_LINE.fullmatch(line)
        if current is not None and line.startswith(MESSAGE_INDENT):
            current[2].append(line.strip())
            continue
        done()
        current = None
        if violation:
            level, name, resource = violation.groups()
            rule = rules.setdefault((level, name), RuleViolations(level, name))
            rule.count += 1
            if resource is not None and resource not in rule.ids:
                rule.ids.append(resource)
            current = (rule, resource, [])
        elif PACK_LINE.fullmatch(line) and line.split()[0] == "\u274c":
            failed_pack = True
    done()
    return failed_pack, rules


def policy_verdict(cli_output: str) -> str:
    """The ``Policies:`` block of a `pulumi preview --policy-pack` run, as Markdown (a preview's JSON holds no
    policy results): the verdict, then one line per rule violated, mandatory and advisory apart, with the
    resources it names folded and what it reported of them."""
    lines = printable(cli_output, keep="\n").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Policies:"), None)
    if start is None:
        return "**Policies:** the policy preview printed no verdict (see the job's log)."
    block = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        block.append(line)
    failed_pack, rules = policy_violations(block)
    failed = failed_pack or any(level == "mandatory" for level, _ in rules)
    verdict = "a mandatory rule is violated" if failed else "no mandatory rule is violated"
    out = [f"**Policies: {verdict}** ({sum(r.count for r in rules.values())} violations)", ""]
    for level in POLICY_LEVELS:
        violated = sorted((r for r in rules.values() if r.level == level), key=lambda r: r.rule)
        if violated:
            out.append(f"{level.capitalize()} rules violated:")
            out += [_rule_line(r) for r in violated]
            out.append("")
    if failed_pack and not any(r.level == "mandatory" for r in rules.values()):
        out += ["A policy pack failed without a violation this summary could read: see the job's log.", ""]
    return "\n".join(out).rstrip("\n")


def _rule_line(rule: RuleViolations) -> str:
    ids = sorted(rule.ids, key=natural)
    said = inert(rule.messages[0]) if rule.messages else "(no message)"
    others = f" (and {len(rule.messages) - 1} other messages: see the job's log)" if len(rule.messages) > 1 else ""
    where = f"{len(ids)} nodes: {fold_ids(ids)}" if len(ids) > 1 else fold_ids(ids) if ids else "the stack"
    return f"- {inert(rule.rule)} ({rule.count}): {said}{others} — on {where}"
