"""A real preview to review (`pulumi preview --json --diff --refresh` of a 5-node lab stack, kept in
tests/fixtures/review/change.json), the time it is reviewed at, and the steps a test changes in it."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "review" / "change.json"
NOW = dt.datetime(2026, 12, 1, 12, 10, tzinfo=dt.UTC)


def preview() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


def step(data: dict[str, Any], kind: str, node: str) -> dict[str, Any]:
    return next(s for s in data["steps"] if s["urn"].endswith(f"{kind}::{node}") and s["op"] != "refresh")


def created(data: dict[str, Any], node: str, op: str = "create", agent: dict[str, Any] | None = None,
            connection: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The steps of a preview that onboards ``node``: node10's resources, as their refresh read them, created anew
    under another name, with AgentInstall's and the connection's inputs changed."""
    steps = []
    for s in data["steps"]:
        if s["op"] == "refresh" and s["urn"].endswith("::node10"):
            new = copy.deepcopy(s.get("newState") or {})
            inputs = new.setdefault("inputs", {}) or {}
            new["inputs"] = inputs
            if "connection" in inputs:
                inputs["connection"] = {**inputs["connection"], **(connection or {})}
            if s["urn"].endswith("AgentInstall::node10"):
                inputs.update(agent or {})
            steps.append({"op": op, "urn": s["urn"].replace("::node10", f"::{node}"), "newState": new})
    return steps
