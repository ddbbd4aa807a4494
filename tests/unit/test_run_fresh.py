"""A change planned from a read the node finds stale is planned again from one new read, once (base.run_fresh);
the agent's case on a fake node is in test_plan_on_node.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_pulumi import errors
from llmgw_pulumi.nodestate.commands import Exit, Result
from llmgw_pulumi.nodestate.observed import Observed, Seen
from llmgw_pulumi.providers import base
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from tests.fakenode import FakeNode
from tests.unit.fake_node_resources import CA, CERT, certificate, identity_inputs, onboard_identity, sha

STALE = Result(Exit.STALE, "", "/etc/llmgw/agent.yaml changed since the node was read")
DONE = Result(0, "done", "")


class Scripted:
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
    fake = Scripted(DONE)
    assert base.run_fresh("gpu-01", "recorded", fake.read, fake.run) is DONE
    assert (fake.reads, fake.runs) == (0, ["recorded"])


def test_with_no_record_the_node_is_read_first() -> None:
    fake = Scripted(DONE)
    assert base.run_fresh("gpu-01", None, fake.read, fake.run) is DONE
    assert (fake.reads, fake.runs) == (1, ["read 1"])


def test_a_stale_plan_is_made_again_from_one_new_read() -> None:
    fake = Scripted(STALE, DONE)
    assert base.run_fresh("gpu-01", "recorded", fake.read, fake.run) is DONE
    assert (fake.reads, fake.runs) == (1, ["recorded", "read 1"])


def test_a_plan_stale_twice_is_not_tried_a_third_time_and_is_a_node_changed_error() -> None:
    fake = Scripted(STALE, STALE, DONE)
    res = base.run_fresh("gpu-01", None, fake.read, fake.run)
    assert res is STALE
    assert (fake.reads, fake.runs) == (2, ["read 1", "read 2"])
    with pytest.raises(errors.NodeChangedError) as raised:
        base.raise_for(res, "gpu-01", "installing the agent")
    assert str(raised.value).startswith("gpu-01: /etc/llmgw/agent.yaml changed since the node was read\n  fix: ")


def test_another_failure_is_returned_at_once_not_retried() -> None:
    busy = Result(Exit.BUSY, "", "locked")
    fake = Scripted(busy, DONE)
    assert base.run_fresh("gpu-01", "recorded", fake.read, fake.run) is busy
    assert (fake.reads, fake.runs) == (0, ["recorded"])


def test_an_identity_renewal_planned_from_an_old_record_reads_the_node_again(node: FakeNode, pki_dir: Path) -> None:  # noqa: F811
    """The CA file's mode changed on the node after the last record (no refresh since): the renewal's first plan
    keeps it, the node refuses the plan as stale, and the plan made after reading the node again repairs it."""
    inputs, outs = onboard_identity(pki_dir)
    inode = node.path(CA).stat().st_ino
    node.path(CA).chmod(0o666)
    renewed = identity_inputs(certificate(pki_dir))
    new = NodeIdentityProvider().update("id", outs, renewed).outs
    assert node.read(CERT) == renewed["cert_pem"].encode()
    assert node.mode(CA) == 0o644 and node.path(CA).stat().st_ino == inode, "the CA file repaired in place"
    seen = Observed.parse(new["observed"])
    assert seen is not None and seen.files[CA] == Seen(sha(inputs["ca_pem"]), 0o644, "root:root")
