"""What each provider's diff decides, through the providers themselves: which changes replace a resource (another
machine), which are only the operator's side (state updated, the node not reached), and what a canary with nothing
to change tells the others. Values are shaped as the engine sends them (numbers as floats, unknowns in preview)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pulumi.output import Unknown

from llmgw_pulumi import rollout
from llmgw_pulumi.nodestate import desired
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from tests.unit import AGENT_YAML_COMMENTS, fake_pem

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"
# The node and the bastion listen nowhere (port 1 of loopback refuses): reaching either fails at once.
CONN = {"host": "127.0.0.1", "user": "deploy", "port": 1.0, "wait": 0.0,
        "private_key": fake_pem("OPENSSH PRIVATE KEY", "SSHKEYBODY")}
AGENT = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "hostname": "gpu-01",
         "servers": ["cp1:7443"], "version": "v1.2.3", "release_url": "https://r.example/llmgw"}
ENGINES = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "engines": {"vllm": {"bin": "/opt/vllm"}}}


def checked(provider: Any, news: dict[str, Any], olds: dict[str, Any] | None = None) -> dict[str, Any]:
    res = provider.check(olds or {}, news)
    assert res.failures == [], res.failures
    return dict(res.inputs)


def installed(inputs: dict[str, Any]) -> dict[str, Any]:
    """An AgentInstall's state after its install: the inputs, and the node seen holding what they render (a
    record of the shape before state_version 1, read through its migration)."""
    import hashlib

    config = AGENT_YAML_COMMENTS.format(inputs["node_id"]) + inputs["agent_yaml"]  # as a package of that shape kept it
    seen = {"binary_sha256": "b" * 64, "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
            "unit_sha256": hashlib.sha256(desired.render_unit().encode()).hexdigest(), "active": "active", "enabled": "enabled"}
    return {**inputs, "agent_yaml": config, "installed_sha256": "b" * 64, "arch": "amd64", "node_state": seen}


@pytest.mark.parametrize("field, value", [("host", "10.0.0.99"), ("port", 2222.0)])
def test_another_address_or_port_replaces_the_engine_check_and_the_agent(field: str, value: object) -> None:
    for provider, inputs in ((EngineCheckProvider(), ENGINES), (AgentInstallProvider(), AGENT)):
        olds = checked(provider, inputs)
        moved = checked(provider, {**inputs, "connection": {**CONN, field: value}})
        d = provider.diff("gpu-01", olds, moved)
        assert d.changes is True and d.replaces == [f"connection.{field}"], (provider, d.replaces)
        other_login = checked(provider, {**inputs, "connection": {**CONN, "user": "ops"}})
        d = provider.diff("gpu-01", olds, other_login)
        assert d.changes is True and d.replaces == [], provider


def test_every_operator_side_setting_changed_at_once_updates_state_without_reaching_the_node() -> None:
    p = EngineCheckProvider()
    olds = {**checked(p, {**ENGINES, "known_jump_host_keys": {"127.0.0.1:1": HOST_KEY}}),
            "problems": [], "engines_ok": True, "inventory": {"gpus": []}}
    conn = {**CONN, "user": "ops", "wait": 1.0, "passphrase": "new", "private_key_path": "/nowhere/key",
            "private_key": fake_pem("OPENSSH PRIVATE KEY", "OTHERKEYBODY"), "jump": [{"address": "deploy@127.0.0.1:1"}]}
    news = checked(p, {**ENGINES, "connection": conn, "known_jump_host_keys": {"127.0.0.1:1": "ssh-ed25519 AAAAB"}})
    assert p.diff("gpu-01", olds, news).changes is True
    outs = p.update("gpu-01", olds, news).outs  # reaching 127.0.0.1:1 would fail: it is not tried
    assert outs["connection"] == news["connection"] and outs["known_jump_host_keys"] == news["known_jump_host_keys"]
    assert (outs["problems"], outs["engines_ok"], outs["inventory"]) == ([], True, {"gpus": []})


def test_facts_of_the_machine_are_carried_only_from_a_record_of_the_same_machine() -> None:
    p = AgentInstallProvider()
    olds = checked(p, AGENT)
    for record in ({k: v for k, v in olds.items() if k != "connection"}, {**olds, "connection": "10.0.0.11"}):
        res = p.check(record, {**AGENT, "hostname": Unknown()})
        assert isinstance(res.inputs["hostname"], Unknown), record.get("connection")
    assert p.check(olds, {**AGENT, "hostname": Unknown()}).inputs["hostname"] == "gpu-01"


def test_a_canary_whose_agent_has_nothing_to_change_says_so_and_only_then(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rollout.DIR_ENV, str(tmp_path / "rollout"))
    directory = rollout.stack_dir("/project", "org", "proj", "prod")
    rollout.start_run(directory, ["gpu-01", "gpu-02"])
    run = rollout.Run.current(directory)
    p = AgentInstallProvider()
    for node in ("gpu-01", "gpu-02"):
        olds = installed(checked(p, {**AGENT, "node_id": node, "hostname": node,
                                     "rollout": {"canary": True, "directory": str(directory)}}))
        assert p.diff(node, olds, {**olds, "servers": ["cp2:7443"]}).changes is True
        assert run.state(node) is None  # it has something to change: the others wait for it
        assert p.diff(node, olds, olds).changes is False
        assert run.state(node) == (rollout.UNCHANGED, "")
    # A node that is not a canary says nothing: no one waits for it.
    olds = installed(checked(p, {**AGENT, "node_id": "gpu-03", "hostname": "gpu-03",
                                 "rollout": {"canary": False, "directory": str(directory)}}))
    assert p.diff("gpu-03", olds, olds).changes is False
    assert run.state("gpu-03") is None


def test_what_a_preview_or_an_unpinned_key_leaves_out_is_not_a_change_but_a_removed_setting_is() -> None:
    p = EngineCheckProvider()
    pin = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE3xKPxu6nJJKFsDdOlnXSh6kp1jpfjf1W6cXBx5OfVZ"
    pinned = {**CONN, "host_key": pin, "private_key_path": "/home/op/.ssh/id_ed25519", "passphrase": "x"}
    olds = checked(p, {**ENGINES, "connection": pinned})
    # The pin dropped (the key recorded is expected from now on), a reviewer's preview without the secret key or
    # its path: nothing to do.
    left_out = {k: v for k, v in pinned.items() if k not in ("host_key", "private_key", "private_key_path")}
    assert p.diff("gpu-01", olds, {**olds, "connection": left_out}).changes is False
    assert p.diff("gpu-01", olds, {**olds, "connection": {**left_out, "user": "ops"}}).changes is True  # compared on
    without_passphrase = {k: v for k, v in pinned.items() if k != "passphrase"}
    assert p.diff("gpu-01", olds, {**olds, "connection": without_passphrase}).changes is True


def test_a_config_or_unit_changed_on_the_node_is_drift_the_next_up_repairs() -> None:
    import hashlib

    p = AgentInstallProvider()
    inputs = checked(p, AGENT)
    config = AGENT_YAML_COMMENTS.format("gpu-01") + inputs["agent_yaml"]
    seen = {"binary_sha256": "b" * 64, "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
            "unit_sha256": hashlib.sha256(desired.render_unit().encode()).hexdigest(), "active": "active", "enabled": "enabled"}
    olds = {**inputs, "agent_yaml": config, "installed_sha256": "b" * 64, "node_state": seen}
    assert p.diff("gpu-01", olds, inputs).changes is False
    for key in ("config_sha256", "unit_sha256", "binary_sha256"):
        drifted = {**olds, "node_state": {**seen, key: "0" * 64}}
        assert p.diff("gpu-01", drifted, inputs).changes is True, key


def test_the_renewal_window_defaults_for_a_stack_that_never_set_it_and_includes_its_start() -> None:
    from llmgw_pulumi.providers.certificate import reissue_reasons

    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    month = dt.timedelta(hours=24 * 30)  # the default renewBeforeHours, written out
    news = {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "node"}  # no renew_before_hours: an old stack
    record = {**news, "ca_not_after": (now + 3650 * dt.timedelta(days=1)).isoformat()}
    assert reissue_reasons({**record, "not_after": (now + month).isoformat()}, news, now) == ["not_after"]
    assert reissue_reasons({**record, "not_after": (now + month + dt.timedelta(seconds=1)).isoformat()}, news, now) == []
    hours = {**news, "renew_before_hours": 1.0}
    assert reissue_reasons({**record, "not_after": (now + dt.timedelta(hours=1)).isoformat()}, hours, now) == ["not_after"]
    assert reissue_reasons({**record, "not_after": (now + dt.timedelta(hours=2)).isoformat()}, hours, now) == []
    # Nothing recorded yet, or the window not known yet in a preview: nothing to renew.
    assert reissue_reasons(record, news, now) == []
    assert reissue_reasons({**record, "not_after": now.isoformat()}, {**news, "renew_before_hours": Unknown()}, now) == []


def test_a_key_made_on_the_node_is_expected_to_stay_what_the_last_read_saw() -> None:
    import hashlib

    from llmgw_pulumi.nodestate.observed import OBSERVED_KEY
    from llmgw_pulumi.providers.identity import NodeIdentityProvider, changes

    ca, cert = "-----BEGIN CERTIFICATE-----\nCA\n", "-----BEGIN CERTIFICATE-----\nC\n"
    news = {"node_id": "gpu-01", "connection": CONN, "ca_pem": ca, "cert_pem": cert}

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    # As install or refresh saw it (written out, not computed by the code under test); the key's bytes are never
    # seen here, only that it is there with its mode and owner.
    seen = {"/etc/llmgw/ca.pem": f"{sha(ca)} 644 root:root", "/etc/llmgw/agent.pem": f"{sha(cert)} 644 root:root",
            "/usr/local/share/ca-certificates/llmgw-ca.crt": f"{sha(ca)} 644 root:root",
            "/etc/llmgw/agent-key.pem": f"{'f' * 64} 600 root:root"}
    olds = {**news, "host_key": HOST_KEY, "hostname": "gpu-01", OBSERVED_KEY: {"files": seen}, "state_version": 1}
    assert changes(olds, news) == [] and NodeIdentityProvider().diff("gpu-01", olds, news).changes is False
    drifted = {**olds, OBSERVED_KEY: {"files": {**seen, "/etc/llmgw/ca.pem": "absent"}}}
    assert changes(drifted, news) == [OBSERVED_KEY]


def test_a_setting_turned_off_or_emptied_is_a_change_but_jump_keys_not_known_yet_are_not() -> None:
    p = EngineCheckProvider()
    olds = checked(p, {**ENGINES, "fail_on_problems": True, "known_jump_host_keys": {"127.0.0.1:1": HOST_KEY}})
    assert p.diff("gpu-01", olds, {**olds, "fail_on_problems": False}).changes is True
    assert p.diff("gpu-01", olds, {**olds, "engines": {}}).changes is True
    for unknown in (Unknown(), {}, None):  # a preview while NodeIdentity updates, or nothing recorded yet
        assert p.diff("gpu-01", olds, {**olds, "known_jump_host_keys": unknown}).changes is False, unknown
