"""What a program keeps for one run of it, made anew when another run begins.

A run is one engine connection (the SDK's monitor): a process may run several
programs one after another (the Automation API, tests), each with resources and
lines of its own. A component provider has an engine connection per construct
call, and names its deployment instead (``run``; llmgw_pulumi.stack.component).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import pulumi

__all__ = ["PerRun"]

V = TypeVar("V")


class PerRun(Generic[V]):
    """Values by key, each made once per run (shards.provider_for's providers, program.say_once's lines)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run: object = None
        self._values: dict[Hashable, V] = {}

    def once(self, key: Hashable, make: Callable[[], V], run: object = None) -> tuple[V, bool]:
        """The value of ``key`` in this run, ``make()`` the first time it is asked for; and whether it was made
        now. ``run``: what identifies the run, when it is not the engine connection."""
        current = pulumi.runtime.settings.get_monitor() if run is None else run
        with self._lock:
            if self._run != current:
                self._run, self._values = current, {}
            if key in self._values:
                return self._values[key], False
            value = self._values[key] = make()
            return value, True
