"""A good configuration of a small fleet in each form a program is given one: the stack config as read
(``GOOD``, and copies of it with one value changed), the stack's Pulumi config (``STACK``), and a node's
arguments to the component (``good_node_args``)."""

from __future__ import annotations

import copy
import json
from typing import Any

from llmgw_pulumi import AgentSettings, BinarySource, ConnectionArgs, NodeArgs
from tests.unit import RELEASE_KEY

GOOD = {
    "pkiDir": "/srv/llmgw/pki",
    "servers": ["cp1.example.net:7443"],
    "agent": {"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"},
    "ssh": {"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519", "wait": 120},
    "nodes": [
        {"id": "gpu-01", "address": "10.0.0.11"},
        {"id": "gpu-02", "address": "10.0.0.12", "fabric": {"name": "ib-east", "hcas": ["mlx5_0"]},
         "engines": {"llamacpp": {"bin": "/opt/llama/bin/llama-server"}}},
    ],
}
DELETE = object()
"""The value ``mutate`` takes to mean: leave this setting out."""


def mutate(path, value):
    """A copy of ``GOOD`` with the value at ``path`` (keys and list indexes) set to ``value``, or left out."""
    cfg = copy.deepcopy(GOOD)
    target = cfg
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return cfg


STACK = {
    "llmgw:pkiDir": "/srv/llmgw/pki",
    "llmgw:servers": json.dumps(["cp1.example.net:7443"]),
    "llmgw:agent": json.dumps({"version": "v1.4.2", "signingKey": RELEASE_KEY, "releaseUrl": "https://releases.example.net/llmgw"}),
    "llmgw:ssh": json.dumps({"user": "deploy", "privateKeyPath": "/home/op/.ssh/id_ed25519"}),
    "llmgw:nodes": json.dumps([{"id": "gpu-01", "address": "10.0.0.11"}]),
    "aws:region": "eu-west-1",  # another namespace: not ours to judge
}


def good_node_args(**changes: Any) -> NodeArgs:
    """A good node's arguments to the Node component, with ``changes``."""
    given: dict[str, Any] = {
        "node_id": "gpu-01", "connection": ConnectionArgs(host="10.0.0.11"), "pki_dir": "/srv/llmgw/pki",
        "settings": AgentSettings(servers=["cp1.example.net:7443"]),
        "binary": BinarySource(version="v1.4.2", release_url="https://releases.example.net/llmgw", signing_key=RELEASE_KEY)}
    return NodeArgs(**{**given, **changes})
