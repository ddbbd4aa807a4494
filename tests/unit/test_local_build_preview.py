"""A preview reads and hashes `agent.binary` but never runs it (issue 36, item 1; review N1).

The pull request under review may have put the file there: run as `--version`, it would hold the preview job's
environment. The program under the SDK's mocks (a preview and an up), then AgentInstall's check and diff, and
the summary, for a build whose sha256 is the one recorded and for another.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from llmgw_pulumi.config.agent_settings import BinarySource
from llmgw_pulumi.preview import changes, cli
from llmgw_pulumi.providers import agent
from llmgw_pulumi.providers.agent import AgentInstallProvider
from llmgw_pulumi.stack import program
from tests.unit.fake_node_resources import CONN, HOST_KEY
from tests.unit.good_configs import STACK
from tests.unit.review_previews import NOW, preview, step

DEV_VERSION = "v9.9.9-3-gabc1234"


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Path]:
    """A local build that leaves a marker beside itself whenever it is executed."""
    path = tmp_path / "llmgw"
    path.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/ran"\necho "llmgw {DEV_VERSION}"\n')
    path.chmod(0o755)
    program.local_binary.cache_clear()
    yield path
    program.local_binary.cache_clear()


def agent_inputs_of_a_run(build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preview: bool) -> BinarySource:
    """The program run under the SDK's mocks with ``llmgw:agent.binary``: the binary it gives AgentInstall."""
    given: list[BinarySource] = []
    real = program.agent_inputs

    def spy(source: BinarySource, dry_run: bool | None = None) -> BinarySource:
        given.append(real(source, dry_run))
        return given[-1]

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
            return {}, []

    key = tmp_path / "id_ed25519"
    key.write_text("not read in this test")
    key.chmod(0o600)
    asyncio.set_event_loop(asyncio.new_event_loop())
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    monkeypatch.setattr(pulumi, "export", lambda name, value: None)
    monkeypatch.setattr(program, "agent_inputs", spy)
    pulumi.runtime.set_mocks(Mocks(), preview=preview)
    try:
        (tmp_path / "ca.pem").write_text("not read in this test")  # `up` reads it before any node
        pulumi.runtime.set_all_config({**STACK, "llmgw:agent": json.dumps({"binary": str(build)}),
                                       "llmgw:pkiDir": str(tmp_path),
                                       "llmgw:ssh": json.dumps({"user": "deploy", "privateKeyPath": str(key)})}, [])
        # Run as the SDK's test decorator runs a program: its outstanding registrations are awaited, so none is
        # left for the next test in this process.
        pulumi.runtime.test(program.main)()
    finally:
        pulumi.runtime.set_all_config({}, [])
    (agent,) = set(given)
    return agent


def test_a_preview_hashes_the_local_build_and_never_runs_it(build: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    source = agent_inputs_of_a_run(build, tmp_path, monkeypatch, preview=True)
    assert not (tmp_path / "ran").exists(), "the preview executed agent.binary"
    assert source.binary_sha256 == hashlib.sha256(build.read_bytes()).hexdigest()
    assert source.binary_path == str(build) and source.version == ""
    # Positive control: `pulumi up` runs it to learn its version, so the marker does show a run.
    source = agent_inputs_of_a_run(build, tmp_path, monkeypatch, preview=False)
    assert (tmp_path / "ran").read_text() == "--version\n"
    assert source.version == DEV_VERSION


def recorded(build: Path) -> dict[str, Any]:
    """AgentInstall's outputs after an up of ``build`` (the inputs, as the diff reads them)."""
    news = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "hostname": "gpu-01",
            "servers": ["cp1.example.net:7443"], "version": DEV_VERSION, "binary_path": str(build),
            "binary_sha256": hashlib.sha256(build.read_bytes()).hexdigest()}
    res = AgentInstallProvider().check({}, news)
    assert res.failures == []
    return dict(res.inputs)


def previewed(olds: dict[str, Any], build: Path) -> dict[str, Any]:
    """AgentInstall's checked inputs in a preview: the build hashed, its version left empty."""
    news = {**olds, "version": "", "binary_sha256": hashlib.sha256(build.read_bytes()).hexdigest()}
    news.pop("agent_yaml")
    news.pop("unit")
    res = AgentInstallProvider().check(olds, news)
    assert res.failures == [], res.failures
    return dict(res.inputs)


def test_the_same_build_keeps_its_recorded_version_and_is_no_change(build: Path) -> None:
    olds = recorded(build)
    news = previewed(olds, build)
    assert news["version"] == DEV_VERSION
    assert agent.changed_inputs(olds, news) == []


def test_another_build_is_a_change_whose_version_is_not_known_yet(build: Path) -> None:
    olds = recorded(build)
    build.write_text(build.read_text() + "# rebuilt\n")
    news = previewed(olds, build)
    assert news["version"] == ""
    assert agent.changed_inputs(olds, news) == ["version", "binary_sha256"]
    # The summary says so without making a version up.
    data = copy.deepcopy(preview())
    upgrade = step(data, "AgentInstall", "node10")
    upgrade["oldState"]["inputs"].update(version=olds["version"], binary_path=olds["binary_path"],
                                         binary_sha256=olds["binary_sha256"])
    upgrade["newState"]["inputs"].update(version="", binary_path=news["binary_path"], binary_sha256=news["binary_sha256"])
    assert cli.review(data, NOW).nodes["node10"].upgrade == (DEV_VERSION, changes.NEW_LOCAL_BUILD)


def test_a_version_left_empty_needs_the_build_and_its_sha256() -> None:
    """Only a preview's reading of a local build may leave the version empty: a release, or a build without its
    sha256, is still refused naming the field."""
    base = {"node_id": "gpu-01", "connection": CONN, "known_host_key": HOST_KEY, "hostname": "gpu-01",
            "servers": ["cp1.example.net:7443"], "version": ""}
    for extra in ({"release_url": "https://releases.example.net/llmgw"}, {"binary_path": "/srv/llmgw"}):
        res = AgentInstallProvider().check({}, {**base, **extra})
        assert res.failures and any("version" in f.reason or "binary_sha256" in f.reason for f in res.failures), extra
