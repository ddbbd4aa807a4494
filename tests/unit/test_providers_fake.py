"""The providers' create, update, read and delete for all four resources, on a fake node.

The scripts are the package's own, run with `sh` under a temporary root
(tests/fakenode.py); the providers are called as the engine calls them: with
the inputs check() returns, numbers as floats, old outputs as ``olds``. No
root, no SSH, no network.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from lab import pki as labpki
from llmgw_pulumi import errors
from llmgw_pulumi.certificates import pki
from llmgw_pulumi.nodestate import commands, desired
from llmgw_pulumi.nodestate.observed import STATE_VERSION
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from tests.fakenode import RELEASE_URL, FakeNode
from tests.unit import AGENT_YAML_COMMENTS
from tests.unit.fake_node_resources import (
    CA,
    CERT,
    CONN,
    HOST_KEY,
    KEY,
    PENDING,
    agent_binary,
    agent_inputs,
    cert_public,
    certificate,
    changes_to_systemd,
    engine_inputs,
    files,
    identity_inputs,
    onboard_identity,
    public_of,
    publish,
    sha,
)
from tests.unit.provider_inputs import checked

ANCHOR = "/usr/local/share/ca-certificates/llmgw-ca.crt"
BINARY, CONFIG, UNIT = "/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service"
UNIT_NAME = "llmgw-agent.service"
UNIT_TEXT = desired.render_unit()
"""The unit's text (the input ``unit`` holds its digest)."""
AGENT_YAML_HEADER = AGENT_YAML_COMMENTS.format("gpu-01")


def shas(outs: dict[str, Any]) -> dict[str, str]:
    """path -> the sha256 of the file the resource last saw there (or ``absent``), from its ``observed`` output."""
    return {path: seen.split()[0] for path, seen in files(outs).items()}


# --------------------------------------------------------------------------- ClientCertificate


def test_certificate_is_issued_kept_read_and_deleted_without_a_node(pki_dir: Path) -> None:
    p = ClientCertificateProvider()
    inputs = checked(p, {"node_id": "gpu-07", "pki_dir": str(pki_dir), "validity_hours": 48.0, "renew_before_hours": 4.0,
                         "key_origin": "operator"})
    created = p.create(inputs)
    outs = created.outs
    cert = x509.load_pem_x509_certificate(outs["cert_pem"].encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-07"
    assert pki.verify_issued((pki_dir / "ca.pem").read_text(), outs["cert_pem"])
    key = serialization.load_pem_private_key(outs["key_pem"].encode(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    assert outs["ca_pem"] == (pki_dir / "ca.pem").read_text()
    assert 47.9 < (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() / 3600 < 48.1 + 5 / 60
    assert created.id == f"gpu-07:{outs['serial']}" and outs["validity_hours"] == 48.0
    assert "PRIVATE KEY" not in "".join(outs[k] for k in ("cert_pem", "ca_pem", "fingerprint_sha256"))

    # New validity settings apply at the next issuance: the same certificate is kept.
    news = {**inputs, "validity_hours": 96.0}
    updated = p.update(created.id, outs, news).outs
    assert (updated["serial"], updated["key_pem"], updated["validity_hours"]) == (outs["serial"], outs["key_pem"], 96.0)

    assert p.read(created.id, updated).outs == updated
    before = {f.name: f.read_bytes() for f in pki_dir.iterdir()}
    assert p.delete(created.id, updated) is None
    assert {f.name: f.read_bytes() for f in pki_dir.iterdir()} == before, "delete touched the PKI dir"


# --------------------------------------------------------------------------- NodeIdentity


def test_identity_create_installs_the_files_with_spec_modes(node: FakeNode, pki_dir: Path) -> None:
    inputs, outs = onboard_identity(pki_dir)
    for path, mode, key in [(CA, 0o644, "ca_pem"), (CERT, 0o644, "cert_pem"), (KEY, 0o600, "key_pem"), (ANCHOR, 0o644, "ca_pem")]:
        assert node.read(path) == inputs[key].encode(), path
        assert node.mode(path) == mode, f"{path}: {node.mode(path):o}"
        assert node.owner(path) == "root:root", path
    assert node.mode("/etc/llmgw") == 0o755 and node.owner("/etc/llmgw") == "root:root"
    assert outs["host_key"] == node.host_key and outs["hostname"] == "gpu-01" and outs["arch"] == "amd64"
    assert shas(outs) == {CA: sha(inputs["ca_pem"]), CERT: sha(inputs["cert_pem"]), KEY: sha(inputs["key_pem"]),
                             ANCHOR: sha(inputs["ca_pem"])}
    assert outs["trust"] == "updated" and len(node.calls("update-ca-certificates")) == 1
    assert changes_to_systemd(node) == [], "a first install has no agent to restart"
    assert node.leftovers() == []
    assert NodeIdentityProvider().diff("id", outs, inputs).changes is False


def test_identity_key_is_root_only_from_its_first_byte(node: FakeNode, pki_dir: Path) -> None:
    inputs, _ = onboard_identity(pki_dir)
    key_writes = [r for r in node.chowns if r.path.startswith(KEY + ".llmgw-new.")]
    assert len(key_writes) == 1, node.chowns
    (rec,) = key_writes
    # When chown ran, the temporary file next to the key already held all of it: it was 0600 then.
    assert rec.size == len(inputs["key_pem"]) and rec.mode == 0o600 and rec.owner == "root:root", rec
    assert node.mode(KEY) == 0o600


def test_identity_renewal_restarts_the_agent_and_skips_an_unchanged_trust_anchor(node: FakeNode, pki_dir: Path) -> None:
    inputs, outs = onboard_identity(pki_dir)
    node.set_unit(active="active", enabled="enabled")
    renewed = identity_inputs(certificate(pki_dir))
    assert renewed["cert_pem"] != inputs["cert_pem"]
    new = NodeIdentityProvider().update("id", outs, renewed).outs
    assert node.read(CERT) == renewed["cert_pem"].encode() and node.read(KEY) == renewed["key_pem"].encode()
    assert shas(new)[CERT] == sha(renewed["cert_pem"]) and new["host_key"] == node.host_key
    assert changes_to_systemd(node) == [f"systemctl try-restart {UNIT_NAME}"]
    assert new["trust"] == "unchanged" and len(node.calls("update-ca-certificates")) == 1


def test_identity_tolerates_a_failing_update_ca_certificates(node: FakeNode, pki_dir: Path) -> None:
    node.fail_trust_update = True
    inputs, outs = onboard_identity(pki_dir)
    assert outs["trust"] == "failed: update-ca-certificates: simulated failure"
    assert node.read(ANCHOR) == inputs["ca_pem"].encode()


@pytest.mark.parametrize("change,seen", [
    ("content", lambda key: sha(key + "x") + " 600 root:root"),
    ("mode", lambda key: sha(key) + " 644 root:root"),
    ("owner", lambda key: sha(key) + " 600 nobody:nogroup"),
    ("removed", lambda key: "absent"),
])
def test_identity_read_shows_drift_and_update_repairs_it(node: FakeNode, pki_dir: Path, change: str, seen: Any) -> None:
    p = NodeIdentityProvider()
    inputs, outs = onboard_identity(pki_dir)
    assert p.read("gpu-01", outs).outs["observed"] == outs["observed"], "no drift right after create"
    key = node.path(KEY)
    if change == "content":
        key.write_text(inputs["key_pem"] + "x")
    elif change == "mode":
        key.chmod(0o644)
    elif change == "owner":
        node.chown(KEY, "nobody:nogroup")
    else:
        key.unlink()
    refreshed = p.read("gpu-01", outs).outs
    assert files(refreshed) == {**files(outs), KEY: seen(inputs["key_pem"])}
    assert p.diff("gpu-01", refreshed, inputs).changes is True

    repaired = p.update("gpu-01", refreshed, inputs).outs
    assert node.read(KEY) == inputs["key_pem"].encode() and node.mode(KEY) == 0o600 and node.owner(KEY) == "root:root"
    assert p.read("gpu-01", repaired).outs["observed"] == outs["observed"]
    assert p.diff("gpu-01", repaired, inputs).changes is False


def test_identity_delete_removes_exactly_what_it_installed(node: FakeNode, pki_dir: Path) -> None:
    inputs, outs = onboard_identity(pki_dir)
    node.write("/etc/llmgw/operator-notes.txt", b"not ours\n")
    node.write("/usr/local/share/ca-certificates/other-ca.crt", b"not ours either\n")
    NodeIdentityProvider().delete("gpu-01", outs)
    for path in (CA, CERT, KEY, ANCHOR):
        assert node.read(path) is None, f"{path} left behind"
    assert node.read("/etc/llmgw/operator-notes.txt") == b"not ours\n"
    assert node.read("/usr/local/share/ca-certificates/other-ca.crt") == b"not ours either\n"
    assert len(node.calls("update-ca-certificates")) == 2, "the removed anchor must leave the system bundle"

    node.path("/etc/llmgw/operator-notes.txt").unlink()
    NodeIdentityProvider().delete("gpu-01", outs)  # a second delete finds nothing of its own and empties /etc/llmgw
    assert not node.path("/etc/llmgw").exists()
    assert node.path("/usr/local/share/ca-certificates").is_dir(), "a system directory was removed"


def test_identity_delete_leaves_a_changed_file_and_another_identity_alone(node: FakeNode, pki_dir: Path) -> None:
    p = NodeIdentityProvider()
    inputs, outs = onboard_identity(pki_dir)
    node.path(CA).write_text(inputs["ca_pem"] + "# edited by hand\n")
    p.delete("gpu-01", outs)
    assert node.read(CA) is not None and node.read(KEY) is None, "an edited file is not ours any more"

    # The same machine under a new node id: the new identity is created first, then the old one deleted.
    old_inputs, old_outs = onboard_identity(pki_dir, "gpu-old")
    new_inputs, _ = onboard_identity(pki_dir, "gpu-new")
    refreshed = p.read("gpu-old", old_outs).outs   # a refresh in between records the new identity's files
    p.delete("gpu-old", refreshed)
    for path, key in ((CERT, "cert_pem"), (KEY, "key_pem"), (CA, "ca_pem"), (ANCHOR, "ca_pem")):
        assert node.read(path) == new_inputs[key].encode(), f"{path} of the new identity was removed"


def test_identity_checks_the_recorded_host_key_and_keeps_a_node_that_does_not_answer(node: FakeNode, pki_dir: Path) -> None:
    p = NodeIdentityProvider()
    _, inputs, outs = onboard(pki_dir)  # keyOrigin node: nothing pinned, the key recorded is what is expected
    with pytest.raises(errors.HostKeyChangedError):
        p.update("gpu-01", {**outs, "host_key": "ssh-ed25519 AAAAsomeoneelse"}, inputs)
    node.reachable = False
    kept = p.read("gpu-01", outs)
    assert (kept.id, kept.outs) == ("gpu-01", outs)  # an outage never rewrites the record


def test_identity_outputs_keep_the_host_key_it_saw_not_the_one_it_was_told(node: FakeNode, pki_dir: Path) -> None:
    p = NodeIdentityProvider()
    _, inputs, outs = onboard(pki_dir)
    assert inputs["known_host_key"] == HOST_KEY  # ClientCertificate's, when it had the node make its key
    assert outs["host_key"] == HOST_KEY and "known_host_key" not in outs
    read = p.read("gpu-01", outs).outs
    assert read["host_key"] == HOST_KEY and "known_host_key" not in read
    # A record with no key of its own seen (none of this package's writes one) keeps the one it was told: the
    # only key a later connection could expect.
    told = {k: v for k, v in outs.items() if k != "host_key"} | {"known_host_key": HOST_KEY}
    assert p.read("gpu-01", told).outs["known_host_key"] == HOST_KEY


def test_an_operator_side_change_updates_state_without_reaching_the_node(node: FakeNode, pki_dir: Path) -> None:
    p = NodeIdentityProvider()
    inputs, outs = onboard_identity(pki_dir)
    node.reachable = False  # any connection would fail
    news = {**inputs, "connection": {**inputs["connection"], "user": "ops", "wait": 45.0}}
    assert p.diff("gpu-01", outs, news).changes is True
    new = p.update("gpu-01", outs, news).outs
    assert new["connection"]["user"] == "ops" and new["host_key"] == outs["host_key"] and new["observed"] == outs["observed"]
    assert "known_host_key" not in new


# --------------------------------------------------------------------------- AgentInstall


def assert_agent_installed(node: FakeNode, inputs: dict[str, Any], binary: bytes, outs: dict[str, Any]) -> None:
    assert node.read(BINARY) == binary and node.mode(BINARY) == 0o755 and node.owner(BINARY) == "root:root"
    assert node.read(CONFIG) == (AGENT_YAML_HEADER + inputs["agent_yaml"]).encode() and node.mode(CONFIG) == 0o644
    assert node.read(UNIT) == UNIT_TEXT.encode() and node.mode(UNIT) == 0o644
    assert node.unit() == ("active", "enabled")
    assert outs["installed_sha256"] == sha(binary) and outs["arch"] == "amd64"
    assert files(outs) == {BINARY: f"{sha(binary)} 755 root:root", CONFIG: f"{sha(AGENT_YAML_HEADER + inputs['agent_yaml'])} 644 root:root",
                           UNIT: f"{sha(UNIT_TEXT)} 644 root:root"} and outs["observed"]["unit"] == "active enabled"
    assert outs["state_version"] == STATE_VERSION
    assert node.leftovers() == []


def test_agent_create_copies_a_dev_build_and_starts_it(agent_node: FakeNode, dev_build: Path) -> None:
    node = agent_node
    inputs = agent_inputs(dev_build)
    outs = AgentInstallProvider().create(inputs).outs
    assert_agent_installed(node, inputs, dev_build.read_bytes(), outs)
    assert node.read(CONFIG).startswith(b"# gpu-01, written by llmgw-pulumi") and not inputs["agent_yaml"].startswith("#")
    assert node.calls("curl") == []
    calls = node.calls("systemctl")
    enable = f"systemctl enable --no-reload {UNIT_NAME}"  # systemd reads the new unit once: its reload, not again
    assert calls.count("systemctl daemon-reload") == 1 and calls.index("systemctl daemon-reload") < calls.index(enable)
    assert AgentInstallProvider().diff("gpu-01", outs, inputs).changes is False


def test_agent_create_downloads_a_verified_release(agent_node: FakeNode) -> None:
    node = agent_node
    binary = agent_binary("v1.2.3")
    publish(node, "v1.2.3", binary)
    inputs = agent_inputs(version="v1.2.3", release_url=RELEASE_URL + "/", release_sha256={"amd64": sha(binary)})
    outs = AgentInstallProvider().create(inputs).outs
    assert_agent_installed(node, inputs, binary, outs)
    # Only the binary: the digest it must have was approved on the operator's side (llmgw_pulumi.releases.approval).
    assert [c.split()[-1] for c in node.calls("curl")] == [f"{RELEASE_URL}/v1.2.3/llmgw-v1.2.3-linux-amd64"]


@pytest.mark.parametrize("fault,error,words", [
    ("tampered", errors.ChecksumMismatchError, "was expected; nothing was installed"),
    ("no line", errors.ChecksumMismatchError, "checksums.txt of v1.2.3 has no line for llmgw-v1.2.3-linux-amd64"),
    ("missing", errors.ReleaseFetchError, "llmgw-v1.2.3-linux-amd64: curl: .22. .*the installed agent was left as it was"),
])
def test_agent_refuses_a_bad_release_and_installs_nothing(agent_node: FakeNode, fault: str, error: type, words: str) -> None:
    node = agent_node
    good = agent_binary("v1.2.3")
    approved = {"amd64": sha(good)}
    if fault == "tampered":
        publish(node, "v1.2.3", good, tamper=good + b"# evil\n")
    elif fault == "no line":  # approved for another architecture only
        publish(node, "v1.2.3", good)
        approved = {"arm64": sha(good)}
    else:  # the binary is not there
        publish(node, "v1.2.3", good)
        (node.releases / "v1.2.3" / "llmgw-v1.2.3-linux-amd64").unlink()
    with pytest.raises(error, match=words):
        AgentInstallProvider().create(agent_inputs(version="v1.2.3", release_url=RELEASE_URL, release_sha256=approved))
    for path in (BINARY, CONFIG, UNIT):
        assert node.read(path) is None, f"{path} installed from a bad release"
    assert node.leftovers() == [] and changes_to_systemd(node) == []


def test_agent_update_rewrites_the_config_and_restarts_keeping_the_binary(agent_node: FakeNode, dev_build: Path) -> None:
    node = agent_node
    p = AgentInstallProvider()
    inputs = agent_inputs(dev_build)
    outs = p.create(inputs).outs
    starts = len(node.calls("systemctl"))
    news = agent_inputs(dev_build, servers=["cp1.example.net:7443", "cp2.example.net:7443"], mgmt_addr="10.1.2.3")
    assert p.diff("gpu-01", outs, news).changes is True
    dev_build.write_bytes(b"not read: the binary did not change")  # a `keep` install does not send it
    new = p.update("gpu-01", outs, news).outs
    assert b"servers:\n- cp1.example.net:7443\n- cp2.example.net:7443\n" in node.read(CONFIG)
    assert f"systemctl restart {UNIT_NAME}" in node.calls("systemctl")[starts:]
    assert_agent_installed(node, news, agent_binary("v1.2.3-4-gabcdef"), new)


def test_agent_that_does_not_stay_up_after_an_upgrade_is_rolled_back(agent_node: FakeNode, dev_build: Path) -> None:
    node = agent_node
    p = AgentInstallProvider()
    inputs = agent_inputs(dev_build)
    outs = p.create(inputs).outs
    good = dev_build.read_bytes()
    broken = dev_build.parent / "broken"
    broken.write_bytes(agent_binary("v2.0.0-1-gbad", starts=False))
    news = agent_inputs(broken, servers=["cp2.example.net:7443"])
    with pytest.raises(errors.AgentStartError, match="llmgw: fatal: simulated fault") as raised:
        p.update("gpu-01", outs, news)
    assert "the agent did not stay running; the end of its journal:" in str(raised.value)
    assert node.read(BINARY) == good and node.read(CONFIG) == (AGENT_YAML_HEADER + inputs["agent_yaml"]).encode(), \
        "not restored"
    assert node.read(UNIT) == UNIT_TEXT.encode()
    assert node.unit() == ("active", "enabled"), "the restored agent was not restarted"
    assert node.leftovers() == []


@pytest.mark.parametrize("change,drifted", [
    ("config", [f"observed.{CONFIG}"]),
    ("binary", [f"observed.{BINARY}"]),
    ("binary mode", [f"observed.{BINARY}"]),
    ("stopped", ["observed.unit"]),
])
def test_agent_read_shows_drift_and_update_repairs_it(agent_node: FakeNode, dev_build: Path, change: str,
                                                      drifted: list[str]) -> None:
    node = agent_node
    from llmgw_pulumi.providers.agent import drift

    p = AgentInstallProvider()
    inputs = agent_inputs(dev_build)
    outs = p.create(inputs).outs
    assert p.read("gpu-01", outs).outs["observed"] == outs["observed"], "no drift right after create"
    if change == "config":
        node.path(CONFIG).write_text(AGENT_YAML_HEADER + inputs["agent_yaml"] + "mgmt_addr: 1.2.3.4\n")
    elif change == "binary":
        node.path(BINARY).write_bytes(dev_build.read_bytes() + b"# replaced\n")
    elif change == "binary mode":
        node.path(BINARY).chmod(0o777)
    else:
        node.set_unit(active="inactive", enabled="disabled")
    refreshed = p.read("gpu-01", outs).outs
    assert drift(refreshed, inputs) == drifted
    assert p.diff("gpu-01", refreshed, inputs).changes is True
    repaired = p.update("gpu-01", refreshed, inputs).outs
    assert_agent_installed(node, inputs, dev_build.read_bytes(), repaired)
    assert drift(p.read("gpu-01", repaired).outs, inputs) == []


def test_agent_delete_removes_its_files_unless_another_node_id_owns_them(agent_node: FakeNode, dev_build: Path) -> None:
    node = agent_node
    p = AgentInstallProvider()
    node.write("/etc/llmgw/ca.pem", b"the identity's\n")
    outs = p.create(agent_inputs(dev_build)).outs
    other = p.create(agent_inputs(dev_build, node_id="gpu-other")).outs   # the same machine under a new id
    p.delete("gpu-01", outs)
    assert node.read(CONFIG) is not None and node.read(BINARY) is not None and node.unit() == ("active", "enabled")

    p.delete("gpu-other", other)
    for path in (BINARY, CONFIG, UNIT):
        assert node.read(path) is None, f"{path} left behind"
    assert node.unit() == ("inactive", "disabled")
    assert f"systemctl disable --now {UNIT_NAME}" in node.calls("systemctl")
    assert node.read("/etc/llmgw/ca.pem") == b"the identity's\n"
    assert node.files() == ["/etc/llmgw", "/etc/llmgw/ca.pem"]


# --------------------------------------------------------------------------- EngineCheck


ENGINES = {
    "llamacpp": ("/opt/llama cpp/llama-server", b"#!/bin/sh\necho 'version: 1 (fake)'\n", 0o755),
    "vllm": ("/opt/vllm/bin/vllm", b"#!/bin/sh\necho vllm\n", 0o644),
    "sglang": ("/opt/sglang/bin/python3",
               b"#!/bin/sh\necho 'error while loading shared libraries: libfake.so' >&2\nexit 127\n", 0o755),
}


def test_engine_check_reports_each_problem_with_its_hint(node: FakeNode) -> None:
    for path, data, mode in ENGINES.values():
        node.write(path, data, mode)
    configured = {"llamacpp": {"bin": ENGINES["llamacpp"][0]}, "vllm": {"bin": ENGINES["vllm"][0]},
                  "sglang": {"python": ENGINES["sglang"][0]}}
    p = EngineCheckProvider()
    inputs = engine_inputs(**configured)
    outs = p.create(inputs).outs
    problems = {x["engine"]: x for x in outs["problems"]}
    assert {e: x["status"] for e, x in problems.items()} == {"vllm": "not-executable", "sglang": "fails"}
    assert outs["engines_ok"] is False
    assert "-rw-r--r-- root" in problems["vllm"]["problem"] and "chmod 0755 /opt/vllm/bin/vllm" in problems["vllm"]["hint"]
    assert "rc=127" in problems["sglang"]["problem"] and "libfake.so" in problems["sglang"]["problem"]
    assert "ldd /opt/sglang/bin/python3 | grep 'not found'" in problems["sglang"]["hint"]

    # The operator fixes one; a refresh re-probes and sees it.
    node.path(ENGINES["vllm"][0]).chmod(0o755)
    assert [x["engine"] for x in p.read("gpu-01", outs).outs["problems"]] == ["sglang"]
    # Missing, and a hostile path that stays a path.
    hostile = "/opt/x; touch /tmp/pwned #"
    news = engine_inputs(llamacpp={"bin": hostile})
    new = p.update("gpu-01", outs, news).outs
    assert [(x["status"], x["path"]) for x in new["problems"]] == [("missing", hostile)]
    assert not node.path("/tmp/pwned").exists() and not Path("/tmp/pwned").exists()
    with pytest.raises(errors.EngineWillNotRunError, match="does not exist"):
        p.update("gpu-01", new, engine_inputs(fail=True, llamacpp={"bin": hostile}))

    runs = len(node.runs)
    assert p.delete("gpu-01", new) is None and len(node.runs) == runs, "a check leaves nothing to remove"


def test_engine_check_with_engines_that_run(node: FakeNode) -> None:
    path, data, mode = ENGINES["llamacpp"]
    node.write(path, data, mode)
    outs = EngineCheckProvider().create(engine_inputs(llamacpp={"bin": path})).outs
    assert outs["problems"] == [] and outs["engines_ok"] is True
    # No engines configured: the check still reads the node's inventory, in one run.
    runs = len(node.runs)
    outs = EngineCheckProvider().create(engine_inputs()).outs
    assert outs["engines_ok"] is True and outs["problems"] == [] and len(node.runs) == runs + 1


def test_a_read_whose_connection_broke_reads_again_over_a_new_one(node: FakeNode, pki_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    p = NodeIdentityProvider()
    inputs, outs = onboard_identity(pki_dir)
    real_run, calls = FakeNode.run, []

    def breaks_once(self: FakeNode, script: Any, timeout: float = 900) -> Any:
        calls.append(script)
        if len(calls) == 1:
            raise errors.RemoteCommandError("gpu-01", "the SSH connection broke", connection_broke=True)
        return real_run(self, script, timeout)

    monkeypatch.setattr(FakeNode, "run", breaks_once)
    read = p.read("gpu-01", outs)
    assert len(calls) == 2 and read.outs["observed"] == outs["observed"]  # read again, and the node as it is

    # A command that failed without the connection breaking is not repeated.
    calls.clear()

    def fails(self: FakeNode, script: Any, timeout: float = 900) -> Any:
        calls.append(script)
        raise errors.RemoteCommandError("gpu-01", "printed nothing for 900s")

    monkeypatch.setattr(FakeNode, "run", fails)
    with pytest.raises(errors.RemoteCommandError):
        p.read("gpu-01", outs)
    assert len(calls) == 1


# --------------------------------------------------------------------------- keyOrigin node, and adoption
#
# The node makes its key pair with the real openssl of this machine; the
# provider signs its request. The key is 0600 from its first byte and never in
# any output, the certificate is the key's, renewal swaps key and certificate
# together, and a node that already holds an identity this CA issued (as
# onboard-node.sh leaves it) is kept as it is.

MARKER = "PRIVATE" + " KEY"  # built here: no key-shaped literal in the tree


def onboard(pki_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    cert = certificate(pki_dir, key_origin="node")
    inputs = identity_inputs(cert)
    return cert, inputs, NodeIdentityProvider().create(inputs).outs


def test_the_node_makes_its_key_and_it_never_leaves_it(node: FakeNode, pki_dir: Path) -> None:
    cert, inputs, outs = onboard(pki_dir)
    assert "key_pem" not in cert and cert["adopted"] is False and cert["host_key"] == node.host_key
    # (connection holds the operator's SSH key, a fake one here: not the node's)
    shown = [{k: v for k, v in d.items() if k != "connection"} for d in (cert, inputs, outs)]
    assert MARKER not in repr(shown)
    parsed = x509.load_pem_x509_certificate(cert["cert_pem"].encode())
    assert parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-01"
    assert pki.verify_issued((pki_dir / "ca.pem").read_text(), cert["cert_pem"])
    # The key on the node is the certificate's, root-only, and the pending pair is gone (renamed into place).
    key = node.read(KEY)
    assert key is not None and MARKER in key.decode()
    assert public_of(key) == cert_public(cert["cert_pem"])
    assert node.mode(KEY) == 0o600 and node.owner(KEY) == "root:root"
    assert node.read(PENDING) is None and node.leftovers() == []
    # Made in a temporary file that was 0600 and root's when it was given its owner, before it held the key.
    made = [r for r in node.chowns if r.path.startswith(PENDING + ".llmgw-new.")]
    assert len(made) == 1 and made[0].mode == 0o600 and made[0].owner == "root:root", node.chowns
    assert shas(outs)[KEY] == sha(key)
    assert NodeIdentityProvider().diff("gpu-01", outs, inputs).changes is False


def test_renewal_makes_a_new_pair_and_swaps_it_with_the_certificate(node: FakeNode, pki_dir: Path) -> None:
    cert, _, outs = onboard(pki_dir)
    old_key = node.read(KEY)
    node.set_unit(active="active", enabled="enabled")
    # Inside the renewal window (the certificate ends in 100 h; renewal 200 h before) the identity is not kept.
    p = ClientCertificateProvider()
    props = checked(p, {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 1000.0,
                        "renew_before_hours": 200.0, "connection": CONN})
    renewed = p.update("id", cert, props).outs  # an update in place: the recorded host key is expected
    assert renewed["adopted"] is False and renewed["serial"] != cert["serial"]
    # Until NodeIdentity installs the new certificate, the key in use is untouched and the new one waits.
    assert node.read(KEY) == old_key and node.read(PENDING) is not None and node.mode(PENDING) == 0o600
    new = NodeIdentityProvider().update("gpu-01", outs, identity_inputs(renewed)).outs
    key = node.read(KEY)
    assert key != old_key and public_of(key or b"") == cert_public(renewed["cert_pem"])
    assert node.read(CERT) == renewed["cert_pem"].encode() and node.read(PENDING) is None
    assert shas(new)[KEY] == sha(key or b"") and node.mode(KEY) == 0o600
    assert f"systemctl try-restart {desired.UNIT_NAME}" in node.calls("systemctl")


def test_a_node_that_holds_an_identity_of_this_ca_is_adopted_without_a_change(node: FakeNode, pki_dir: Path) -> None:
    # As onboard-node.sh leaves a node: the key made elsewhere, copied in; the certificate this CA issued.
    issued = certificate(pki_dir)  # keyOrigin operator: a key in hand, to write like the script does
    node.path("/etc/llmgw").mkdir(mode=0o755)
    for path, text, mode in ((desired.CA_PATH, issued["ca_pem"], 0o644), (CERT, issued["cert_pem"], 0o644),
                             (KEY, issued["key_pem"], 0o600), (desired.TRUST_ANCHOR_PATH, issued["ca_pem"], 0o644)):
        node.path(path).parent.mkdir(parents=True, exist_ok=True)
        node.path(path).write_text(text)
        node.path(path).chmod(mode)
    before = {p: os.stat(node.path(p)) for p in (desired.CA_PATH, CERT, KEY, desired.TRUST_ANCHOR_PATH)}

    cert = certificate(pki_dir, key_origin="node")
    assert cert["adopted"] is True and cert["serial"] == issued["serial"] and cert["cert_pem"] == issued["cert_pem"]
    # The node was asked what it holds, and never to make a key pair: no key-making script ran, and no pending key
    # was staged (the temporary file a new pair is born in, which the key-making test sees given its owner).
    assert commands.read_node_key() in node.runs and commands.make_node_key("gpu-01") not in node.runs, [s.args for s in node.runs]
    assert [r for r in node.chowns if r.path.startswith(PENDING + ".llmgw-new.")] == [], node.chowns
    assert node.read(PENDING) is None
    outs = NodeIdentityProvider().create(identity_inputs(cert)).outs
    after = {p: os.stat(node.path(p)) for p in before}
    assert {p: (s.st_ino, s.st_mtime_ns) for p, s in after.items()} == {p: (s.st_ino, s.st_mtime_ns) for p, s in before.items()}
    assert outs["trust"] == "unchanged" and node.calls("update-ca-certificates") == []
    assert changes_to_systemd(node) == []


@pytest.mark.parametrize("why", ["another CA", "another node id", "renewal due", "key does not match"])
def test_an_identity_that_cannot_be_kept_is_replaced(tmp_path: Path, pki_dir: Path, why: str) -> None:
    from lab import pki as labpki

    now = dt.datetime.now(dt.UTC)
    authority = pki.load_authority(str(pki_dir), "gpu-01", now)
    labpki.init_ca(tmp_path / "other")
    other = pki.load_authority(str(tmp_path / "other"), "gpu-01", now)
    issuer, node_id = (other, "gpu-01") if why == "another CA" else (authority, "gpu-02" if why == "another node id" else "gpu-01")
    issued = pki.issue(issuer, node_id, dt.timedelta(hours=100), now)
    key_pem = pki.issue(authority, "gpu-01", dt.timedelta(hours=1), now).key_pem if why == "key does not match" else issued.key_pem
    spki = base64.b64encode(public_of(key_pem.encode())).decode()
    renew_before = dt.timedelta(hours=100.5 if why == "renewal due" else 10)
    assert pki.adoptable(authority, "gpu-01", issued.cert_pem, spki, renew_before, now) is None
    # ... and the same identity, right in every respect, is kept: the test above can fail.
    good = pki.issue(authority, "gpu-01", dt.timedelta(hours=100), now)
    good_spki = base64.b64encode(public_of(good.key_pem.encode())).decode()
    assert pki.adoptable(authority, "gpu-01", good.cert_pem, good_spki, dt.timedelta(hours=10), now) is not None


def test_refresh_sees_a_node_key_gone_and_the_next_up_has_a_new_pair_made(node: FakeNode, pki_dir: Path) -> None:
    cert, _, _ = onboard(pki_dir)
    p = ClientCertificateProvider()
    props = checked(p, {"node_id": "gpu-01", "pki_dir": str(pki_dir), "validity_hours": 100.0,
                        "renew_before_hours": 10.0, "connection": CONN})
    assert cert["node_key"] == "held" and p.read("id", cert).outs["node_key"] == "held"
    assert p.diff("id", cert, props).changes is False
    node.path(KEY).unlink()
    gone = p.read("id", cert).outs
    assert gone["node_key"] == "gone"
    # The same machine: an update in place that has a new pair made there, expecting the host key recorded.
    d = p.diff("id", gone, props)
    assert d.changes and d.replaces == []
    renewed = p.update("id", gone, props).outs
    assert renewed["serial"] != cert["serial"] and renewed["node_key"] == "held"
    assert public_of(node.read(PENDING) or b"") == cert_public(renewed["cert_pem"])
    node.path(PENDING).unlink()
    node.path(KEY).write_bytes(pki.issue(pki.load_authority(str(pki_dir), "gpu-01"), "gpu-01",
                                         dt.timedelta(hours=1), dt.datetime.now(dt.UTC)).key_pem.encode())
    assert p.read("id", cert).outs["node_key"] == "another key"


def test_a_missing_node_key_is_an_error_that_names_the_fix(node: FakeNode, pki_dir: Path) -> None:
    cert = certificate(pki_dir, key_origin="node")
    node.path(PENDING).unlink()
    with pytest.raises(errors.NodeKeyMissingError, match="--refresh"):
        NodeIdentityProvider().create(identity_inputs(cert))
    assert node.read(CERT) is None, "the certificate was installed without its key"


def test_a_pending_key_that_is_not_the_certificates_is_never_installed(node: FakeNode, pki_dir: Path) -> None:
    """install-identity.sh takes the pending key only when its public half is the certificate's."""
    from cryptography.hazmat.primitives.asymmetric import ec

    cert = certificate(pki_dir, key_origin="node")
    assert public_of(node.path(PENDING).read_bytes()) == cert_public(cert["cert_pem"])  # as the node made it
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    node.path(PENDING).write_bytes(other)  # another key in its place (the file keeps its 0600)
    assert public_of(other) != cert_public(cert["cert_pem"])
    with pytest.raises(errors.NodeKeyMissingError, match="pulumi up --refresh"):
        NodeIdentityProvider().create(identity_inputs(cert))
    assert node.read(CERT) is None and node.read(KEY) is None, "a certificate was installed with a key not its own"
    assert node.path(PENDING).read_bytes() == other


def test_an_encrypted_ca_key_issues_with_its_passphrase_as_an_input(tmp_path: Path) -> None:
    labpki.init_ca(tmp_path / "pki")
    key_path = tmp_path / "pki" / "ca-key.pem"
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.BestAvailableEncryption(b"s3cret phrase")))
    p = ClientCertificateProvider()
    props = {"node_id": "gpu-07", "pki_dir": str(tmp_path / "pki"), "key_origin": "operator"}
    with pytest.raises(errors.AuthorityError, match="is encrypted, and no passphrase for it is configured"):
        p.create(checked(p, props))
    outs = p.create(checked(p, {**props, "ca_key_passphrase": "s3cret phrase"})).outs
    assert pki.verify_issued((tmp_path / "pki" / "ca.pem").read_text(), outs["cert_pem"])
    # A new passphrase (the key re-encrypted) is a change of state only, never a new certificate.
    moved = p.diff("id", outs, checked(p, {**props, "ca_key_passphrase": "another"}))
    assert (moved.changes, moved.replaces) == (True, [])
    assert p.diff("id", outs, checked(p, {**props, "ca_key_passphrase": "s3cret phrase"})).changes is False
    bad = p.check({}, {**props, "ca_key_passphrase": 1234})
    assert [f.reason for f in bad.failures] == ["gpu-07: ca_key_passphrase: is not text. Fix: set it as a secret string"]


def test_a_stack_without_a_ca_passphrase_shows_no_change(pki_dir: Path) -> None:
    """State written before the passphrase existed has no such input; the same config still has none."""
    p = ClientCertificateProvider()
    props = checked(p, {"node_id": "gpu-07", "pki_dir": str(pki_dir), "key_origin": "operator"})
    outs = p.create(props).outs
    assert "ca_key_passphrase" not in props and "ca_key_passphrase" not in outs
    assert p.diff("id", outs, props).changes is False


def test_a_request_not_signed_by_its_key_is_refused(pki_dir: Path) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-01")]))
           .sign(key, hashes.SHA256()))
    pem = csr.public_bytes(serialization.Encoding.PEM).decode()
    assert isinstance(pki.requested_key(pem, "gpu-01"), ec.EllipticCurvePublicKey)
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0xFF  # a flipped bit in the signature
    forged = "-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der)).decode() + "-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(errors.CertificateRequestError, match="not signed by its own key"):
        pki.requested_key(forged, "gpu-01")


def test_the_agent_of_a_script_onboarded_node_is_kept_running(node: FakeNode, dev_build: Path) -> None:
    node.path("/etc/llmgw").mkdir(mode=0o755)
    inputs = agent_inputs(dev_build)
    # What onboard-node.sh writes: the same settings and unit, in its own words.
    script_yaml = ('# gpu-01, written by onboard-node.sh.\nserver: "cp1.example.net:7443"\n\ntls:\n'
                   '  ca: /etc/llmgw/ca.pem\n  cert: /etc/llmgw/agent.pem\n  key: /etc/llmgw/agent-key.pem\n')
    script_unit = "\n".join(line for line in UNIT_TEXT.splitlines() if not line.startswith("#")) + "\n"
    assert script_yaml != inputs["agent_yaml"] and script_unit != UNIT_TEXT
    for path, data, mode in ((desired.BINARY_PATH, dev_build.read_bytes(), 0o755),
                             (desired.CONFIG_PATH, script_yaml.encode(), 0o644), (desired.UNIT_PATH, script_unit.encode(), 0o644)):
        node.path(path).parent.mkdir(parents=True, exist_ok=True)
        node.path(path).write_bytes(data)
        node.path(path).chmod(mode)
    node.set_unit(active="active", enabled="enabled")
    before = {p: os.stat(node.path(p)) for p in (desired.BINARY_PATH, desired.CONFIG_PATH, desired.UNIT_PATH)}

    p = AgentInstallProvider()
    outs = p.create(inputs).outs
    after = {path: os.stat(node.path(path)) for path in before}
    assert {k: (v.st_ino, v.st_mtime_ns) for k, v in after.items()} == {k: (v.st_ino, v.st_mtime_ns) for k, v in before.items()}
    assert changes_to_systemd(node) == [], "the running agent was restarted or reconfigured"
    assert node.read(desired.CONFIG_PATH) == script_yaml.encode()
    # Recorded as what is wanted: no drift, now or after a refresh.
    assert p.diff("gpu-01", outs, inputs).changes is False
    assert p.diff("gpu-01", p.read("gpu-01", outs).outs, inputs).changes is False

    # What differs is changed, and only that: another server rewrites agent.yaml, not the unit.
    news = agent_inputs(dev_build, servers=["cp2.example.net:7443"])
    p.update("gpu-01", outs, news)
    assert node.read(desired.CONFIG_PATH) == (AGENT_YAML_HEADER + news["agent_yaml"]).encode()
    assert os.stat(node.path(desired.UNIT_PATH)).st_ino == before[desired.UNIT_PATH].st_ino
