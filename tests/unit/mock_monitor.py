"""The Pulumi SDK's mock monitor, recording every resource registered as the engine would get it, and the
arguments of a Node to register under it (tests/unit/conftest.py's ``monitor`` fixture installs it)."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor

from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, NodeArgs
from tests.unit import RELEASE_KEY, Mocks

NODE_TYPES = {"pulumi-python:dynamic/llmgw:" + t for t in ("ClientCertificate", "NodeIdentity", "AgentInstall", "EngineCheck")}
PROVIDER_TYPE = "pulumi:providers:pulumi-python"


class RecordingMonitor(MockMonitor):
    def __init__(self) -> None:
        super().__init__(Mocks())
        self.requests: list[Any] = []

    def RegisterResource(self, request: Any) -> Any:
        self.requests.append(request)
        return super().RegisterResource(request)

    def of_type(self, types: set[str] | str) -> list[Any]:
        types = {types} if isinstance(types, str) else types
        return [r for r in self.requests if r.type in types]


def node_args(node_id: Any, host: Any = "10.0.0.11") -> NodeArgs:
    return NodeArgs(node_id=node_id, connection=ConnectionArgs(host=host, private_key_path="/k"),
                    settings=AgentSettings(servers=["cp:7443"]), pki_dir="/pki",
                    binary=BinarySource(version="v1.4.2", release_url="https://r", signing_key=RELEASE_KEY))


def settle(*outputs: pulumi.Output[Any]) -> pulumi.Output[Any]:
    return pulumi.Output.all(*outputs)
