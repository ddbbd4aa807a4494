"""Issue 21's runs: the daily changes on an onboarded fleet, and several stacks at once against one backend.

- Daily changes (`--daily`, after the scale runs of each size, on the same stack):
  `llmgw:rollout: {maxParallel: 2}` added to the config (every AgentInstall is
  given its share of it: state only, no node touched; an operator does this
  once), then 1% of the agents (at least one) upgraded to UPGRADE_RELEASE with
  the first of them named the canary (what each day's upgrade is: only the
  upgraded nodes' inputs change, the canary's share included), then
  DAILY_NODES nodes added (hosts booted with the fleet, idle until then), then
  DAILY_NODES nodes of the original fleet removed. At most half the fleet is
  added or removed in a small run (10 nodes of 10 would leave nothing).
  Results of earlier runs may hold UPGRADE and UPGRADE_AGAIN instead: the 1%
  with llmgw:rollout new in the config, then the next 1% with it kept.
- Stacks at once (`--stacks 1,4,8`, at each of `--stack-sizes`, the scale
  sizes by default): the N nodes split round-robin over K stacks of one
  project and one backend, whose `pulumi up` from scratch, then no-op
  `pulumi up`, run side by side as K CI jobs would. One measured run covers
  all K: wall time until the last one ends, CPU of all engines, providers and
  programs, the state of all K, and the bytes all K wrote to the backend.
  With `--daily`, one of the K stacks (one rack's) then runs alone: a no-op
  `up`, a `preview`, and the same daily changes (1% of the whole fleet's
  agents upgraded, all in that rack, 10 nodes added to it, 10 removed from
  it), as an operator changes one failure domain; the other stacks do not run.

Each run checks that the engine did what the change is (updates, creates,
deletes); a run that did not is marked failed, with what the engine reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from bench.config import NOOP, PREVIEW, RESUMED, RESUMES, UP, UPGRADE_RELEASE
from bench.measure import Result, parallel

if TYPE_CHECKING:
    from bench.harness import Harness
    from lab.stack import LabStack

DAILY_NODES = 10
GRPC_LOG_VAR = "PULUMI_DEBUG_GRPC"
"""The engine logs every gRPC call it makes or serves to this file (--grpc-log)."""
UPGRADE = "daily: 1% of agents upgraded (llmgw:rollout)"
UPGRADE_AGAIN = "daily: 1% more agents upgraded, llmgw:rollout kept"
ROLLOUT_ADDED = "daily: llmgw:rollout added (state only)"
UPGRADE_CANARY = "daily: 1% of agents upgraded, a new canary"
ADD = "daily: nodes added"
REMOVE = "daily: nodes removed"
AT_ONCE_UP = "pulumi up, from scratch, stacks at once"
AT_ONCE_NOOP = "pulumi up, no-op, stacks at once"
AT_ONCE_RESUME = f"{RESUMED}, stacks at once"
DAILY = (UPGRADE, UPGRADE_AGAIN, ROLLOUT_ADDED, UPGRADE_CANARY, ADD, REMOVE)
#: What the engine's summary must show for each change: the operation, at least once.
EXPECTED_OP = {UPGRADE: "update", UPGRADE_AGAIN: "update", UPGRADE_CANARY: "update", ADD: "create", REMOVE: "delete"}
#: Changes that must touch no node: the engine's summary shows nothing but same steps.
STATE_ONLY = (ROLLOUT_ADDED,)

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


def is_change(kind: str, change: str) -> bool:
    """A run's kind is this daily change, with or without a suffix (", one stack of 8")."""
    return kind == change or kind.startswith(change + ",")


def expected_op(kind: str) -> str | None:
    """The operation a daily change's run must show."""
    return next((op for change, op in EXPECTED_OP.items() if is_change(kind, change)), None)


def removed_ids(fleet: Sequence[Any], upgraded: int, count: int) -> set[str]:
    """The last `count` nodes of `fleet`, never one of its first `upgraded` (the canary stays), and never all."""
    removable = list(fleet[upgraded:])[-count:] if count else []
    if len(removable) >= len(fleet):
        removable = removable[1:]
    return {h.hostname for h in removable}


def check_changes(result: Result) -> None:
    """Mark a daily change failed when the engine's summary lacks the operation the change is, or when a
    state-only change did anything but same steps."""
    want = expected_op(result.kind)
    changes = result.detail.get("changes") or {}
    if result.ok and want is not None and not changes.get(want):
        result.ok = False
        result.note = (result.note + f" expected {want} steps, the engine reported {changes}").strip()
    state_only = any(is_change(result.kind, k) for k in STATE_ONLY)
    if result.ok and state_only and (set(changes) - {"same"} or result.ssh):
        result.ok = False
        result.note = (result.note + f" expected same steps only and no SSH connection, the engine reported "
                                     f"{changes} and the hosts accepted {result.ssh}").strip()


def changes(bench: Harness, size: int, stack: LabStack, fleet: Sequence[Any], extra: Sequence[Any],
            of_stacks: int = 1) -> None:
    """The daily changes (DAILY), one after another, on `stack` (onboarded with `fleet`); `extra` are idle hosts.

    `size` is the whole fleet's: 1% of it is upgraded. With `of_stacks` > 1, `stack` is one of that many stacks
    holding the fleet (`fleet` is its share), and the rows say so.
    """
    suffix = f", one stack of {of_stacks}" if of_stacks > 1 else ""
    config = bench.stack_config([(h.hostname, h.addr) for h in fleet])
    upgraded = list(fleet[:min(upgraded_count(size), len(fleet))])
    everyone = [*fleet, *extra]

    def run(scenario: str, tag: str, agent_hosts: Sequence[Any], note: str) -> Result:
        stack.set_config(config)
        log = f"n{size}-daily-{tag}" + (f"-k{of_stacks}" if of_stacks > 1 else "")
        r = bench.measure(size, scenario + suffix, everyone, partial(bench.engine_run, stack, "up", log),
                          agents=bool(agent_hosts), agent_hosts=agent_hosts)
        r.stacks = of_stacks
        r.note = (note + (f", in a stack of {len(fleet)}" if of_stacks > 1 else "") + " " + r.note).strip()
        check_changes(r)
        bench.record_state(r, [stack])
        return r

    config["rollout"] = {"maxParallel": 2}
    run(ROLLOUT_ADDED, "rollout-added", [], "llmgw:rollout {maxParallel: 2} added: every AgentInstall's input "
        "changes (a same step each, written to the backend), no node is touched")
    config["rollout"]["canary"] = [upgraded[0].hostname]
    for node in config["nodes"][:len(upgraded)]:
        node["agent"] = {"version": UPGRADE_RELEASE}
    run(UPGRADE_CANARY, "upgrade", upgraded, f"{len(upgraded)} of {size} agents to {UPGRADE_RELEASE}, maxParallel 2, "
        f"{upgraded[0].hostname} the new canary: only the upgraded nodes' inputs change")
    config["nodes"] += bench.stack_config([(h.hostname, h.addr) for h in extra])["nodes"]
    run(ADD, "add", extra, f"{len(extra)} nodes added to {size}")
    removed = removed_ids(fleet, len(upgraded), len(extra))
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
    """`pulumi up` from scratch, then a no-op `up`, of `count` stacks side by side, the nodes split between them;
    with --daily, then the daily changes on the first of them alone."""
    extra = changed_count(size) if bench.daily else 0
    booted = bench.fresh_hosts(size + extra, reduced_ca=bench.reduced_ca)
    hosts, idle = booted[:size], booted[size:]
    groups = split(hosts, count)
    stacks = [bench.new_stack(f"at-once-n{size}-k{count}-{i}") for i in range(count)]
    for stack, group in zip(stacks, groups, strict=True):
        stack.set_config(bench.stack_config([(h.hostname, h.addr) for h in group]))

    def action(verb: str) -> tuple[bool, dict[str, Any]]:
        runs = parallel([partial(bench.engine_run, s, "up", f"n{size}-k{count}-{i}-{verb}") for i, s in enumerate(stacks)])
        return merged([d for _, d in runs], [ok for ok, _ in runs])

    def run(scenario: str, verb: str, agents: bool) -> Result:
        logged = bench.grpc_log and (verb == "up" or verb.startswith("resume"))
        for i, s in enumerate(stacks):
            if logged:
                s.env[GRPC_LOG_VAR] = str(bench.log_dir / f"n{size}-k{count}-{i}-{verb}.grpc.jsonl")
            else:
                s.env.pop(GRPC_LOG_VAR, None)
        r = bench.measure(size, scenario, hosts, partial(action, verb), agents=agents)
        r.stacks = count
        r.note = (f"{count} stack(s) of {', '.join(str(len(g)) for g in groups)} nodes "
                  + ("every engine gRPC call logged (--grpc-log) " if logged else "") + r.note).strip()
        bench.record_state(r, stacks)
        return r

    # A failed `up` tells the operator to run it again (onboarding resumes where each node is), as a CI job's
    # retries would (at most RESUMES): every stack again, the finished ones a no-op. Its agents connected
    # in one of the runs, so a resumed run does not wait for them; the no-op after it checks that nothing is left.
    ok = run(AT_ONCE_UP, "up", True).ok
    for attempt in range(RESUMES):
        if ok:
            break
        ok = run(AT_ONCE_RESUME, "resume" + (f"{attempt + 1}" if attempt else ""), False).ok
    if not ok:
        return
    if not run(AT_ONCE_NOOP, "noop", False).ok:  # its run() took the gRPC log off every stack
        return
    if extra:
        print(f"\n== N = {size}, one stack of {count} alone: no-op up, preview, the daily changes", flush=True)
        rack_runs(bench, size, count, stacks[0], groups[0], idle)


def rack_runs(bench: Harness, size: int, count: int, stack: LabStack, rack: Sequence[Any], idle: Sequence[Any],
              note: str = "") -> None:
    """One rack's stack of a `size`-node fleet in `count` stacks, alone: no-op up, preview, the daily changes."""
    alone = f", one stack of {count}"
    for scenario, verb in ((NOOP + alone, "up"), (PREVIEW + alone, "preview")):
        r = bench.measure(size, scenario, rack, partial(bench.engine_run, stack, verb,
                                                        f"n{size}-k{count}-alone-{verb}"))
        r.stacks = count
        r.note = (f"the stack of {len(rack)} nodes alone {note}" + r.note).strip()
        bench.record_state(r, [stack])
    changes(bench, size, stack, rack, idle, of_stacks=count)


def one_rack(bench: Harness, size: int, count: int) -> None:
    """Only one rack's stack of `size` nodes in `count` stacks: onboarded (its `up` from scratch, recorded at the
    rack's size), then as at_once's rack runs, recorded as one stack of `count` holding `size` nodes. The other
    stacks are not made: their state is their own, and no run of this stack reads it."""
    rack = len(split(range(size), count)[0])
    extra = changed_count(size)
    booted = bench.fresh_hosts(rack + extra, reduced_ca=bench.reduced_ca)
    hosts, idle = booted[:rack], booted[rack:]
    stack = bench.new_stack(f"rack-n{size}-k{count}")
    stack.set_config(bench.stack_config([(h.hostname, h.addr) for h in hosts]))
    up = bench.measure(rack, f"{UP}, one rack of {count}", hosts, partial(bench.engine_run, stack, "up",
                                                                        f"n{size}-k{count}-rack-up"), agents=True)
    up.note = (f"one rack's stack of {rack} nodes of a {size}-node fleet in {count} stacks " + up.note).strip()
    bench.record_state(up, [stack])
    if up.ok:
        rack_runs(bench, size, count, stack, hosts, idle, note=f"(measured alone: the other {count - 1} stacks "
                                                              "were not made) ")
