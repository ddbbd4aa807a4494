"""Pure tests: no network, no root."""

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pulumi
import pytest

# The helper modules' asserts show the values they compared, as the test modules' do.
pytest.register_assert_rewrite(*(f"{__name__}.{p.stem}" for p in Path(__file__).parent.glob("*.py")
                                 if not p.stem.startswith(("test_", "_")) and p.stem != "conftest"))


def fake_pem(kind: str, body: str) -> str:
    """A PEM-shaped string with no key in it (so no key-shaped text is committed)."""
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"


AGENT_YAML_COMMENTS = ("# {}, written by llmgw-pulumi. Only overrides are written here:\n"
                     "# the agent finds everything else out for itself. `pulumi up` rewrites this file.\n")
"""agent.yaml's two comment lines, for a node id (``.format(node_id)``), as the file on a node begins: written
here, not taken from the package. AgentInstall's input leaves them out; the file and its digest hold them."""


RELEASE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOye5XaKTaeYA/zgWk9ecXIR32Hr3T4v0AfbdBmZ70Cl release@example.net"
"""A release signing key's public line, for configs that must verify their release (no private key is behind
it in the tests that only read configs)."""


def with_value(config: Any, path: Sequence[Any], value: Any) -> Any:
    """A deep copy of ``config`` with the value at ``path`` (keys and list indexes) set to ``value``."""
    copied = copy.deepcopy(config)
    target = copied
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return copied


class Mocks(pulumi.runtime.Mocks):
    """The SDK's mock engine: each resource gets an id from its name and returns its inputs as its outputs."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        return {}, []
