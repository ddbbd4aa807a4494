"""Provider glue without a network: check validates and derives, diff compares, outputs keep inputs.

Values are shaped as the engine sends them: numbers as floats, unknowns as
pulumi.output.Unknown during preview, old *outputs* as diff's olds.
"""

import base64
import datetime as dt
import hashlib

import dill
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.output import Unknown

from llmgw_pulumi import decisions
from llmgw_pulumi.nodestate import desired, observed
from llmgw_pulumi.nodestate.observed import STATE_VERSION
from llmgw_pulumi.providers import agent
from llmgw_pulumi.providers.agent import AgentInstall, AgentInstallProvider
from llmgw_pulumi.providers.agent import wanted as agent_wanted
from llmgw_pulumi.providers.certificate import ClientCertificate, ClientCertificateProvider, reissue_reasons
from llmgw_pulumi.providers.engines import EngineCheck, EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentity, NodeIdentityProvider, wanted
from tests.unit import AGENT_YAML_COMMENTS
from tests.unit.provider_inputs import AGENT, CONN, PEMS, as_installed, as_seen, checked

# ---------------------------------------------------------------- ClientCertificate

def test_certificate_no_diff_for_floats_and_provider_changes():
    p = ClientCertificateProvider()
    news = checked(p, {"node_id": "gpu-01", "pki_dir": "/pki", "key_origin": "operator", "__provider": "new"})
    olds = {**news, "validity_hours": 8760, "renew_before_hours": 720, "__provider": "old",
            "not_after": (dt.datetime.now(dt.UTC) + dt.timedelta(days=300)).isoformat()}
    assert p.diff("id", olds, {**news, "validity_hours": 8760.0}).changes is False


def test_certificate_replaced_for_a_new_node_id_and_reissued_in_place_inside_the_renewal_window():
    p = ClientCertificateProvider()
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "validity_hours": 100.0, "renew_before_hours": 10.0,
            "key_origin": "operator"}
    far = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=50)).isoformat()
    near = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=5)).isoformat()
    ca_end = (dt.datetime.now(dt.UTC) + dt.timedelta(days=300)).isoformat()
    d = p.diff("id", {**base, "not_after": far, "ca_not_after": ca_end}, {**base, "node_id": "gpu-02"})
    assert d.changes and d.replaces == ["node_id"]
    # The same machine: an update in place, which expects the host keys recorded (the reason is logged).
    d = p.diff("id", {**base, "not_after": near, "ca_not_after": ca_end}, base)
    assert d.changes and d.replaces == []
    assert reissue_reasons({**base, "not_after": near, "ca_not_after": ca_end}, base, dt.datetime.now(dt.UTC)) == \
        ["not_after"]
    # Capped at the CA's own expiry: a new certificate could not last longer, so no endless re-issue.
    d = p.diff("id", {**base, "not_after": near, "ca_not_after": near}, base)
    assert d.changes is False


def test_certificate_reissued_in_place_for_another_ca_but_not_for_a_moved_pki_dir():
    p = ClientCertificateProvider()
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "validity_hours": 100.0, "renew_before_hours": 10.0,
            "key_origin": "operator"}
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=90)).isoformat()
    olds = {**base, "ca_fingerprint": "aa", "not_after": later, "ca_not_after": later}
    rotated = p.diff("id", olds, {**base, "ca_fingerprint": "bb"})
    assert rotated.changes and rotated.replaces == []
    now = dt.datetime.now(dt.UTC)
    assert reissue_reasons(olds, {**base, "ca_fingerprint": "bb"}, now) == ["ca_fingerprint"]
    # How certificates are signed is the operator's side: a moved PKI dir, or another signer, is no change.
    moved = p.diff("id", olds, {**base, "pki_dir": "/srv/pki", "ca_fingerprint": "aa"})
    assert not moved.changes
    signer = {k: v for k, v in base.items() if k != "pki_dir"}
    by_command = p.diff("id", olds, {**signer, "signer": {"kind": "command", "command": ["/s"]}, "ca_fingerprint": "aa"})
    assert not by_command.changes
    assert reissue_reasons(olds, {**base, "pki_dir": "/srv/pki", "ca_fingerprint": "aa"}, now) == []
    # A reviewer without ca.pem: the old fingerprint is carried forward.
    res = p.check({**base, "ca_fingerprint": "aa"}, {**base, "pki_dir": "/nonexistent"})
    assert res.inputs["ca_fingerprint"] == "aa"


def test_a_key_made_on_the_node_is_reissued_for_another_machine_not_for_another_login():
    p = ClientCertificateProvider()
    conn = {"host": "10.0.0.11", "user": "deploy", "port": 22.0, "private_key_path": "/k"}
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "validity_hours": 100.0, "renew_before_hours": 10.0,
            "key_origin": "node", "connection": conn}
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=90)).isoformat()
    olds = {**base, "not_after": later, "ca_not_after": later}
    assert p.diff("id", olds, {**base, "connection": {**conn, "host": "10.0.0.12"}}).replaces == ["connection.host"]
    relogin = p.diff("id", olds, {**base, "connection": {**conn, "user": "ops", "private_key_path": "/k2"}})
    assert relogin.changes and relogin.replaces == []
    switched = p.diff("id", olds, {**base, "key_origin": "operator", "connection": None})
    assert switched.changes and switched.replaces == []
    assert reissue_reasons(olds, {**base, "key_origin": "operator", "connection": None}, dt.datetime.now(dt.UTC)) == \
        ["key_origin"]


def test_certificate_validity_change_updates_without_reissuing():
    p = ClientCertificateProvider()
    base = {"node_id": "gpu-01", "pki_dir": "/pki", "validity_hours": 100.0, "renew_before_hours": 10.0,
            "key_origin": "operator"}
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=90)).isoformat()
    olds = {**base, "cert_pem": "C", "key_pem": "K", "serial": "ab", "not_after": later, "ca_pem": "CA",
            "ca_not_after": later, "fingerprint_sha256": "f"}
    d = p.diff("id", olds, {**base, "validity_hours": 200.0})
    assert d.changes and not d.replaces
    outs = p.update("id", olds, {**base, "validity_hours": 200.0}).outs
    assert outs["serial"] == "ab" and outs["key_pem"] == "K" and outs["validity_hours"] == 200.0


# ---------------------------------------------------------------- NodeIdentity


def identity_state():
    news = {"node_id": "gpu-01", "connection": CONN, **PEMS}
    return news, {**news, "host_key": "ssh-ed25519 AAAA", "hostname": "gpu-01", "observed": as_seen(wanted(news)),
                  "state_version": STATE_VERSION}


def test_identity_unchanged_when_nothing_changed():
    news, olds = identity_state()
    assert NodeIdentityProvider().diff("id", olds, news).changes is False


def test_identity_new_certificate_is_an_update_not_a_replacement():
    news, olds = identity_state()
    d = NodeIdentityProvider().diff("id", olds, {**news, "cert_pem": "-----BEGIN CERTIFICATE-----\nNEW\n"})
    assert d.changes and not d.replaces


def test_identity_new_host_is_a_replacement_created_before_the_old_is_deleted():
    news, olds = identity_state()
    d = NodeIdentityProvider().diff("id", olds, {**news, "connection": {**CONN, "host": "10.0.0.99"}})
    assert d.replaces == ["connection.host"] and not d.delete_before_replace


def test_identity_new_node_id_is_a_replacement_without_downtime():
    # Created before the old is deleted; the old delete checks whose certificate the node carries.
    news, olds = identity_state()
    d = NodeIdentityProvider().diff("id", olds, {**news, "node_id": "gpu-09"})
    assert d.replaces == ["node_id"] and not d.delete_before_replace


def test_machine_facts_are_carried_forward_while_identity_updates_in_preview():
    p = AgentInstallProvider()
    olds = as_installed(checked(p, AGENT))
    res = p.check(olds, {**AGENT, "hostname": Unknown(), "known_host_key": Unknown()})
    assert res.inputs["hostname"] == "gpu-01" and res.inputs["agent_yaml"] == olds["agent_yaml"]
    assert p.diff("id", olds, res.inputs).changes is False
    # Not for another machine.
    moved = p.check(olds, {**AGENT, "connection": {**CONN, "host": "10.0.0.99"}, "hostname": Unknown()})
    assert isinstance(moved.inputs["hostname"], Unknown)


def test_a_standing_engine_problem_is_not_a_change():
    p = EngineCheckProvider()
    news = checked(p, {"node_id": "gpu-01", "connection": CONN, "known_host_key": "k",
                       "engines": {"vllm": {"bin": "/opt/vllm"}}})
    assert p.diff("id", {**news, "problems": []}, news).changes is False
    assert p.diff("id", {**news, "problems": [{"engine": "vllm"}]}, news).changes is False
    assert p.diff("id", {**news, "problems": []}, {**news, "engines": {"vllm": {"bin": "/opt/vllm2"}}}).changes is True


def test_operator_side_connection_settings_are_state_only_changes():
    from llmgw_pulumi.providers import base as _glue

    old_conn = {**CONN, "user": "deploy", "wait": 30, "private_key_path": "/a/key"}
    for field, value in [("user", "ops"), ("wait", 45), ("private_key_path", "/b/key"), ("passphrase", "x"),
                         ("jump", [{"address": "deploy@bastion"}])]:
        changes = _glue.changed_keys({"connection": old_conn}, {"connection": {**old_conn, field: value}}, ["connection"])
        assert changes == [f"connection.{field}"], field
        assert decisions.operator_side_only(changes), field
    node_side = _glue.changed_keys({"connection": old_conn}, {"connection": {**old_conn, "host": "10.9.9.9"}}, ["connection"])
    assert not decisions.operator_side_only(node_side)
    assert not decisions.operator_side_only(["connection.user", "servers"])
    assert not decisions.operator_side_only([])


def test_identity_unknown_host_in_preview_means_replacement():
    news, olds = identity_state()
    d = NodeIdentityProvider().diff("id", olds, {**news, "connection": {**CONN, "host": Unknown()}})
    assert d.changes and "connection.host" in d.replaces


def test_identity_drift_found_by_refresh_is_a_change():
    news, olds = identity_state()
    drifted = {**olds, "observed": {"files": {**olds["observed"]["files"], "/etc/llmgw/agent-key.pem": "absent"}}}
    d = NodeIdentityProvider().diff("id", drifted, news)
    assert d.changes and d.replaces == []


def test_identity_check_failures_never_echo_secrets():
    res = NodeIdentityProvider().check({}, {"node_id": "gpu-01", "connection": {**CONN, "host": "bad host!"},
                                            **PEMS, "key_pem": "not a pem but SECRETVALUE"})
    text = " ".join(f.reason + f.property for f in res.failures)
    assert "connection.host" in text and "key_pem" in text
    assert "SECRETVALUE" not in text and "SSHKEYBODY" not in text
    assert res.failures and all(f.property == "" for f in res.failures)


def test_identity_check_accepts_unknowns():
    res = NodeIdentityProvider().check({}, {"node_id": "gpu-01", "connection": {**CONN, "host": Unknown()},
                                            "ca_pem": Unknown(), "cert_pem": Unknown(), "key_pem": Unknown()})
    assert res.failures == []


# ---------------------------------------------------------------- AgentInstall

AGENT_YAML_HEADER = AGENT_YAML_COMMENTS.format("gpu-01")
AGENT_YAML_SETTINGS = ("server: cp1:7443\n"
                       "tls:\n  ca: /etc/llmgw/ca.pem\n  cert: /etc/llmgw/agent.pem\n  key: /etc/llmgw/agent-key.pem\n")
"""agent.yaml of AGENT, as the node holds it: the comment lines, then the settings."""


def test_agent_check_renders_config_and_unit_for_the_preview():
    inputs = checked(AgentInstallProvider(), AGENT)
    # The settings only: the two comment lines are the same at every change, and state does not repeat them.
    assert inputs["agent_yaml"] == AGENT_YAML_SETTINGS
    assert desired.render_agent_yaml("gpu-01", agent.AgentSettings.from_props(inputs), "gpu-01") == \
        AGENT_YAML_HEADER + AGENT_YAML_SETTINGS
    assert inputs["unit"] == observed.text_digest(desired.render_unit())  # the same for every node: its digest
    assert "KillMode=process" in desired.render_unit()


def test_agent_outputs_keep_the_texts_as_digests_and_read_renders_them_again():
    inputs = checked(AgentInstallProvider(), AGENT)
    kept = agent.digested(inputs)
    # The digest is the whole file's, comment lines included: the one a package before this kept for it.
    file_digest = base64.urlsafe_b64encode(hashlib.sha256((AGENT_YAML_HEADER + AGENT_YAML_SETTINGS).encode()).digest())
    assert kept["agent_yaml"] == f"sha256:{file_digest.decode().rstrip('=')}" and kept["unit"] == inputs["unit"]
    assert agent.texts_of(kept) == {"agent_yaml": AGENT_YAML_HEADER + AGENT_YAML_SETTINGS, "unit": desired.render_unit()}
    assert agent.texts_of(inputs)["agent_yaml"] == AGENT_YAML_HEADER + AGENT_YAML_SETTINGS
    assert agent_wanted(inputs).files[desired.CONFIG_PATH].sha256 == \
        hashlib.sha256((AGENT_YAML_HEADER + AGENT_YAML_SETTINGS).encode()).hexdigest()
    assert agent.changed_inputs(kept, inputs) == [] and agent.changed_inputs(kept, {**inputs, "agent_yaml": "x: 1\n"}) == [
        "agent_yaml"]
    # An input a package before this one recorded holds the whole file: it stands for the same file.
    assert agent.changed_inputs(kept, {**inputs, "agent_yaml": AGENT_YAML_HEADER + AGENT_YAML_SETTINGS}) == []
    assert desired.agent_yaml_input("gpu-01", AGENT_YAML_HEADER + AGENT_YAML_SETTINGS) == AGENT_YAML_SETTINGS
    assert desired.agent_yaml_input("gpu-02", AGENT_YAML_HEADER + AGENT_YAML_SETTINGS) == \
        AGENT_YAML_HEADER + AGENT_YAML_SETTINGS  # another node's file is shown whole
    # A text an earlier package rendered otherwise is known by its digest alone: compared by it, never re-rendered.
    other = {**kept, "agent_yaml": "sha256:" + "A" * 43}
    assert "agent_yaml" not in agent.texts_of(other)
    assert agent_wanted(other).files[desired.CONFIG_PATH].sha256 == "00" * 32


def test_agent_config_is_unknown_while_the_hostname_is():
    inputs = checked(AgentInstallProvider(), {**AGENT, "hostname": Unknown()})
    assert isinstance(inputs["agent_yaml"], Unknown)


def test_agent_servers_change_is_an_update_that_names_the_config():
    p = AgentInstallProvider()
    olds = as_installed(checked(p, AGENT))
    news = checked(p, {**AGENT, "servers": ["cp1:7443", "cp2:7443"]})
    d = p.diff("id", olds, news)
    assert d.changes and not d.replaces
    assert p.diff("id", olds, checked(p, AGENT)).changes is False


def test_agent_drift_after_refresh():
    p = AgentInstallProvider()
    inputs = checked(p, AGENT)
    olds = {**inputs, "installed_sha256": "b" * 64, "observed": as_seen(agent_wanted(inputs, "b" * 64)),
            "state_version": STATE_VERSION}
    assert p.diff("id", olds, inputs).changes is False
    stopped = {**olds, "observed": {**olds["observed"], "unit": "inactive enabled"}}
    assert p.diff("id", stopped, inputs).changes is True


def test_agent_dev_version_needs_a_binary():
    res = AgentInstallProvider().check({}, {**AGENT, "version": "v1.2.3-4-gabc"})
    assert any("binary_path" in f.reason for f in res.failures)


# ---------------------------------------------------------------- EngineCheck

def test_engine_check_rejects_relative_paths():
    res = EngineCheckProvider().check({}, {"node_id": "gpu-01", "connection": CONN,
                                           "engines": {"llamacpp": {"bin": "llama-server"}}})
    assert any("engines.llamacpp.bin" in f.reason and "relative" in f.reason for f in res.failures)


# ---------------------------------------------------------------- serialization

PICKLED_BY_CLASS = {
    ClientCertificateProvider: "gASVRwAAAAAAAACMImxsbWd3X3B1bHVtaS5wcm92aWRlcnMuY2VydGlmaWNhdGWUjBlDbGllbnRDZXJ0aWZpY2F0ZV"
                               "Byb3ZpZGVylJOUKYGULg==",
    NodeIdentityProvider: "gASVPwAAAAAAAACMH2xsbWd3X3B1bHVtaS5wcm92aWRlcnMuaWRlbnRpdHmUjBROb2RlSWRlbnRpdHlQcm92aWRlcpSTlCmBlC4=",
    AgentInstallProvider: "gASVPAAAAAAAAACMHGxsbWd3X3B1bHVtaS5wcm92aWRlcnMuYWdlbnSUjBRBZ2VudEluc3RhbGxQcm92aWRlcpSTlCmBlC4=",
    EngineCheckProvider: "gASVPQAAAAAAAACMHmxsbWd3X3B1bHVtaS5wcm92aWRlcnMuZW5naW5lc5SME0VuZ2luZUNoZWNrUHJvdmlkZXKUk5QpgZQu",
}
"""``__provider`` as states written before ``_glue.ModuleProvider`` hold it (copied from a 2026-12-02 export):
module, class name and a constructor call."""
RESOURCES = {ClientCertificateProvider: ClientCertificate, NodeIdentityProvider: NodeIdentity,
             AgentInstallProvider: AgentInstall, EngineCheckProvider: EngineCheck}


@pytest.mark.parametrize("cls", [ClientCertificateProvider, NodeIdentityProvider, AgentInstallProvider, EngineCheckProvider])
def test_providers_pickle_as_their_modules_one_instance_and_hold_no_state(cls):
    provider = RESOURCES[cls].PROVIDER.instance()
    assert type(provider) is cls
    stored = serialize_provider(provider)  # what the SDK puts in state, as it puts it there
    payload = base64.b64decode(stored)
    assert cls.__module__.encode() in payload and b"PROVIDER" in payload and cls.__name__.encode() not in payload
    assert b"/work" not in payload
    assert len(stored) <= 84, stored  # 112, 104, 100 and 100 by class
    assert len(stored) <= len(PICKLED_BY_CLASS[cls]) - 16
    assert dill.loads(payload) is provider
    # A state written before loads too: an instance of the same class.
    assert type(dill.loads(base64.b64decode(PICKLED_BY_CLASS[cls]))) is cls
    assert vars(provider) == {}
    assert cls.serialize_as_secret_always is False


def test_a_provider_other_than_its_modules_one_instance_is_refused():
    with pytest.raises(Exception, match="not the same object"):
        dill.dumps(EngineCheckProvider(), recurse=True)

    class Stray(EngineCheckProvider):
        pass

    with pytest.raises(TypeError, match="must be the one Stray"):
        Stray.instance()
