"""EngineCheck: every configured inference engine exists, is executable and really runs (SPEC step 7).

This is the failure a GPU node is most likely to have and the hardest to see:
the agent registers healthy while every shard placed on it dies. Problems are
outputs (``problems``, one dict per engine with its fix hint) which the node
component turns into warnings attached to this resource; with
``fail_on_problems`` they fail the deployment instead. The node stays
onboarded either way.

A `pulumi up` with unchanged inputs does not probe again (no SSH), and an
engine that stays broken is a standing warning, not a change: `pulumi
preview --expect-no-changes` passes while nothing changed. `pulumi refresh`
probes again and records what it finds.

The same run reads the node's inventory (output ``inventory``): its GPUs from
nvidia-smi (at ``discovery.nvidia_smi``, or on PATH) with the driver and CUDA
versions, and its InfiniBand HCAs (under ``discovery.ib_root``). A node
without nvidia-smi has no GPUs, which is no problem; nvidia-smi that fails,
one configured where there is none, and a fabric HCA declared but missing
are problems like an engine's, and warnings the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from .. import decisions
from ..config.schema import defaults, replace_keys
from ..config.specs import Connection, Discovery, EngineCheckSpec, Fabric, Hardware, engines_input
from ..errors import EngineWillNotRunError, NodeNotReadyError, UnreachableError
from ..health import readiness
from ..nodestate import commands, facts
from . import base

INPUT_KEYS = ("node_id", "connection", "known_host_key", "known_jump_host_keys", "engines", "fail_on_problems",
              "fabrics", "discovery", "hardware", "fail_on_critical_problems")
REPLACE_KEYS = replace_keys(Connection, "connection.")
"""Another address or port is another machine (a new node id is only another name for the check)."""


def _probe(spec: EngineCheckSpec, known: tuple[str | None, Any]) -> dict[str, Any]:
    """Probe the engines and read the inventory, in one run of probe-engines.sh on the node's pooled session."""
    with base.session(spec.connection, spec.node_id, *known) as s:
        res = s.run(commands.probe_engines(spec.engines, spec.nvidia_smi, spec.ib_root),
                    timeout=commands.ENGINE_PROBE_TIMEOUT * 4 + 30)
    base.raise_for(res, spec.node_id, f"probing the engines on {spec.connection.host}")
    target = spec.connection.target
    text = readiness.other_lines(res.stdout)  # the health's lines are read by readiness.from_probe
    probes = facts.parse_engine_probes(text, spec.engines)
    problems = [p for p in (facts.engine_problem(pr, spec.node_id, target) for pr in probes) if p]
    inventory = facts.parse_inventory(text)
    problems += facts.inventory_problems(inventory, [(f.name, f.hcas) for f in spec.fabrics], spec.ib_root,
                                         spec.node_id, target)
    if problems and spec.fail_on_problems:
        raise EngineWillNotRunError(
            spec.node_id, "; ".join(f"{p['problem']} (hint: {p['hint']})" for p in problems))
    found = readiness.from_probe(spec.node_id, spec.expectations, res.stdout, inventory.smi_status, inventory.hcas,
                                 target)
    problems += [p.as_dict() for p in found]
    critical = [p for p in problems if readiness.severity_of(p) == readiness.CRITICAL]
    if critical and spec.fail_on_critical_problems:
        raise NodeNotReadyError(spec.node_id, "not ready: " + "; ".join(
            f"{p['problem']} (fix: {p['hint']})" for p in critical))
    return {"problems": problems, "engines_ok": not any("engine" in p for p in problems),
            "inventory": inventory.as_output(), "readiness": readiness.readiness_of(problems)}


class EngineCheckProvider(base.ModuleProvider):

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return base.check(news, EngineCheckSpec.collect, defaults=defaults(EngineCheckSpec, ("fail_on_problems",)),
                           olds=olds, machine_facts=("known_host_key", "known_jump_host_keys"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # An engine that stays broken is not a change: its problems are outputs, which the
        # Node component shows as warnings in every preview and `up`; refresh probes again.
        return base.diff_result(base.changed_keys(olds, news, INPUT_KEYS), REPLACE_KEYS)

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = EngineCheckSpec.from_props(props)
        return CreateResult(spec.node_id, base.outputs(props, **_probe(spec, base.known_keys(props))))

    @base.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if decisions.operator_side_only(base.changed_keys(olds, news, INPUT_KEYS)):
            return UpdateResult(base.carried(olds, news, OUTPUT_KEYS))
        spec = EngineCheckSpec.from_props(news)
        return UpdateResult(base.outputs(news, **_probe(spec, base.known_keys(news, olds))))

    @base.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        spec = EngineCheckSpec.from_props({**props, "fail_on_problems": False, "fail_on_critical_problems": False})
        spec = dataclasses.replace(spec, connection=base.for_read(spec.connection))
        try:
            probed = base.read_once_more(lambda: _probe(spec, base.known_keys(props)), spec.node_id)
            return ReadResult(id_, {**props, **probed})
        except UnreachableError as exc:
            return base.unreachable_on_read(id_, props, exc)

    @base.operator_errors
    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # a check leaves nothing behind


PROVIDER = EngineCheckProvider()
"""The one instance every resource is registered with (``base.ModuleProvider``)."""


@dataclass
class EngineCheckArgs(base.OnboardedNodeArgs):
    engines: pulumi.Input[Mapping[str, str]] | None = field(default=None, metadata={"to_input": engines_input})
    """engine -> its executable on the node, as AgentSettings.engines: {"llamacpp": "/opt/llama/bin/llama-server"}."""
    fail_on_problems: pulumi.Input[bool] | None = None
    fabrics: pulumi.Input[Sequence[Fabric]] | None = None
    """The fabrics the node is declared on, as AgentSettings.fabrics: each HCA must exist on the node."""
    discovery: pulumi.Input[Discovery] | None = None
    """Where nvidia-smi and the InfiniBand sysfs directory are, as AgentSettings.discovery."""
    hardware: pulumi.Input[Hardware] | None = None
    """What the node was declared to have, for the readiness verdict (NodeArgs.hardware)."""
    fail_on_critical_problems: pulumi.Input[bool] | None = None
    """Fail when the node is not ready (a critical problem), instead of warning (NodeArgs.fail_on_critical_problems)."""


class EngineCheck(base.NodeResource, module=decisions.PACKAGE, name=decisions.ENGINES):
    PROVIDER = EngineCheckProvider

    problems: pulumi.Output[list[Any]]
    """Engine problems and hardware problems (nvidia-smi that fails, a declared HCA that is missing):
    each a dict with ``problem`` and ``hint``."""
    engines_ok: pulumi.Output[bool]
    inventory: pulumi.Output[dict[str, Any]]
    """{gpus: [{index, name, memory_mib, uuid, pci_bus_id, compute_cap}], driver, cuda, hcas: [...]}."""
    readiness: pulumi.Output[str]
    """ready, degraded (warnings only) or not ready (a critical problem), as of the last probe: the readiness
    verdict (llmgw_pulumi.health.readiness) on ``problems``."""

    def __init__(self, name: str, args: EngineCheckArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(*self.registration(name, args, opts))


OUTPUT_KEYS = EngineCheck.output_keys()
