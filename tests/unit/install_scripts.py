"""AgentInstall's script as the providers build it for a node, without running it."""

from __future__ import annotations

import hashlib

from llmgw_pulumi.nodestate import commands, desired, plan
from llmgw_pulumi.nodestate.observed import Observed, Want, Wanted


def agent_install(source=plan.Do.FETCH, config="c", unit="u", binary=b"", **kwargs):
    """AgentInstall's script for a node never read: the binary from ``source``, config and unit written."""
    wanted = Wanted({f.path: Want(f.sha256, f.mode, f.owner) for f in desired.agent_files(config, unit)}, "active enabled")
    sha = hashlib.sha256(binary).hexdigest()
    change = plan.agent_plan("gpu-01", wanted, Observed({}), "amd64", plan.BinaryWanted(source, {"amd64": sha, "": sha}))
    pushed = commands.StdinFile("/the/binary", len(binary)) if source in (plan.Do.COPY, plan.Do.PUSH) else None
    return commands.install_agent(change, config, unit, binary=pushed, **kwargs)
