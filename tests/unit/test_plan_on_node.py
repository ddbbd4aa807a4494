"""The node's scripts carry out a plan and re-check it under the lock (on a fake node: the real scripts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_pulumi import errors, rollout
from llmgw_pulumi.nodestate import commands, desired, plan
from llmgw_pulumi.nodestate.observed import Observed, Seen
from llmgw_pulumi.providers.agent import AgentInstallProvider, wanted
from tests.fakenode import FakeNode
from tests.unit.fake_node_resources import agent_binary, agent_inputs, changes_to_systemd, files, sha

BINARY, CONFIG, UNIT = desired.BINARY_PATH, desired.CONFIG_PATH, desired.UNIT_PATH


def test_a_plan_made_from_a_node_that_changed_since_changes_nothing(agent_node: FakeNode, dev_build: Path) -> None:  # noqa: F811
    fake = agent_node
    inputs = agent_inputs(dev_build)
    AgentInstallProvider().create(inputs)
    before = {p: (fake.read(p), fake.mode(p), fake.path(p).stat().st_ino) for p in (BINARY, CONFIG, UNIT)}
    calls = len(changes_to_systemd(fake))
    # A plan made from a record that says agent.yaml held other bytes: it writes the new config, and restarts.
    news = agent_inputs(dev_build, servers=["cp2.example.net:7443"])
    seen = Observed({BINARY: Seen(sha(dev_build.read_bytes()), 0o755, "root:root"),
                     CONFIG: Seen("0" * 64, 0o644, "root:root"), UNIT: Seen(sha(inputs["unit"]), 0o644, "root:root")},
                    "active enabled")
    made = plan.agent_plan("gpu-01", wanted(news), seen, "amd64",
                           plan.BinaryWanted(plan.Do.COPY, {"": sha(dev_build.read_bytes())}))
    assert made.step(CONFIG).do is plan.Do.WRITE and made.unit is plan.Unit.RESTART
    res = fake.run(commands.install_agent(made, news["agent_yaml"], news["unit"]))
    assert res.rc == commands.Exit.STALE, (res.rc, res.stderr)
    assert f"{CONFIG} changed since the node was read" in res.stderr
    after = {p: (fake.read(p), fake.mode(p), fake.path(p).stat().st_ino) for p in (BINARY, CONFIG, UNIT)}
    assert after == before, "a stale plan changed a file"
    assert changes_to_systemd(fake)[calls:] == [], "a stale plan touched the agent"
    assert fake.leftovers() == []


def test_an_update_planned_from_an_old_record_reads_the_node_again(agent_node: FakeNode, dev_build: Path) -> None:  # noqa: F811
    """The binary's mode changed on the node after the last record (no refresh since): the update's first plan
    keeps the binary, the node refuses it as stale, and the plan made after reading the node again repairs it."""
    fake = agent_node
    p = AgentInstallProvider()
    inputs = agent_inputs(dev_build)
    outs = p.create(inputs).outs
    inode = fake.path(BINARY).stat().st_ino
    fake.path(BINARY).chmod(0o777)
    news = agent_inputs(dev_build, servers=["cp2.example.net:7443"])
    new = p.update("gpu-01", outs, news).outs
    assert fake.mode(BINARY) == 0o755 and fake.path(BINARY).stat().st_ino == inode
    assert b"cp2.example.net:7443" in (fake.read(CONFIG) or b"")
    assert files(new)[BINARY] == f"{sha(dev_build.read_bytes())} 755 root:root"


def test_an_update_that_fails_on_the_node_is_reported_failed_to_the_rollout(
        agent_node: FakeNode, dev_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The rollout's gate is taken by the plan, and sees the plan's outcome: a canary whose new agent does not
    stay up is marked failed (so no other node starts), not done."""
    monkeypatch.setenv(rollout.DIR_ENV, str(tmp_path / "rollout"))
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    rollout.start_run(directory, ["gpu-01"])
    policy = {"max_parallel": 1, "canary": True, "directory": str(directory)}
    p = AgentInstallProvider()
    outs = p.create(agent_inputs(dev_build, rollout=policy)).outs
    broken = tmp_path / "broken"
    broken.write_bytes(agent_binary("v2.0.0-1-gbad", starts=False))
    with pytest.raises(errors.AgentStartError):
        p.update("gpu-01", outs, agent_inputs(broken, rollout=policy))
    state = rollout.Run.current(directory).state("gpu-01")
    assert state is not None and state[0] == rollout.FAILED, state
