"""Which dynamic-provider process runs a node's resources.

Each explicit provider resource of the `pulumi-python` package is a
`pulumi-resource-pulumi-python` process of its own, started (a Python with
the SDK imported) in every preview and `up`. One process answers every call
the engine sends at once (llmgw_pulumi/providers/_server.py: the SDK's server
would answer 4), so by default every node's resources run in one of them:
``PROVIDER_SHARDS`` is 1. (It was 8, each process answering 4 calls: a
stack onboarded then has its nodes moved to shard 0 and the other shards'
provider resources dropped by its next `up`, state only, see below.)

- a node's shard comes from a hash of its node id, so it never moves when
  nodes are added or removed (a resource whose provider changes would be
  replaced);
- all four of a node's resources share its process, hence one pooled SSH
  connection;
- the provider resources are named ``llmgw-shard-<k>`` and have no parent,
  so their URNs are the same in every program (and in stacks made before
  `Node` did this itself); only the shards in use are created, each once
  per program run.

To choose yourself, pass ``providers={"pulumi-python": ...}`` in the Node's
options: it is used as given. ``provider_for(node_id)`` is the provider a
node gets by default, e.g. for your own dynamic resources next to a node.

The environment variable ``LLMGW_PROVIDER_SHARDS`` (``SHARDS_ENV``) overrides
the number of shards for a program run (several processes, e.g. to spread
the providers' Python over several CPUs; the benchmark compares counts).
Changing it, or ``PROVIDER_SHARDS``, moves nodes to another shard, and that
changes nothing on them: the engine replaces a resource whose provider
changed only when the new provider's DiffConfig asks for it, and a
``pulumi-python`` provider resource has no config, so the moved resources
are diffed as before and stay the same; only the provider resources come
and go (state only). No alias is needed: the `pulumi up` after the change
shows a shard created or deleted and nothing else, opens no SSH connection,
and the preview after it is empty (tests/e2e/test_provider_processes.py, on
real hosts; tests/e2e/test_upgrade.py from stacks of 8 shards).
"""

from __future__ import annotations

import hashlib
import os

import pulumi

from ..errors import ConfigError
from .per_run import PerRun

__all__ = ["PACKAGE", "PROVIDER_SHARDS", "SHARDS_ENV", "provider_for", "shard_count", "shard_name", "shard_of"]

PACKAGE = "pulumi-python"
"""The package of Python dynamic resources: what ``providers`` maps to a shard."""

PROVIDER_SHARDS = 1
"""How many provider processes a program spreads its nodes over (at most): one serves every call at once."""

SHARDS_ENV = "LLMGW_PROVIDER_SHARDS"
"""Overrides PROVIDER_SHARDS for a program run when set (a positive whole number)."""

_providers: PerRun[pulumi.ProviderResource] = PerRun()
"""The provider resource of each shard in use, by shard, in this program run."""


def shard_of(node_id: str, shards: int = PROVIDER_SHARDS) -> int:
    """The shard of a node id: stable across runs, machines and Python versions."""
    return int(hashlib.sha256(node_id.encode()).hexdigest(), 16) % shards


def shard_count() -> int:
    """PROVIDER_SHARDS, or the positive whole number SHARDS_ENV gives instead."""
    raw = os.environ.get(SHARDS_ENV, "").strip()
    if not raw:
        return PROVIDER_SHARDS
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError("", SHARDS_ENV, f"{raw!r} is not a positive whole number",
                          f"set the environment variable to a count of provider processes, e.g. {PROVIDER_SHARDS}, "
                          "or unset it")
    return int(raw)


def shard_name(k: int) -> str:
    return f"llmgw-shard-{k}"


def provider_for(node_id: str, run: object = None) -> pulumi.ProviderResource:
    """The provider resource (process) of this node id's shard, created on first use in this program run.

    ``run``: what identifies the run, when it is not the engine connection (a component
    provider, llmgw_pulumi.stack.component, has one per construct call, for one deployment)."""
    k = shard_of(node_id, shard_count())
    provider, _ = _providers.once(k, lambda: pulumi.ProviderResource(PACKAGE, shard_name(k)), run)
    return provider
