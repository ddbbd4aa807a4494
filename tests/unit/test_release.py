"""The operator's side of release trust (llmgw_pulumi.releases.approval) and what the node checks (install-agent.sh).

Pure parts directly; signatures with the real ssh-keygen; the node's checks with the real scripts on a fake node.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from lab.release_server import corrupt_signature, make_signing_key, publish_release
from llmgw_pulumi import errors, validate
from llmgw_pulumi.config import specs, stack_config
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.releases import approval
from llmgw_pulumi.stack import program
from tests.fakenode import RELEASE_URL, FakeNode
from tests.unit.fake_node_resources import agent_binary, agent_inputs, changes_to_systemd, files, publish

BINARY, CONFIG, UNIT = "/usr/local/bin/llmgw", "/etc/llmgw/agent.yaml", "/etc/systemd/system/llmgw-agent.service"
TAG = "v1.2.3"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- URLs (M2, H2)


@pytest.mark.parametrize("url,words", [
    ("http://releases.example.net/llmgw", "is plain http"),
    ("https://deploy:s3cret@releases.example.net/llmgw", "has credentials in it"),
    ("https://token@releases.example.net/llmgw", "has credentials in it"),
    ("ftp://releases.example.net/llmgw", "is not an https URL"),
    ("https://releases.example.net:99999/llmgw", "port"),
])
def test_release_urls_that_are_not_plain_https_are_refused_with_a_fix(url: str, words: str) -> None:
    problem = validate.url(url)
    assert problem is not None and words in problem[0], problem
    assert "s3cret" not in problem[0] + problem[1]  # a credential is never echoed
    config = {"pkiDir": "/pki", "servers": ["cp:7443"], "agent": {"version": "v1.4.2", "releaseUrl": url},
              "ssh": {"privateKeyPath": "/k"}, "nodes": [{"id": "gpu-01", "address": "10.0.0.1"}]}
    with pytest.raises(StackConfigError) as raised:
        stack_config.parse(config)
    assert [(p[1], words in p[2]) for p in raised.value.problems] == [("agent.releaseUrl", True)]
    # The provider's check refuses it too, before any side effect.
    res = AgentInstallProvider().check({}, {"node_id": "gpu-01", "connection": {"host": "10.0.0.1"}, "hostname": "gpu-01",
                                            "servers": ["cp:7443"], "version": "v1.4.2", "release_url": url})
    assert len(res.failures) == 1 and "release_url" in res.failures[0].reason and words in res.failures[0].reason


def test_a_plain_https_url_is_accepted() -> None:
    assert validate.url("https://releases.example.net:8443/llmgw") is None


# --------------------------------------------------------------------------- checksums.txt (L4)


def test_checksums_are_read_per_architecture() -> None:
    a, b = "a" * 64, "B" * 64
    text = f"{a}  llmgw-{TAG}-linux-amd64\r\n{b} *llmgw-{TAG}-linux-arm64\n\n{'c' * 64}  llmgw-{TAG}.tar.gz\n"
    assert approval.parse_checksums(text, TAG) == {"amd64": a, "arm64": "b" * 64}


@pytest.mark.parametrize("text,words", [
    (f"{'a' * 63}  llmgw-{TAG}-linux-amd64\n", "line 1: "),
    (f"{'a' * 64}  llmgw-{TAG}-linux-amd64\n{'b' * 64}  llmgw-{TAG}-linux-amd64\n", "more than once (line 2)"),
    (f"{'a' * 64}  llmgw-v1.0.0-linux-amd64\n", "lists no llmgw-v1.2.3-linux-<arch> binary"),
    (f"{'a' * 64}  llmgw-{TAG}-linux-amd64 extra\n", "line 1: "),
    (f"{'g' * 64}  llmgw-{TAG}-linux-amd64\n", "line 1: "),
    (f"{'a' * 64}  llmgw-{TAG}-linux-amd64 \x1b[2J\n", "line 1: "),
    (f"{'a' * 64}  llmgw-{TAG}-linux-amd64.sig\n{'a' * 64}  old/llmgw-{TAG}-linux-amd64\n", "lists no"),
    ("", "lists no"),
])
def test_a_checksums_txt_that_is_not_exactly_one_good_line_per_file_is_refused(text: str, words: str) -> None:
    with pytest.raises(errors.ChecksumMismatchError, match="checksums.txt of v1.2.3") as raised:
        approval.parse_checksums(text, TAG)
    assert words in str(raised.value) and "fix: republish checksums.txt in sha256sum format" in str(raised.value)
    assert "\x1b" not in str(raised.value)  # what the server sent is shown escaped


# --------------------------------------------------------------------------- signatures


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path, Path]:
    """(releases root, the signing key's public line, its private key, another key) with TAG published, signed."""
    base = tmp_path_factory.mktemp("signed")
    key, public = make_signing_key(base / "key")
    other, _ = make_signing_key(base / "other")
    publish_release(base / "releases", TAG, {"amd64": b"bytes"}, sign_with=key)
    return base / "releases", public, key, other


def test_a_good_signature_verifies_and_any_change_does_not(signed: tuple[Path, str, Path, Path], tmp_path: Path) -> None:
    root, public, _, other = signed
    data = (root / TAG / "checksums.txt").read_bytes()
    sig = (root / TAG / "checksums.txt.sig").read_bytes()
    approval.verify_signature(data, sig, public, "checksums.txt")
    with pytest.raises(errors.ReleaseSignatureError, match="does not verify with agent.signingKey SHA256:"):
        approval.verify_signature(data + b"\n", sig, public, "checksums.txt")
    copy = tmp_path / "copy"
    publish_release(copy, TAG, {"amd64": b"bytes"}, sign_with=other)  # the same file, signed by another key
    with pytest.raises(errors.ReleaseSignatureError):
        approval.verify_signature(data, (copy / TAG / "checksums.txt.sig").read_bytes(), public, "checksums.txt")
    corrupt_signature(copy, TAG)
    with pytest.raises(errors.ReleaseSignatureError):
        approval.verify_signature(data, (copy / TAG / "checksums.txt.sig").read_bytes(), public, "checksums.txt")


def test_a_signature_in_another_namespace_does_not_verify(signed: tuple[Path, str, Path, Path], tmp_path: Path) -> None:
    import subprocess

    root, public, key, _ = signed
    data = tmp_path / "checksums.txt"
    data.write_bytes((root / TAG / "checksums.txt").read_bytes())
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", "file", str(data)], check=True)
    with pytest.raises(errors.ReleaseSignatureError):
        approval.verify_signature(data.read_bytes(), Path(f"{data}.sig").read_bytes(), public, "checksums.txt")


# --------------------------------------------------------------------------- approval without network


def test_pins_are_the_digests_and_nothing_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_: Any, **__: Any) -> bytes:
        raise AssertionError("fetched")

    monkeypatch.setattr(approval, "https_get", no_network)
    pinned = approval.Release("https://r.example", TAG, pins=(("amd64", "a" * 64),))
    assert approval.approve(pinned) == {"amd64": "a" * 64}
    source = specs.BinarySource(version=TAG, release_url="https://r.example", allow_unverified_release=True)
    assert program.agent_inputs(source, dry_run=True).release_sha256 is None  # a preview fetches nothing


def test_an_approval_is_fetched_once_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[str] = []

    def get(url: str, _ca: str | None, **_: Any) -> bytes:
        fetched.append(url)
        return f"{'d' * 64}  llmgw-v7.7.7-linux-amd64\n".encode()

    monkeypatch.setattr(approval, "https_get", get)
    approval.approve.cache_clear()  # an earlier run of the tests in this process (the mutation run's) fetched it
    source = approval.Release("https://once.example", "v7.7.7")
    assert approval.approve(source) == approval.approve(source) == {"amd64": "d" * 64}
    assert fetched == ["https://once.example/v7.7.7/checksums.txt"]


def test_a_release_is_said_once_per_run_as_an_ephemeral_line_of_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes that name the same release (the stack's, or each its own override of it) have it approved and said
    once; ephemeral, on the stack resource: the CLI prints it once, in the stack's row (docs/operations.md,
    "What the CLI shows")."""
    said: list[tuple[str, Any, Any]] = []
    monkeypatch.setattr(program.pulumi.log, "info", lambda msg, resource=None, stream_id=None, ephemeral=None:
                        said.append((msg, resource, ephemeral)))
    root = object()
    monkeypatch.setattr(program.pulumi.runtime, "get_root_resource", lambda: root)
    run = {"monitor": object()}  # one engine connection per program run
    monkeypatch.setattr(program.pulumi.runtime.settings, "get_monitor", lambda: run["monitor"])
    pins = {"amd64": "a" * 64}
    source = specs.BinarySource(version=TAG, release_url="https://r.example/", release_sha256=pins)
    for _ in range(3):  # e.g. three nodes with `agent: {version: v1.2.3, ...}` of their own
        assert program.agent_inputs(source, dry_run=False).release_sha256 == pins
    assert said == [(f"llmgw {TAG} from https://r.example: the sha256 of amd64 approved pinned in agent.sha256", root, True)]
    program.agent_inputs(specs.BinarySource(version="v1.2.4", release_url="https://r.example", release_sha256=pins),
                         dry_run=False)
    assert [m for m, _, _ in said][1:] == ["llmgw v1.2.4 from https://r.example: the sha256 of amd64 approved pinned in agent.sha256"]
    program.agent_inputs(source, dry_run=True)  # a preview approves and says nothing
    assert len(said) == 2
    run["monitor"] = object()  # the next program run in the same process (the Automation API) says it again
    program.agent_inputs(source, dry_run=False)
    assert [m for m, _, _ in said][2:] == [said[0][0]]


def test_the_diff_never_compares_how_a_release_is_verified() -> None:
    """State written before these inputs existed, and a preview (which knows no digests): no change."""
    p = AgentInstallProvider()
    # As ca1dd75 recorded it: the unit's state in node_state (no agent.yaml or unit text here to compare).
    olds = {"node_id": "gpu-01", "version": TAG, "release_url": RELEASE_URL, "servers": ["cp:7443"],
            "node_state": {"active": "active", "enabled": "enabled"}}
    news = {**olds, "release_sha256": {"amd64": "a" * 64}, "signing_key": "ssh-ed25519 AAAA", "fetch": "operator",
            "release_ca": "/ca.pem"}
    assert p.diff("gpu-01", olds, news).changes is False
    assert p.diff("gpu-01", olds, {**news, "version": "v1.2.4"}).changes is True


def test_fetch_operator_downloads_once_per_digest_and_refuses_other_bytes(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    served = {"bytes": b"the release"}
    calls: list[str] = []

    def download(url: str, _ca: str | None, out: Any, _limit: int, _deadline: float) -> str:
        calls.append(url)
        out.write(served["bytes"])
        return sha(served["bytes"])  # what _download returns: the sha256 of what it wrote

    monkeypatch.setattr(approval, "_download", download)
    source = approval.Release("https://r.example", TAG)
    digest = sha(b"the release")
    assert approval.fetch_binary_file(source, "amd64", digest, tmp_path).read_bytes() == b"the release"
    assert approval.fetch_binary_file(source, "amd64", digest, tmp_path).read_bytes() == b"the release"
    assert calls == [f"https://r.example/{TAG}/llmgw-{TAG}-linux-amd64"]
    (tmp_path / digest).write_bytes(b"planted")  # the cache is hashed again when read
    served["bytes"] = b"evil"
    with pytest.raises(errors.ChecksumMismatchError, match="nothing was pushed to any node"):
        approval.fetch_binary_file(source, "amd64", digest, tmp_path)
    assert (tmp_path / digest).read_bytes() == b"planted" and len(calls) == 2


# --------------------------------------------------------------------------- what the node checks


def release_inputs(binary: bytes, **extra: Any) -> dict[str, Any]:
    return agent_inputs(version=TAG, release_url=RELEASE_URL, release_sha256={"amd64": sha(binary)}, **extra)


def test_a_binary_that_reports_another_version_is_not_installed(agent_node: FakeNode) -> None:  # noqa: F811
    fake = agent_node
    old = agent_binary("v1.0.0")
    publish(fake, TAG, old)  # an old build under the new tag, with its own (approved) sha256
    with pytest.raises(errors.ReleaseVersionError, match=f"reports version 'v1.0.0', not {TAG}; nothing was installed"):
        AgentInstallProvider().create(release_inputs(old))
    for path in (BINARY, CONFIG, UNIT):
        assert fake.read(path) is None
    assert fake.leftovers() == [] and changes_to_systemd(fake) == []


def test_where_the_node_fetches_the_release_is_a_debug_record_once_its_turn_has_come(
        agent_node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Said once per node, as its install begins (inside the rollout's gate, after any wait): a debug diagnostic
    (`pulumi up --debug`, the event log), not an info line the CLI would print three times per node."""
    import contextlib
    import logging

    from llmgw_pulumi.providers import agent

    binary = agent_binary(TAG)
    publish(agent_node, TAG, binary)
    seen: list[tuple[int, str]] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.levelno, record.getMessage()))

    @contextlib.contextmanager
    def gate(_policy: Any, node: str) -> Any:
        seen.append((0, f"{node}: gate entered"))
        yield

    monkeypatch.setattr(agent.rollout, "onboarding", gate)
    recorder = Recorder(logging.DEBUG)
    agent.log.addHandler(recorder)
    try:
        AgentInstallProvider().create(release_inputs(binary))
    finally:
        agent.log.removeHandler(recorder)
    fetch = f"gpu-01: the node fetches llmgw {TAG} from {RELEASE_URL} and verifies it against the sha256 approved on this machine"
    assert [m for _, m in seen if "gate" in m or "fetches" in m] == ["gpu-01: gate entered", fetch], seen
    assert (logging.DEBUG, fetch) in seen
    assert not [m for level, m in seen if level >= logging.INFO], seen


def test_the_right_bytes_with_the_wrong_mode_are_repaired_in_place(agent_node: FakeNode) -> None:  # noqa: F811
    """M1: refresh reports the mode, and `up` makes it right without rewriting the binary or restarting."""
    fake = agent_node
    binary = agent_binary(TAG)
    publish(fake, TAG, binary)
    p = AgentInstallProvider()
    inputs = release_inputs(binary)
    outs = p.create(inputs).outs
    fake.path(BINARY).chmod(0o777)
    inode = fake.path(BINARY).stat().st_ino
    refreshed = p.read("gpu-01", outs).outs
    assert files(refreshed)[BINARY] == f"{sha(binary)} 777 root:root", refreshed["observed"]
    restarts = len(changes_to_systemd(fake))
    repaired = p.update("gpu-01", refreshed, inputs).outs
    assert fake.mode(BINARY) == 0o755 and fake.path(BINARY).stat().st_ino == inode
    assert files(repaired)[BINARY] == f"{sha(binary)} 755 root:root"
    assert [c for c in changes_to_systemd(fake)[restarts:] if "restart" in c] == []


@pytest.mark.parametrize("directory,how", [
    ("/usr/local/bin", "group-writable"),
    ("/usr/local", "owned by another user"),
    ("/etc/systemd/system", "world-writable"),
])
def test_nothing_is_installed_into_a_directory_another_user_can_write(agent_node: FakeNode, directory: str,  # noqa: F811
                                                                      how: str) -> None:
    """L5: a user who can write there could plant the rollback copy (llmgw.llmgw-prev) or swap the binary."""
    fake = agent_node
    binary = agent_binary(TAG)
    publish(fake, TAG, binary)
    if how == "owned by another user":
        fake.chown(directory, "deploy:deploy")
    else:
        fake.path(directory).chmod(0o2775 if how == "group-writable" else 0o1777)
    fake.write(BINARY + ".llmgw-prev", b"#!/bin/sh\n# planted\n", 0o755)  # what a rollback would put back
    with pytest.raises(errors.UnsafeDirectoryError) as raised:
        AgentInstallProvider().create(release_inputs(binary))
    assert f"{directory} is owned by" in str(raised.value) and f"chown root:root {directory}" in str(raised.value)
    for path in (BINARY, CONFIG, UNIT):
        assert fake.read(path) is None
    assert fake.calls("curl") == []  # refused before anything was downloaded


# --------------------------------------------------------------------------- stack config


def test_a_nodes_agent_settings_fall_back_to_the_stacks_but_pins_only_for_the_same_version(tmp_path: Path) -> None:
    _, key = make_signing_key(tmp_path)
    pins = {"amd64": "a" * 64}
    config = {"pkiDir": "/pki", "servers": ["cp:7443"], "ssh": {"privateKeyPath": "/k"},
              "agent": {"version": "v1.4.2", "releaseUrl": "https://r.example", "signingKey": key, "sha256": pins},
              "nodes": [{"id": "gpu-01", "address": "10.0.0.1", "agent": {"fetch": "operator"}},
                        {"id": "gpu-02", "address": "10.0.0.2", "agent": {"version": "v1.5.0"}},
                        {"id": "gpu-03", "address": "10.0.0.3"}]}
    spec = stack_config.parse(config)
    air_gapped, canary, plain = spec.nodes
    assert air_gapped.agent is not None and canary.agent is not None and plain.agent is None
    assert (air_gapped.agent.version, air_gapped.agent.fetch, air_gapped.agent.release_sha256) == ("v1.4.2", "operator", pins)
    assert air_gapped.agent.signing_key == key and canary.agent.signing_key == key
    assert (canary.agent.version, canary.agent.release_sha256, canary.agent.fetch) == ("v1.5.0", None, None)


@pytest.mark.parametrize("agent,field,words", [
    ({"signingKey": "ssh-ed25519 not-a-key"}, "agent.signingKey", "is not an OpenSSH public key"),
    ({"sha256": {"amd64": "abc"}}, "agent.sha256", "not 64 hex digits"),
    ({"sha256": "abc"}, "agent.sha256", "not a mapping"),
    ({"fetch": "bastion"}, "agent.fetch", "is not node or operator"),
    ({"releaseCa": ""}, "agent.releaseCa", "is empty"),
])
def test_bad_release_settings_are_refused_with_a_fix(agent: dict[str, Any], field: str, words: str) -> None:
    config = {"pkiDir": "/pki", "servers": ["cp:7443"], "ssh": {"privateKeyPath": "/k"},
              "agent": {"version": "v1.4.2", "releaseUrl": "https://r.example", **agent},
              "nodes": [{"id": "gpu-01", "address": "10.0.0.1"}]}
    with pytest.raises(StackConfigError) as raised:
        stack_config.parse(config)
    assert [(p[1], words in p[2]) for p in raised.value.problems] == [(field, True)], raised.value.problems
