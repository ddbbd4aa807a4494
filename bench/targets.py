"""Issue 12's targets, the growth with N and its plots, and the provider-process and signer comparisons."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from bench import growth
from bench.config import (
    CHECKPOINTS_SKIPPED,
    DELAY_MS,
    FLOOR,
    LANGUAGE_UP,
    LANGUAGES,
    NOOP,
    PAR,
    PLOTTED,
    PREVIEW,
    SCALE_N,
    SEQ,
    SIGNED_UP,
    SIGNERS,
    STATE_LIMIT,
    TARGET_N,
    UP,
)
from bench.daily import DAILY
from bench.measure import Result
from bench.report import megabytes
from bench.summary import Target, fmt, ratio


def find(results: Sequence[Result], size: int, kind: str, delay_ms: int = 0, shards: int | None = None,
         full_ca: bool = False) -> Result | None:
    """The successful run of `kind` at `size` with this delay and provider count (and the full CA bundle)."""
    return next((r for r in results if r.ok and r.size == size and r.kind == kind and r.delay_ms == delay_ms
                 and r.shards == shards and not (full_ca and r.reduced_ca)), None)


def operator_cpu(r: Result) -> float:
    """Engine + provider + language host and program CPU-s: what the operator's machine spends on a pulumi run."""
    return r.cpu.engine + r.cpu.provider + r.cpu.program


def issue12_targets(results: Sequence[Result]) -> list[Target]:
    """Issue 12's targets as ratios from this run's results (None where the run was not measured)."""
    n, big, rtt = TARGET_N, SCALE_N, 2 * DELAY_MS
    get = lambda size, kind, delay=0: find(results, size, kind, delay)  # noqa: E731
    wall = lambda r: r.wall if r else None  # noqa: E731
    secs = lambda *rs: " / ".join("n/a" if r is None else f"{r.wall:.1f} s" for r in rs)  # noqa: E731
    up, floor = find(results, n, UP, full_ca=True), get(n, FLOOR)  # the floor's hosts keep the full bundle
    up_d, par_d, seq_d = get(n, UP, rtt), get(n, PAR, rtt), get(n, SEQ, rtt)
    out = [
        Target(f"{n} nodes: pulumi up / floor", ratio(wall(up), wall(floor)), 1.25, measured=secs(up, floor)),
        Target(f"{n} nodes, +{rtt} ms: script parallel / up", ratio(wall(par_d), wall(up_d)), 2.5, at_least=True,
               measured=secs(par_d, up_d)),
        Target(f"{n} nodes, +{rtt} ms: script sequential / up", ratio(wall(seq_d), wall(up_d)), 8, at_least=True,
               measured=secs(seq_d, up_d)),
        Target(f"{n} nodes: operator CPU-s per node (up)", None if up is None else operator_cpu(up) / n, 0.3,
               measured="" if up is None else (f"engine {up.cpu.engine:.1f} + provider {up.cpu.provider:.1f} "
                                               f"+ program {up.cpu.program:.1f} CPU-s")),
    ]
    for kind, short in ((NOOP, "no-op up"), (PREVIEW, "preview")):
        r30, r100 = get(n, kind), get(big, kind)
        out.append(Target(f"{big} nodes: {short}, s", wall(r100), 10, measured=secs(r100)))
        k = growth.exponent([(n, r30.wall), (big, r100.wall)]) if r30 and r100 else None
        out.append(Target(f"{n}->{big} nodes: {short} growth exponent", k, 1.0, measured=secs(r30, r100), digits=3))
    for size in (n, big):
        r = get(size, UP)
        out.append(Target(f"{size} nodes: SSH connections per node per up", None if r is None else r.ssh / size, 1.0,
                          measured="" if r is None else f"{r.ssh} connections"))
    with_state = [r for r in results if r.state is not None and r.delay_ms == 0 and r.shards is None]
    largest = max(with_state, key=lambda r: r.size, default=None)
    out.append(Target(f"{largest.size if largest else n} nodes: state B/node w/o PEM",
                      largest.state.per_node_no_pem if largest and largest.state else None, STATE_LIMIT,
                      measured="" if largest is None or largest.state is None
                      else f"{largest.state.per_node:,.0f} B/node with PEM bodies"))
    return out


def growth_figures(results: Sequence[Result]) -> list[growth.Figure]:
    """Each figure against N, one series per plotted run (plain bridge, default provider count)."""
    runs = [r for r in results if r.ok and r.delay_ms == 0 and r.shards is None and r.kind in PLOTTED]

    def series(value: Callable[[Result], float]) -> dict[str, list[tuple[float, float]]]:
        return {kind: sorted((r.size, value(r)) for r in runs if r.kind == kind) for kind in PLOTTED}

    ups = [r for r in runs if r.kind == UP and r.state]
    one_stack = [r for r in results if r.ok and r.delay_ms == 0 and r.shards is None and r.stacks == 1]

    def over(kinds: Sequence[str], value: Callable[[Result], float | None]) -> dict[str, list[tuple[float, float]]]:
        got = {kind: sorted((r.size, v) for r in one_stack if r.kind == kind and (v := value(r)) is not None)
               for kind in kinds}
        return {kind: points for kind, points in got.items() if points}

    daily_figures = [
        growth.Figure("daily-engine-cpu", "Engine CPU of the daily changes (one stack)", "CPU-s",
                      over(DAILY, lambda r: r.cpu.engine)),
        growth.Figure("daily-wall", "Wall time of the daily changes (one stack)", "wall time, s",
                      over(DAILY, lambda r: r.wall)),
        growth.Figure("backend-written", "Bytes written to the state backend during the run (one stack)", "bytes",
                      over((UP, NOOP, *DAILY), lambda r: None if r.backend_bytes is None else float(r.backend_bytes))),
    ]
    return [
        growth.Figure("wall", "Wall time of each pulumi run", "wall time, s", series(lambda r: r.wall)),
        growth.Figure("engine-cpu", "Engine CPU (the pulumi CLI)", "CPU-s", series(lambda r: r.cpu.engine)),
        growth.Figure("provider-cpu", "Provider CPU (dynamic-provider processes)", "CPU-s",
                      series(lambda r: r.cpu.provider)),
        growth.Figure("program-cpu", "Program CPU (language host + __main__.py)", "CPU-s",
                      series(lambda r: r.cpu.program)),
        growth.Figure("state", "State size after pulumi up (exported deployment)", "bytes", {
            "with PEM bodies": sorted((r.size, float(r.state.total)) for r in ups if r.state),
            "without PEM bodies": sorted((r.size, float(r.state.total_no_pem)) for r in ups if r.state)}),
        *(fig for fig in daily_figures if fig.series),
    ]


def growth_table(figures: Sequence[growth.Figure]) -> str:
    rows = [f"| figure | run | exponent from {growth.FROM} nodes | exponent, all sizes | points (N: value) |",
            "|---|---|---:|---:|---|"]
    for fig in figures:
        for kind, g in fig.growths().items():
            flag = " **superlinear**" if g.superlinear() else ""
            pts = ", ".join(f"{n:g}: {y:,.3g}" for n, y in fig.series[kind])
            rows.append(f"| {fig.title} | {kind} | {fmt(g.large)}{flag} | {fmt(g.overall)} | {pts} |")
    return "\n".join(rows)


def superlinear_notes(figures: Sequence[growth.Figure]) -> list[str]:
    return [f"superlinear from {growth.FROM} nodes: {fig.slug} of {kind} (k={g.large:.2f})"
            for fig in figures for kind, g in fig.growths().items() if g.superlinear() and g.large is not None]


def shard_comparison(results: Sequence[Result]) -> tuple[str, list[str]]:
    """`pulumi up` from scratch per provider-process count: a table, and the best count per size."""
    runs = [r for r in results if r.kind == UP and r.shards is not None and r.delay_ms == 0]
    if not runs:
        return "(not measured)", []
    rows = ["| N | provider processes | wall s | operator CPU-s | provider CPU-s | SSH/node |", "|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for size in sorted({r.size for r in runs}):
        at = sorted((r for r in runs if r.size == size), key=lambda r: r.shards or 0)
        rows += [f"| {size} | {r.shards} | {r.wall:.2f} | {operator_cpu(r):.1f} | {r.cpu.provider:.1f} "
                 f"| {r.ssh / size:.2f} |" for r in at if r.ok]
        ok = [r for r in at if r.ok]
        if ok:
            best = min(ok, key=lambda r: r.wall)
            notes.append(f"providers at {size} nodes: " + ", ".join(f"{r.shards}: {r.wall:.1f} s" for r in ok)
                         + f"; best {best.shards}")
    return "\n".join(rows), notes


def checkpoint_comparison(results: Sequence[Result]) -> str:
    """Per size of --checkpoint-sizes: each run of the default engine beside the same run with its checkpoints
    skipped (the run of that kind just before the skipped one), and the skipped one over the default."""
    rows = ["| N | run | checkpoints | wall s | engine CPU-s | provider CPU-s | program CPU-s | operator CPU-s/node "
            "| written to the backend MB | SSH/node |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for i, skipped in enumerate(results):
        if not skipped.kind.endswith(CHECKPOINTS_SKIPPED):
            continue
        kind = skipped.kind.removesuffix(CHECKPOINTS_SKIPPED)
        written = next((r for r in reversed(results[:i]) if r.kind == kind and r.size == skipped.size), None)
        if written is None or not (written.ok and skipped.ok):
            continue
        for label, r in (("written", written), ("skipped", skipped)):
            rows.append(f"| {r.size} | {kind} | {label} | {r.wall:.2f} | {r.cpu.engine:.1f} | {r.cpu.provider:.1f} "
                        f"| {r.cpu.program:.1f} | {operator_cpu(r) / r.size:.3f} | {megabytes(r.backend_bytes)} "
                        f"| {r.ssh / r.size:.2f} |")
        rows.append(f"| {skipped.size} | {kind} | skipped / written | {fmt(ratio(skipped.wall, written.wall))} "
                    f"| {fmt(ratio(skipped.cpu.engine, written.cpu.engine))} | {fmt(ratio(skipped.cpu.provider, written.cpu.provider))} "
                    f"| {fmt(ratio(skipped.cpu.program, written.cpu.program))} "
                    f"| {fmt(ratio(operator_cpu(skipped), operator_cpu(written)))} "
                    f"| {fmt(ratio(skipped.backend_bytes, written.backend_bytes))} | |")
    return "\n".join(rows) if len(rows) > 2 else "(not measured: --checkpoint-sizes not given)"


def draw_plots(figures: Sequence[growth.Figure], out_dir: Path, prefix: str = "benchmark-") -> list[Path]:
    """The PNGs beside the report (``<prefix><slug>.png``); none (and a message) when matplotlib is missing."""
    try:
        return [growth.plot(fig, out_dir, prefix) for fig in figures if any(len(p) > 1 for p in fig.series.values())]
    except ImportError as exc:
        print(f"no plots: {exc} (scripts/bench-tools.sh installs matplotlib)", flush=True)
        return []


Figure = tuple[str, Callable[["Result | None"], "float | None"], int]
"""A row of a side-by-side table: its label, its value from one run (None: not measured), its digits."""


def side_by_side(results: Sequence[Result], kind: str, names: Sequence[str], header: str,
                 figures: Callable[[int], list[Figure]]) -> str:
    """Two runs per size, `kind` then each of the two `names`, as a table of `figures(size)` with the second's
    ratio to the first, and a FAILED row for a run that failed."""
    sizes = sorted({r.size for r in results if r.kind.startswith(kind)})
    if not sizes:
        return "(not measured)"
    rows = [header, "|---:|---|---:|---:|---:|"]
    for size in sizes:
        first, second = (next((r for r in results if r.size == size and r.kind == f"{kind} {name}"), None)
                         for name in names)
        for label, value, digits in figures(size):
            a, b = value(first), value(second)
            rows.append(f"| {size} | {label} | {fmt(a, digits)} | {fmt(b, digits)} | {fmt(ratio(b, a))} |")
        failed = [r.scenario for r in (first, second) if r is not None and not r.ok]
        if failed:
            rows.append(f"| {size} | FAILED | {'; '.join(failed)} | | |")
    return "\n".join(rows)


def _run_figures() -> list[Figure]:
    return [("`pulumi up` wall, s", lambda r: None if r is None else r.wall, 2),
            ("agents up, s", lambda r: None if r is None else r.agents_up, 1),
            ("CPU-s ours + hosts", lambda r: None if r is None else r.cpu_own, 1),
            ("CPU-s operator's side (engine + program + provider)", lambda r: None if r is None else operator_cpu(r), 1),
            ("CPU-s machine", lambda r: None if r is None else r.cpu.machine, 1)]


def signer_comparison(results: Sequence[Result]) -> str:
    """The signer runs side by side per size: wall time and CPU of each `pulumi up`, the HSM's over pkiDir's, and
    seconds per certificate (the ClientCertificate steps of the up, and the signing step alone)."""

    def step(r: Result | None, what: str) -> float | None:
        st = None if r is None else r.detail.get("steps", {}).get("ClientCertificate create")
        if st is None:
            return None
        return float(st["mean_s"] if what == "mean" else (st["last_end_s"] - st["first_start_s"]) / st["count"])

    def figures(size: int) -> list[Figure]:
        return [*_run_figures(),
                ("ClientCertificate step, mean s (SSH, key pair on the node, signing, check)", lambda r: step(r, "mean"), 3),
                ("ClientCertificate steps, first start to last end / N, s per certificate", lambda r: step(r, "span"), 3),
                (f"signing step alone, s per certificate ({size} one after another, with the check)",
                 lambda r: None if r is None else r.detail.get("signing_alone_s"), 4)]

    return side_by_side(results, SIGNED_UP, SIGNERS, "| N | figure | pkiDir | HSM signer | HSM / pkiDir |", figures)


def language_comparison(results: Sequence[Result]) -> str:
    """The language runs side by side per size: wall time, agents up and CPU of each `pulumi up`."""
    return side_by_side(results, LANGUAGE_UP, LANGUAGES, "| N | figure | Python | TypeScript | TypeScript / Python |",
                        lambda size: _run_figures())
