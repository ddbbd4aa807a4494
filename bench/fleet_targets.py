"""Issue 21's targets at 1,000 nodes, each from the runs of one or more benchmark runs, for the one-screen summary.

Pure: measured runs in, Targets out. One stack first; where the issue allows meeting a target by splitting the
fleet into stacks per failure domain, the split's figure follows on its own line, so a reader sees both.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench import growth
from bench.backend import backend_kind
from bench.config import NOOP, PREVIEW, UP
from bench.daily import (
    ADD,
    AT_ONCE_NOOP,
    AT_ONCE_UP,
    DAILY,
    REMOVE,
    ROLLOUT_ADDED,
    UPGRADE,
    UPGRADE_AGAIN,
    UPGRADE_CANARY,
    is_change,
    upgraded_count,
)
from bench.measure import Result
from bench.summary import Target
from bench.targets import operator_cpu

FLEET_N = 1000
"""Issue 21's targets are set at 1,000 nodes."""
STATE_LIMIT_21 = 10_000
"""Bytes of state per node without PEM bodies (issue 21: 10 KB)."""
QUICK_S = 20.0
"""No-op `up` and `preview` of the fleet, seconds."""
CHANGE_S = 60.0
"""Upgrading 10 agents, or adding 10 nodes, seconds."""
CPU_PER_NODE = 0.25
"""Operator CPU-s per node of an `up` from scratch."""


def _run(results: Sequence[Result], size: int, kind: str, stacks: int = 1, backend: str | None = None
         ) -> Result | None:
    """The successful plain-bridge run of `kind` at `size` with `stacks` stacks (default provider count), against
    `backend` if given."""
    return next((r for r in results if r.ok and r.size == size and r.kind == kind and r.stacks == stacks
                 and r.delay_ms == 0 and r.shards is None and backend in (None, r.backend)), None)


def splits_measured(results: Sequence[Result], size: int) -> list[tuple[int, str]]:
    """The stack counts above 1 measured at `size`, each with the backend it ran against, smallest count first."""
    return sorted({(r.stacks, r.backend) for r in results if r.size == size and r.stacks > 1})


def daily_growth(results: Sequence[Result], kind: str) -> tuple[float | None, str]:
    """The growth exponent of a daily change's engine CPU over the one-stack sizes measured, and its points."""
    points = sorted((r.size, r.cpu.engine) for r in results
                    if r.ok and r.kind == kind and r.stacks == 1 and r.delay_ms == 0 and r.shards is None)
    shown = ", ".join(f"{n}: {cpu:.1f}" for n, cpu in points) + " CPU-s"
    return growth.exponent(points), shown  # None with fewer than two sizes


def issue21_targets(results: Sequence[Result], n: int = FLEET_N) -> list[Target]:
    """Issue 21's targets at `n` nodes: one stack, then each split measured (K stacks; a daily change on one)."""
    wall = lambda r: None if r is None else r.wall  # noqa: E731
    splits = splits_measured(results, n)
    # A page of runs against several backends says on each split's line which one it ran against.
    several = len({b for _, b in splits}) > 1
    where = lambda b: f" ({backend_kind(b)})" if several else ""  # noqa: E731
    out: list[Target] = []

    def timed(kind: str, short: str, limit: float) -> None:
        """The one-stack run's wall time against `limit`, then the same change on one stack of each split."""
        r = _run(results, n, kind)
        out.append(Target(f"{n} nodes, 1 stack: {short}, s", wall(r), limit))
        for k, b in splits:
            rk = _run(results, n, f"{kind}, one stack of {k}", k, b)
            out.append(Target(f"{n} in {k} stacks{where(b)}, one stack: {short}, s", wall(rk), limit))

    def runs(kinds: tuple[str, ...], k: int, b: str) -> list[Result]:
        """Every run, failed or not, of one of `kinds` with the fleet as `k` stacks against `b`."""
        return [r for r in results if r.size == n and r.stacks == k and r.backend == b and r.kind in kinds]

    # A split measured one rack alone (--rack-of) has no lines for all its stacks at once; a run at once that
    # failed says so on its line instead of "not measured".
    at_once = [(k, b) for k, b in splits if runs((AT_ONCE_UP, AT_ONCE_NOOP), k, b)]

    def failed(kind: str, k: int, b: str) -> str:
        return "its run failed" if any(not r.ok for r in runs((kind,), k, b)) else ""

    timed(NOOP, "no-op up", QUICK_S)
    timed(PREVIEW, "preview", QUICK_S)
    for k, b in at_once:
        r = _run(results, n, AT_ONCE_NOOP, k, b)
        out.append(Target(f"{n} nodes, {k} stacks at once{where(b)}: no-op up, s", wall(r), QUICK_S,
                          measured="" if r else failed(AT_ONCE_NOOP, k, b)))
    agents = upgraded_count(n)
    # The rows of earlier runs (llmgw:rollout new, then kept) where no run measured the current daily upgrade.
    def made(change: str) -> bool:
        return any(r.ok and r.size == n and is_change(r.kind, change) for r in results)

    if made(UPGRADE_CANARY) or not made(UPGRADE):
        timed(UPGRADE_CANARY, f"{agents} upgraded, new canary", CHANGE_S)
    else:
        timed(UPGRADE, f"{agents} upgraded, rollout new", CHANGE_S)
        timed(UPGRADE_AGAIN, f"{agents} upgraded, rollout kept", CHANGE_S)
    timed(ADD, "10 nodes added", CHANGE_S)

    labels = {UPGRADE: "upgrade 1%", UPGRADE_AGAIN: "upgrade 1% more", ROLLOUT_ADDED: "rollout added",
              UPGRADE_CANARY: "upgrade 1%, new canary", ADD: "add 10", REMOVE: "remove 10"}
    earlier = (UPGRADE, UPGRADE_AGAIN)  # shown only where a run made them
    for kind in [k for k in DAILY if k not in earlier or any(r.kind == k for r in results)]:
        k, shown = daily_growth(results, kind)
        out.append(Target(f"daily change '{labels[kind]}': engine CPU growth exponent", k, 1.0, measured=shown,
                          digits=3))

    up = _run(results, n, UP)
    out.append(Target(f"{n} nodes, 1 stack: operator CPU-s/node (up)", None if up is None else operator_cpu(up) / n,
                      CPU_PER_NODE, measured="" if up is None else (
                          f"engine {up.cpu.engine:.0f} + provider {up.cpu.provider:.0f} + program {up.cpu.program:.0f}")))
    for k, b in at_once:
        rk = _run(results, n, AT_ONCE_UP, k, b)
        out.append(Target(f"{n} nodes, {k} stacks at once{where(b)}: operator CPU-s/node (up)",
                          None if rk is None else operator_cpu(rk) / n, CPU_PER_NODE,
                          measured=failed(AT_ONCE_UP, k, b) if rk is None else f"engine {rk.cpu.engine:.0f} + "
                          f"provider {rk.cpu.provider:.0f} + program {rk.cpu.program:.0f}"))

    with_state = [r for r in results if r.ok and r.kind == UP and r.state is not None and r.stacks == 1]
    largest = max(with_state, key=lambda r: r.size, default=None)
    out.append(Target(f"{largest.size if largest else n} nodes: state B/node w/o PEM",
                      None if largest is None or largest.state is None else largest.state.per_node_no_pem,
                      STATE_LIMIT_21, measured="" if largest is None or largest.state is None
                      else f"{largest.state.per_node:,.0f} B/node with PEM bodies"))
    return out
