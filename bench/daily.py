"""Issue 21's runs: the daily changes on an onboarded fleet, and several stacks at once against one backend.

- Daily changes (`--daily`, after the scale runs of each size, on the same stack):
  1% of the agents (at least one) upgraded to UPGRADE_RELEASE with
  `llmgw:rollout: {maxParallel: 2, canary: [the first of them]}`, then
  DAILY_NODES nodes added (hosts booted with the fleet, idle until then), then
  DAILY_NODES nodes of the original fleet removed. At most half the fleet is
  added or removed in a small run (10 nodes of 10 would leave nothing).
- Stacks at once (`--stacks 1,4,8`, at each scale size): the N nodes split
  round-robin over K stacks of one project and one backend, whose `pulumi up`
  from scratch, then no-op `pulumi up`, run side by side as K CI jobs would.
  One measured run covers all K: wall time until the last one ends, CPU of all
  engines, providers and programs, the state of all K, and the bytes all K
  wrote to the backend.

Each run checks that the engine did what the change is (updates, creates,
deletes); a run that did not is marked failed, with what the engine reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from bench.config import UPGRADE_RELEASE
from bench.measure import Result, parallel

if TYPE_CHECKING:
    from bench.harness import Harness
    from lab.stack import LabStack

DAILY_NODES = 10
UPGRADE = "daily: 1% of agents upgraded (llmgw:rollout)"
ADD = "daily: nodes added"
REMOVE = "daily: nodes removed"
AT_ONCE_UP = "pulumi up, from scratch, stacks at once"
AT_ONCE_NOOP = "pulumi up, no-op, stacks at once"
DAILY = (UPGRADE, ADD, REMOVE)
#: What the engine's summary must show for each change: the operation, at least once.
EXPECTED_OP = {UPGRADE: "update", ADD: "create", REMOVE: "delete"}

T = TypeVar("T")


def upgraded_count(size: int) -> int:
    """1% of the agents, at least one."""
    return max(1, round(size / 100))


def changed_count(size: int) -> int:
    """Nodes added, and then removed, by the daily changes: DAILY_NODES, at most half the fleet."""
    return min(DAILY_NODES, max(1, size // 2))


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """Round-robin into `parts` non-empty lists."""
    if not 1 <= parts <= len(items):
        raise ValueError(f"cannot split {len(items)} nodes into {parts} stacks: give 1 to {len(items)} stacks")
    return [list(items[i::parts]) for i in range(parts)]


def check_changes(result: Result) -> None:
    """Mark a daily change failed when the engine's summary lacks the operation the change is."""
    want = EXPECTED_OP.get(result.kind)
    changes = result.detail.get("changes") or {}
    if result.ok and want is not None and not changes.get(want):
        result.ok = False
        result.note = (result.note + f" expected {want} steps, the engine reported {changes}").strip()


def changes(bench: Harness, size: int, stack: LabStack, fleet: Sequence[Any], extra: Sequence[Any]) -> None:
    """The three daily changes, one after another, on `stack` (onboarded with `fleet`); `extra` are idle hosts."""
    config = bench.stack_config([(h.hostname, h.addr) for h in fleet])
    upgraded = list(fleet[:upgraded_count(size)])
    config["rollout"] = {"maxParallel": 2, "canary": [upgraded[0].hostname]}
    for node in config["nodes"][:len(upgraded)]:
        node["agent"] = {"version": UPGRADE_RELEASE}
    everyone = [*fleet, *extra]

    def run(scenario: str, tag: str, agent_hosts: Sequence[Any], note: str) -> Result:
        stack.set_config(config)
        r = bench.measure(size, scenario, everyone, partial(bench.engine_run, stack, "up", f"n{size}-daily-{tag}"),
                          agents=bool(agent_hosts), agent_hosts=agent_hosts)
        r.note = (note + " " + r.note).strip()
        check_changes(r)
        bench.record_state(r, [stack])
        return r

    run(UPGRADE, "upgrade", upgraded, f"{len(upgraded)} of {size} agents to {UPGRADE_RELEASE}, maxParallel 2, 1 canary")
    config["nodes"] += bench.stack_config([(h.hostname, h.addr) for h in extra])["nodes"]
    run(ADD, "add", extra, f"{len(extra)} nodes added to {size}")
    removed = {h.hostname for h in fleet[len(fleet) - len(extra):]}  # never the upgraded ones (the canary stays)
    config["nodes"] = [n for n in config["nodes"] if n["id"] not in removed]
    run(REMOVE, "remove", [], f"{len(removed)} nodes removed of {size + len(extra)}")


def merged(details: Sequence[dict[str, Any]], oks: Sequence[bool]) -> tuple[bool, dict[str, Any]]:
    """One run's detail from the engine runs of several stacks run at once."""
    total: dict[str, Any] = {"stacks": list(details), "changes": {}}
    for d in details:
        for op, n in (d.get("changes") or {}).items():
            total["changes"][op] = total["changes"].get(op, 0) + n
    total["remote_ops"] = sum(d.get("remote_ops") or 0 for d in details)
    total["engine_run"] = any(d.get("engine_run") for d in details)
    notes = [d["note"] for d in details if d.get("note")]
    if notes:
        total["note"] = "; ".join(notes)
    return all(oks), total


def at_once(bench: Harness, size: int, count: int) -> None:
    """`pulumi up` from scratch, then a no-op `up`, of `count` stacks side by side, the nodes split between them."""
    hosts = bench.fresh_hosts(size, reduced_ca=bench.reduced_ca)
    groups = split(hosts, count)
    stacks = [bench.new_stack(f"at-once-n{size}-k{count}-{i}") for i in range(count)]
    for stack, group in zip(stacks, groups, strict=True):
        stack.set_config(bench.stack_config([(h.hostname, h.addr) for h in group]))

    def action(verb: str) -> tuple[bool, dict[str, Any]]:
        runs = parallel([partial(bench.engine_run, s, "up", f"n{size}-k{count}-{i}-{verb}") for i, s in enumerate(stacks)])
        return merged([d for _, d in runs], [ok for ok, _ in runs])

    for scenario, verb, agents in ((AT_ONCE_UP, "up", True), (AT_ONCE_NOOP, "noop", False)):
        r = bench.measure(size, scenario, hosts, partial(action, verb), agents=agents)
        r.stacks = count
        r.note = (f"{count} stack(s) of {', '.join(str(len(g)) for g in groups)} nodes " + r.note).strip()
        bench.record_state(r, stacks)
        if not r.ok:
            return
