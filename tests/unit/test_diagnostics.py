"""What a provider logs reaches the engine under the URN of the resource the engine asked about.

The SDK's own dynamic-provider server (`python -m pulumi.dynamic`, the process the engine starts for
`pulumi-python` resources) runs here as it does under the CLI, on loopback; a small engine double takes its Log
calls. The provider below logs from inside the package's provider wrapper (``base.operator_errors``), as the four
providers do, and the URN it is logged under must be the one in the engine's request: no input names it.
"""

from __future__ import annotations

import logging
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import grpc
import pulumi
import pytest
from pulumi.dynamic import CreateResult, ResourceProvider
from pulumi.runtime.proto import engine_pb2, provider_pb2

from llmgw_pulumi import errors
from llmgw_pulumi.providers import _diagnostics, base
from tests.unit import dynamic_server

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("llmgw_pulumi.tests.diagnostics")
URN = "urn:pulumi:prod::llmgw::llmgw:index:Node$pulumi-python:dynamic/llmgw:AgentInstall::gpu-07"


class LoggingProvider(ResourceProvider):
    """Logs one line, as AgentInstall does when it starts fetching a release, and says which URN it was under."""

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        log.info("gpu-07 fetches llmgw v1.4.2")
        return CreateResult("gpu-07", {"urn_seen": _diagnostics._urn.get() or ""})


class DetailProvider(ResourceProvider):
    """Logs a detail at DEBUG, as AgentInstall says where a node fetches its release, then a line at INFO."""

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        log.debug("gpu-07: the node fetches llmgw v1.4.2")
        log.info("gpu-07: waiting up to 5s for ssh")
        return CreateResult("gpu-07", {})


class WaitingProvider(ResourceProvider):
    """Says that it waits for a node, as the SSH transport does: an ephemeral line for the stack's row."""

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        log.info("gpu-07: waiting up to 5s for ssh", extra={"ephemeral": True, "stack_row": True})
        log.info("gpu-07: a line of its own row", extra={"ephemeral": True})
        return CreateResult("gpu-07", {})


class FailingProvider(ResourceProvider):
    """Fails as a provider does: with the package's error for an unreachable node, or with a bug (``props['bug']``)."""

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        if props.get("bug"):
            return {}["a key"]  # type: ignore[no-any-return]
        raise errors.UnreachableError("gpu-07", "cannot reach deploy@10.0.0.7 over ssh after 5s\n(last error: refused)")


def create_request(urn: str, provider: ResourceProvider | None = None, **inputs: Any) -> Any:
    return dynamic_server.create_request(urn, provider or LoggingProvider(), **inputs)


def test_what_a_provider_logs_is_sent_under_the_urn_of_the_engines_request(engine, dynamic_provider):
    double, _ = engine
    response = dynamic_provider.Create(create_request(URN), timeout=60)
    assert response.id == "gpu-07"
    assert response.properties["urn_seen"] == URN  # the provider's own view, under the real SDK server
    sent = [(r.urn, r.message, r.severity) for r in double.logs]
    assert sent == [(URN, "gpu-07 fetches llmgw v1.4.2", engine_pb2.INFO)], sent


def test_each_request_is_logged_under_its_own_urn(engine, dynamic_provider):
    double, _ = engine
    other = URN.replace("gpu-07", "gpu-08")
    for urn in (URN, other):
        dynamic_provider.Create(create_request(urn), timeout=60)
    assert [r.urn for r in double.logs] == [URN, other]


def test_a_debug_record_is_a_debug_diagnostic_under_the_urn_and_never_printed_unattributed(engine, dynamic_provider,
                                                                                          capsys):
    """The CLI shows a debug diagnostic only with `--debug`, and the event log keeps it; outside a provider
    process (or of a request) a debug record is dropped, not printed as an info line of no resource."""
    double, _ = engine
    dynamic_provider.Create(create_request(URN, DetailProvider()), timeout=60)
    sent = [(r.urn, r.message, r.severity) for r in double.logs]
    assert sent == [(URN, "gpu-07: the node fetches llmgw v1.4.2", engine_pb2.DEBUG),
                    (URN, "gpu-07: waiting up to 5s for ssh", engine_pb2.INFO)], sent
    _diagnostics.install()  # as in a provider process
    DetailProvider().create({})  # no request up the stack
    err = capsys.readouterr().err
    assert "info: gpu-07: waiting up to 5s for ssh" in err and "fetches" not in err, err


def test_a_record_for_the_stack_row_is_sent_under_the_stack_urn(engine, dynamic_provider):
    """The CLI prints a resource's row again, with its last message, when the resource is done; not the stack's."""
    double, _ = engine
    dynamic_provider.Create(create_request(URN, WaitingProvider()), timeout=60)
    sent = [(r.urn, r.message, r.severity, r.ephemeral) for r in double.logs]
    assert sent == [(STACK_URN, "gpu-07: waiting up to 5s for ssh", engine_pb2.INFO, True),
                    (URN, "gpu-07: a line of its own row", engine_pb2.INFO, True)], sent


def test_outside_a_request_no_urn_is_found_and_a_record_goes_to_stderr(capsys):
    assert _diagnostics.served_urn(sys._getframe()) is None
    request = provider_pb2.DeleteRequest(urn=URN)  # noqa: F841  (a request in this frame is what a handler holds)
    assert _diagnostics.served_urn(sys._getframe()) == URN
    empty = provider_pb2.ReadRequest()  # noqa: F841
    del request
    request = empty  # a request naming no resource is not taken for one
    assert _diagnostics.served_urn(sys._getframe()) is None
    not_a_request = types.SimpleNamespace(urn=URN)
    request = not_a_request  # noqa: F841  (only the engine's request types count)
    assert _diagnostics.served_urn(sys._getframe()) is None
    LoggingProvider().create({})  # no request anywhere up the stack: printed, unattributed
    assert "info: gpu-07 fetches llmgw v1.4.2" in capsys.readouterr().err


def test_a_config_error_leaves_a_provider_operation_as_a_run_error_with_one_frame() -> None:
    @base.operator_errors
    def create(props: dict[str, Any]) -> CreateResult:
        raise errors.ConfigError("gpu-07", "binary_path", "cannot read the local binary", "build it, or fix the path")

    with pytest.raises(errors.ConfigError) as err:
        create({})
    assert isinstance(err.value, pulumi.RunError)
    assert (err.value.node, err.value.field) == ("gpu-07", "binary_path")
    assert [f.name for f in traceback.extract_tb(err.value.__traceback__) if "/llmgw_pulumi/" in f.filename] == ["wrapper"]


STACK_URN = "urn:pulumi:prod::llmgw::pulumi:pulumi:Stack::llmgw-prod"


def test_a_failed_node_is_said_under_its_resource_without_frames_and_once_as_an_error_of_the_stack(
        engine, dynamic_provider):
    double, _ = engine
    with pytest.raises(grpc.RpcError) as failed:
        dynamic_provider.Create(create_request(URN, FailingProvider()), timeout=60)
    shown = failed.value.details()
    # What the CLI prints under the resource: the error's class and whole message, no frame of the SDK's or ours.
    assert "Traceback" not in shown and "File " not in shown, shown
    assert shown.startswith("llmgw_pulumi.errors.UnreachableError: gpu-07: cannot reach deploy@10.0.0.7"), shown
    assert "fix: check the address" in shown
    # And one line at the stack, which the CLI prints in the stack's own section of Diagnostics.
    sent = [(r.urn, r.message, r.severity) for r in double.logs]
    assert sent == [(STACK_URN, "gpu-07 failed: cannot reach deploy@10.0.0.7 over ssh after 5s (fix: check the address, "
                     "that sshd runs and that nothing filters the SSH port; raise llmgw:ssh.wait (ConnectionArgs.wait) "
                     "for slow boots)", engine_pb2.ERROR)], sent


def test_a_bug_keeps_the_packages_frames_and_is_no_node_failure(engine, dynamic_provider):
    double, _ = engine
    with pytest.raises(grpc.RpcError) as failed:
        dynamic_provider.Create(create_request(URN, FailingProvider(), bug=True), timeout=60)
    shown = failed.value.details()
    assert shown.startswith("KeyError: 'a key'"), shown
    assert "test_diagnostics.py" in shown and "in create" in shown, shown  # where the bug is
    assert "pulumi/dynamic/__main__.py" not in shown, shown  # not where the SDK called it
    assert double.logs == []


def test_the_stack_urn_of_a_resource_urn():
    assert _diagnostics.stack_urn(URN) == STACK_URN
    assert _diagnostics.stack_urn("urn:pulumi:a-b::proj::pulumi:pulumi:Stack::proj-a-b") == \
        "urn:pulumi:a-b::proj::pulumi:pulumi:Stack::proj-a-b"
    assert _diagnostics.stack_urn("not a urn") is None


def test_a_failed_nodes_line_is_the_first_line_of_its_reason_and_of_its_fix():
    exc = errors.RemoteCommandError("gpu-07", "installing the agent failed (exit 1):\nsecond line", "look\nat the log")
    assert exc.summary() == "gpu-07 failed: installing the agent failed (exit 1): (fix: look)"
    assert errors.failed_line("gpu-07", "\n  refused  \nmore") == "gpu-07 failed: refused"  # no fix: none said
    assert errors.failed_line("", "") == "? failed: no reason given"
    long = errors.failed_line("gpu-07", "x" * 1000, "y" * 1000)
    assert long == f"gpu-07 failed: {'x' * (errors.SUMMARY_WIDTH - 3)}... (fix: {'y' * (errors.SUMMARY_WIDTH - 3)}...)"
