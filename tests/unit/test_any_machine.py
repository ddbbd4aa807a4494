"""One stack file, run from any operator's machine or a CI runner: what only tells this machine how to reach a node
(where the SSH key file is, under whose home directory; where a local build lies) is no change to the node, and a
real change still is. Through the providers' own check and diff, values shaped as the engine sends them."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.output import Unknown

from llmgw_pulumi import validate
from llmgw_pulumi.config.specs import Connection, Problems, is_unknown
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.nodestate.observed import STATE_VERSION
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.providers.certificate import ClientCertificateProvider
from llmgw_pulumi.providers.engines import EngineCheckProvider
from llmgw_pulumi.providers.identity import NodeIdentityProvider
from llmgw_pulumi.providers.identity import wanted as identity_wanted
from llmgw_pulumi.ssh.keys import load_private_key
from llmgw_pulumi.stack import program
from tests.unit import Mocks
from tests.unit.provider_inputs import as_installed, as_seen

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"
PEMS = {"ca_pem": "-----BEGIN CERTIFICATE-----\nCA\n", "cert_pem": "-----BEGIN CERTIFICATE-----\nC\n"}


def conn(path: str) -> dict[str, Any]:
    return {"host": "10.0.0.11", "user": "deploy", "port": 22.0, "wait": 30.0, "private_key_path": path}


def inputs_of(provider: Any, path: str) -> dict[str, Any]:
    """One node's inputs to ``provider`` with its key at ``path``, as check returns them."""
    given: dict[str, Any] = {"node_id": "gpu-01", "connection": conn(path)}
    if isinstance(provider, ClientCertificateProvider):
        given.update(pki_dir="/srv/pki", validity_hours=100.0, renew_before_hours=10.0, key_origin="node")
    elif isinstance(provider, NodeIdentityProvider):
        given.update(PEMS, key_origin="node", known_host_key=HOST_KEY)
    elif isinstance(provider, AgentInstallProvider):
        given.update(known_host_key=HOST_KEY, hostname="gpu-01", servers=["cp1:7443"], version="v1.2.3",
                     release_url="https://r.example/llmgw")
    else:
        given.update(known_host_key=HOST_KEY, engines={"vllm": {"bin": "/opt/vllm"}})
    res = provider.check({}, given)
    assert res.failures == [], res.failures
    return dict(res.inputs)


def recorded(provider: Any, path: str) -> dict[str, Any]:
    """What state holds after ``provider`` created the node's resource with its key at ``path`` (the node seen
    holding what the inputs say)."""
    inputs = inputs_of(provider, path)
    if isinstance(provider, NodeIdentityProvider):
        return {**inputs, "host_key": HOST_KEY, "hostname": "gpu-01", "observed": as_seen(identity_wanted(inputs)),
                "state_version": STATE_VERSION}
    if isinstance(provider, AgentInstallProvider):
        return as_installed(inputs)
    return inputs


PROVIDERS = [ClientCertificateProvider(), NodeIdentityProvider(), AgentInstallProvider(), EngineCheckProvider()]


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: type(p).__name__)
def test_the_key_path_as_written_is_the_same_from_every_home_and_another_key_is_still_a_change(provider: Any) -> None:
    written = inputs_of(provider, "~/.ssh/id_fleet")
    # Two operators and a CI runner record the same inputs: nothing to do.
    assert provider.diff("gpu-01", recorded(provider, "~/.ssh/id_fleet"), written).changes is False
    # A stack an earlier package recorded, with the path expanded under whichever home directory ran it.
    for expanded in ("/home/alice/.ssh/id_fleet", "/root/.ssh/id_fleet", "/builds/ci/.ssh/id_fleet"):
        assert provider.diff("gpu-01", recorded(provider, expanded), written).changes is False, expanded
    # Another key file is a change, of the operator's side only: it never replaces the node's resources.
    for other in ("~/.ssh/id_other", "/home/alice/.ssh/id_other", "/etc/fleet/id_fleet"):
        d = provider.diff("gpu-01", recorded(provider, other), written)
        assert d.changes is True and d.replaces == [], other
    # A real change is still one.
    moved = {**written, "connection": {**written["connection"], "host": "10.0.0.12"}}
    d = provider.diff("gpu-01", recorded(provider, "~/.ssh/id_fleet"), moved)
    assert d.changes is True and d.replaces == ["connection.host"]


def test_a_key_path_is_absolute_or_under_the_home_directory() -> None:
    for good in ("~/.ssh/id_fleet", "/etc/fleet/id_fleet"):
        assert validate.operator_path(good, "path of the SSH private key") is None, good
    for bad in ("id_fleet", ".ssh/id_fleet", "~alice/.ssh/id", "~/../etc/shadow", "~/a\nb", ""):
        problems = Problems("gpu-01")
        Connection.collect({"host": "10.0.0.11", "private_key_path": bad}, problems)
        found = [(name, fix) for name, _, fix in problems]
        assert [name for name, _ in found] == ["connection.private_key_path"], (bad, found)
        assert found[0][1].startswith("give"), (bad, found)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    pulumi.runtime.set_mocks(Mocks(), preview=False)
    yield tmp_path / "home"
    pulumi.runtime.set_all_config({}, [])


def operator_key(home: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    path = home / ".ssh" / "id_fleet"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def test_the_program_records_a_home_path_as_written_and_the_providers_read_it_under_their_home(home: Path) -> None:
    path = operator_key(home)
    spec = types.SimpleNamespace(ssh_private_key_path="~/.ssh/id_fleet")
    recorded = program.ssh_credentials(spec, {})  # type: ignore[arg-type]
    assert recorded == {"private_key_path": "~/.ssh/id_fleet"}
    assert load_private_key(Connection(host="h", user="u", **recorded), "gpu-01") is not None
    # Any other path is recorded absolute, as before.
    absolute = types.SimpleNamespace(ssh_private_key_path=str(path))
    assert program.ssh_credentials(absolute, {}) == {"private_key_path": str(path)}  # type: ignore[arg-type]
    # Under another home directory the same record names that home's key: missing there, the error says which.
    path.unlink()
    with pytest.raises(ConfigError) as err:
        load_private_key(Connection(host="h", user="u", **recorded), "gpu-01")
    assert err.value.field == "connection.private_key_path" and str(path) not in err.value.fix


def test_a_local_build_is_compared_by_its_sha256_not_by_where_it_lies() -> None:
    p = AgentInstallProvider()
    base = {k: v for k, v in inputs_of(p, "~/.ssh/id_fleet").items() if k not in ("release_url", "agent_yaml", "unit")}
    build = {**base, "version": "v1.2.3-4-gabc1234", "binary_sha256": "a" * 64}
    olds = as_installed(p.check({}, {**build, "binary_path": "/home/alice/src/llmgw/llmgw"}).inputs)
    moved = p.check({}, {**build, "binary_path": "/builds/ci/llmgw/llmgw"}).inputs
    assert p.diff("gpu-01", olds, moved).changes is False
    rebuilt = p.check({}, {**build, "binary_path": "/builds/ci/llmgw/llmgw", "binary_sha256": "b" * 64}).inputs
    assert p.diff("gpu-01", olds, rebuilt).changes is True


def test_a_preview_of_the_same_release_shows_the_digests_approved_at_the_last_up_not_their_removal() -> None:
    p = AgentInstallProvider()
    digests = {"amd64": "a" * 64, "arm64": "b" * 64}
    olds = {**inputs_of(p, "~/.ssh/id_fleet"), "release_sha256": digests}
    preview = {k: v for k, v in olds.items() if k not in ("release_sha256", "agent_yaml", "unit")}
    assert p.check(olds, preview).inputs["release_sha256"] == digests
    # Another release: its digests are not known before `up` approves them.
    for key, value in (("version", "v1.2.4"), ("release_url", "https://r.example/other"), ("version", Unknown())):
        assert "release_sha256" not in p.check(olds, {**preview, key: value}).inputs, key
    # `up` gives them: those are kept.
    given = {"amd64": "c" * 64}
    assert p.check(olds, {**preview, "release_sha256": given}).inputs["release_sha256"] == given


@pytest.mark.parametrize("provider", PROVIDERS[1:], ids=lambda p: type(p).__name__)
def test_a_node_behind_no_jump_host_waits_for_no_jump_host_keys_and_its_recorded_host_key_is_carried(
        provider: Any) -> None:
    olds = inputs_of(provider, "~/.ssh/id_fleet")
    # In a preview the node's host keys come from a resource being updated: not known yet.
    pending = {**olds, "known_host_key": Unknown(), "known_jump_host_keys": Unknown()}
    checked = provider.check(olds, pending).inputs
    assert checked["known_host_key"] == HOST_KEY
    assert "known_jump_host_keys" not in checked
    assert provider.diff("gpu-01", recorded(provider, "~/.ssh/id_fleet"), checked).changes is False
    # Behind a jump host its keys are waited for; on another machine nothing is carried.
    jumped = {**pending, "connection": {**olds["connection"], "jump": [{"address": "deploy@10.0.0.1"}]}}
    assert is_unknown(provider.check(olds, jumped).inputs["known_jump_host_keys"])
    moved = {**pending, "connection": {**olds["connection"], "host": "10.0.0.12"}}
    assert is_unknown(provider.check(olds, moved).inputs["known_host_key"])
