"""How a figure grows with the number of nodes: the fitted exponent, and the plots.

A figure y measured at fleet sizes N is fitted as y = c * N^k by least squares
of log y on log N; k is its growth exponent (1: linear, 2: quadratic, 0: flat).
The exponent is fitted twice: over every size, and from 30 nodes (``FROM``) to
the largest, where fixed costs no longer hide the growth. The plots (log-log,
one line per run kind, the exponents in the legend) are drawn with matplotlib,
a benchmark-only extra (bench/requirements.txt), imported only when drawing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FROM = 30
"""The smallest size of the 'large fleet' fit."""


def exponent(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(N); None with fewer than two distinct N or a y <= 0."""
    pts = [(n, y) for n, y in points if n > 0]
    if any(y <= 0 for _, y in pts) or len({n for n, _ in pts}) < 2:
        return None
    xs = [math.log(n) for n, _ in pts]
    ys = [math.log(y) for _, y in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


@dataclass(frozen=True)
class Growth:
    overall: float | None
    large: float | None
    """From FROM nodes to the largest size."""

    def label(self) -> str:
        fmt = lambda k: "n/a" if k is None else f"{k:.2f}"  # noqa: E731
        return f"k={fmt(self.large)} ({FROM}+), {fmt(self.overall)} (all)"

    def superlinear(self, limit: float = 1.0) -> bool:
        return self.large is not None and self.large > limit


def growth(points: Sequence[tuple[float, float]], start: int = FROM) -> Growth:
    return Growth(exponent(points), exponent([(n, y) for n, y in points if n >= start]))


@dataclass(frozen=True)
class Figure:
    """One plot: a figure (wall time, a CPU part, state) for each kind of run, against N."""

    slug: str
    title: str
    unit: str
    series: Mapping[str, Sequence[tuple[float, float]]]
    """Run kind -> (N, value) points."""

    def growths(self) -> dict[str, Growth]:
        return {kind: growth(points) for kind, points in self.series.items() if points}


def plot(figure: Figure, out_dir: Path, prefix: str = "benchmark-") -> Path:
    """Draw `figure` log-log into out_dir/<prefix><slug>.png; the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    growths = figure.growths()
    for kind, points in figure.series.items():
        pts = sorted((n, y) for n, y in points if y > 0)
        if not pts:
            continue
        ax.plot([n for n, _ in pts], [y for _, y in pts], marker="o", label=f"{kind}: {growths[kind].label()}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    sizes = sorted({n for points in figure.series.values() for n, _ in points})
    ax.set_xticks(sizes, [f"{n:g}" for n in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    values = [y for points in figure.series.values() for _, y in points if y > 0]
    # Label the minor ticks only when the figure spans less than a decade or so (else they crowd the axis).
    few = bool(values) and max(values) / min(values) < 20
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}") if few else NullFormatter())
    ax.set_xlabel("nodes (N)")
    ax.set_ylabel(figure.unit)
    ax.set_title(figure.title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / f"{prefix}{figure.slug}.png"
    fig.savefig(path)
    plt.close(fig)
    return path
