"""A change planned from a read the node finds stale is planned again from one new read, once (_glue.run_fresh)."""

from __future__ import annotations

import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.providers import _glue
from llmgw_pulumi.remote import Exit, Result

STALE = Result(Exit.STALE, "", "/etc/llmgw/agent.yaml changed since the node was read")
DONE = Result(0, "done", "")


class Node:
    """What the helper is given: reads that count themselves, and a script whose answers are set in advance."""

    def __init__(self, *answers: Result) -> None:
        self.answers = list(answers)
        self.reads = 0
        self.runs: list[str] = []

    def read(self) -> str:
        self.reads += 1
        return f"read {self.reads}"

    def run(self, seen: str) -> Result:
        self.runs.append(seen)
        return self.answers.pop(0)


def test_a_plan_from_the_last_record_runs_without_reading_the_node() -> None:
    node = Node(DONE)
    assert _glue.run_fresh("gpu-01", "recorded", node.read, node.run) is DONE
    assert (node.reads, node.runs) == (0, ["recorded"])


def test_with_no_record_the_node_is_read_first() -> None:
    node = Node(DONE)
    assert _glue.run_fresh("gpu-01", None, node.read, node.run) is DONE
    assert (node.reads, node.runs) == (1, ["read 1"])


def test_a_stale_plan_is_made_again_from_one_new_read() -> None:
    node = Node(STALE, DONE)
    assert _glue.run_fresh("gpu-01", "recorded", node.read, node.run) is DONE
    assert (node.reads, node.runs) == (1, ["recorded", "read 1"])


def test_a_plan_stale_twice_is_not_tried_a_third_time_and_is_a_node_changed_error() -> None:
    node = Node(STALE, STALE, DONE)
    res = _glue.run_fresh("gpu-01", None, node.read, node.run)
    assert res is STALE
    assert (node.reads, node.runs) == (2, ["read 1", "read 2"])
    with pytest.raises(errors.NodeChangedError) as raised:
        _glue.raise_for(res, "gpu-01", "installing the agent")
    assert str(raised.value).startswith("gpu-01: /etc/llmgw/agent.yaml changed since the node was read\n  fix: ")


def test_another_failure_is_returned_at_once_not_retried() -> None:
    busy = Result(Exit.BUSY, "", "locked")
    node = Node(busy, DONE)
    assert _glue.run_fresh("gpu-01", "recorded", node.read, node.run) is busy
    assert (node.reads, node.runs) == (0, ["recorded"])
