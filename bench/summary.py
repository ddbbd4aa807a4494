"""Issue 12's targets, each as one ratio from one benchmark run, and the one-screen summary.

Pure: the figures come in as a lookup of measured runs, the text goes out.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 100

@dataclass(frozen=True)
class Target:
    """One target: a measured value against a limit (value <= limit, or >= for `at_least`)."""

    name: str
    value: float | None
    limit: float
    at_least: bool = False
    measured: str = ""
    """What the value was computed from, e.g. '32.3 s / floor 20.7 s'."""
    digits: int = 2
    """Decimals shown: enough that a value shown equal to its limit is one that met it."""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return (operator.ge if self.at_least else operator.le)(self.value, self.limit)

    @property
    def verdict(self) -> str:
        return {None: "not measured", True: "met", False: "MISSED"}[self.met]

    @property
    def wanted(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.limit:g}"

def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den

def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"

def summary(targets: Sequence[Target], notes: Sequence[str] = (), title: str = "Issue 12 targets",
            name_width: int = 48) -> str:
    """One screen: a line per target (value, limit, met/missed, from what), a count, then up to a few notes.
    A name longer than ``name_width`` is cut; a "from what" that does not fit beside it goes on the next line,
    indented, whole as far as the screen allows."""
    name_w = min(max((len(t.name) for t in targets), default=10), name_width)
    lines = [f"== {title} " + "=" * max(0, WIDTH - len(title) - 4)]
    for t in targets:
        name = t.name if len(t.name) <= name_w else t.name[: name_w - 1] + "~"
        head = f"{name:<{name_w}}  {fmt(t.value, t.digits):>7} {t.wanted:>8}  {t.verdict:<12}"
        line = f"{head} {t.measured}".rstrip()
        if len(line) <= WIDTH:
            lines.append(line)
        else:
            lines += [head.rstrip(), cut(f"    {t.measured}")]
    met = sum(1 for t in targets if t.met)
    missed = sum(1 for t in targets if t.met is False)
    lines.append(f"-- {met} met, {missed} missed, {len(targets) - met - missed} not measured")
    lines += [cut(n) for n in notes]
    return "\n".join(lines)


def cut(line: str) -> str:
    """A line cut to the screen's width, a cut one ending in '~'."""
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "~"
