"""``Node`` as a component of a Pulumi package, for programs in any Pulumi language (TypeScript, Go, ...).

This repository is a source-based plugin package (PulumiPlugin.yaml): a
consumer runs ``pulumi package add <this directory or its git URL>``, which
generates an SDK in the consumer's language, and the engine runs this module's
``Node`` through the Python language host (``llmgw_pulumi.stack.component_host``).

Its inputs are one node as the stack config gives it, under the stack
config's own keys: the node's settings (``id``, ``address``, ``hostKey``,
``fabrics``, ``engines``, its own ``agent``...) beside the stack-wide ones
(``pkiDir`` or ``signer``, ``servers``, ``agent``, ``ssh``, ``certificate``,
``rollout``...). Their types are made by llmgw_pulumi.stack.component_types from the
package's own declarations (the spec tables of llmgw_pulumi.config.specs and the
stack-config schema of llmgw_pulumi.config.stack_config), never from a second copy
(its names are importable from here too). This module reads the inputs, checking
them with ``stack_config.parse`` itself: a bad value gets the stack config's
list of every problem, each naming the node, the field and the fix, before
anything is registered. Then it builds the node (``Node``).

Only ``address``, ``hostKey`` and ``servers`` (a VM's outputs, the control
plane's addresses) and the secrets may be outputs of other resources that are
unknown until the node's resources run; ``agent`` and ``ssh`` may be outputs
too, read once known (``settled``: at `up` always; in a preview, refused by name
while not known yet); every other input is a plain value, so it is checked
before anything happens. Its outputs are plain values: hostname,
host key, certificate expiry, agent version, problems, inventory and readiness.

``depends_on`` and ``replace_with`` given to the component reach its four
resources, and each node runs in its shard's provider process
(llmgw_pulumi.stack.shards), as with the Python ``Node``.
"""

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.output import Unknown

from .. import child_env, decisions, errors, rollout
from ..config import specs, stack_config
from ..config.signer import KIND_CA_KEY
from ..config.specs import Rollout
from ..errors import LlmgwError
from . import program
from .component_types import OUTPUT_CAPABLE, RENAMED, SETTLED, Inventory, input_type, inventory_output
from .component_types import SECRETS as SECRETS  # the names of the component's types, importable from here too
from .component_types import declared_settings as declared_settings
from .component_types import schema_descriptions as schema_descriptions
from .node import NodeArgs, node_readiness, onboard
from .shards import provider_for

PACKAGE_NAME = decisions.PACKAGE
"""The package's name in Pulumi: the type token (``llmgw:index:Node``) and the SDK's directory (``sdks/llmgw``)."""
NODEJS_PACKAGE = "llmgw-pulumi"
"""The generated TypeScript SDK's npm name (``import * as llmgw from "llmgw-pulumi"``): this project's own, as on
PyPI, never Pulumi's ``@pulumi`` scope."""
GO_IMPORT_PATH = "llmgw-pulumi.invalid/sdk/go/llmgw"
"""The generated Go SDK's import path. Not fetchable on purpose (``.invalid``): ``pulumi package add`` writes the
SDK into the project and a ``replace`` directive pointing at it, so no module proxy is ever asked for it."""

VIRTUALENV_ENV = "PULUMI_RUNTIME_VIRTUALENV"
"""Where the dynamic-provider plugin looks for its Python (a virtualenv), as the engine gives it the environment."""


# --------------------------------------------------------------------------- reading the inputs


@dataclass(frozen=True)
class Parsed:
    """A component's inputs checked as stack config: the node, the stack-wide settings, the outputs kept aside."""

    spec: stack_config.StackSpec
    node: stack_config.NodeConfig
    raw: dict[str, Any]
    outputs: dict[str, pulumi.Output[Any]]
    """The inputs that are other resources' outputs (``OUTPUT_CAPABLE``), to be given to the resources as such."""
    secrets: dict[str, pulumi.Output[str]]


UNKNOWN: Any = Unknown()  # type: ignore[no-untyped-call]
"""What a value not known yet is to the checks (llmgw_pulumi.config.specs.is_unknown)."""


def _known(value: Any) -> Any:
    """``value`` with every output replaced by Unknown: what the stack config's checks skip (checked when known);
    a whole number as YAML gives it (the engine sends every number as a float: 22.0 is the port 22)."""
    if isinstance(value, pulumi.Output):
        return UNKNOWN
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _known(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_known(v) for v in value]
    return value


def settled(value: Any) -> Any:
    """``value`` with each output whose value is already there replaced by that value (nested too); an output not
    known yet stays. The engine hands a construct call an input that depends on other resources as an output that
    is already resolved (pulumi.provider.server: its data set before the component is made), so a SETTLED input
    (``agent``, ``ssh``) computed by the program from known values is read here, before anything is registered."""
    if isinstance(value, pulumi.Output):
        data = getattr(value, "_data", None)  # the SDK's resolved data (pulumi.output.Output._from_data)
        if not isinstance(data, asyncio.Future) or not data.done() or data.exception() is not None:
            return value
        resolved = data.result()
        if not resolved.is_known or specs.is_unknown(resolved.value):
            return value
        return settled(resolved.value)
    if isinstance(value, Mapping):
        return {k: settled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [settled(v) for v in value]
    return value


def parse(name: str, inputs: Mapping[str, Any]) -> Parsed:
    """The component's inputs (stack-config keys) checked by ``stack_config.parse`` as a one-node stack.

    Raises InputPropertiesError listing every problem (node, field, fix), before anything is registered.
    """
    node_keys = set(stack_config.NODE_SCHEMA) - {"agent", "servers", "failOnEngineProblems"}
    spelled = {v: k for k, v in RENAMED.items()}
    given = {spelled.get(k, k): v for k, v in inputs.items() if v is not None}
    given.update({k: settled(given[k]) for k in SETTLED if k in given})
    secrets = {k: v if isinstance(v, pulumi.Output) else pulumi.Output.secret(v)
               for k, v in given.items() if k in SECRETS}
    # An input holding an output anywhere (a list of servers, one of them another resource's) is one Output.
    outputs = {k: v if isinstance(v, pulumi.Output) else pulumi.Output.from_input(v) for k, v in given.items()
               if k in OUTPUT_CAPABLE and specs.is_unknown(_known(v))}
    problems: list[tuple[str, str, str, str]] = []
    for key, value in given.items():
        if key in SETTLED and specs.is_unknown(_known(value)):
            problems.append((f"node {name}", key, "is an output not known yet in this preview (of a resource this "
                             "deployment creates): the release is approved and the SSH key found before the node is "
                             "registered", f"compute {key} from values known before the deployment (config, another "
                             "stack's outputs, a resource that exists), or run `pulumi up` without a preview "
                             "(`--skip-preview`): at `up` it is known"))
        elif key not in (*OUTPUT_CAPABLE, *SETTLED, *SECRETS) and specs.is_unknown(_known(value)):
            problems.append((f"node {name}", key, "is another resource's output, which cannot be checked before the "
                             "node is registered", f"give {key} as a plain value; only {', '.join(OUTPUT_CAPABLE[:-1])} "
                             f"and {OUTPUT_CAPABLE[-1]} may be outputs (a VM's address and host key, the control "
                             "plane's servers)"))
    top = {k: _known(v) for k, v in given.items() if k not in node_keys and k not in SECRETS}
    node = {k: _known(v) for k, v in given.items() if k in node_keys}
    try:
        spec = stack_config.parse({**top, "nodes": [node]}, has_secret_key=stack_config.SECRET_KEY in secrets,
                                  secret_keys=(), has_agent=bool(os.environ.get("SSH_AUTH_SOCK")),
                                  has_ca_key=stack_config.CA_KEY in secrets)
    except stack_config.StackConfigError as exc:
        problems += [(f"node {name}", _input_name(field), problem, fix) for _, field, problem, fix in exc.problems]
    if problems:
        # The list, as the stack config prints it; an empty list of property errors (None fails in the SDK).
        raise InputPropertiesError(errors.problems_text(problems, f"llmgw Node {name}"), [])
    return Parsed(spec, spec.nodes[0], given, outputs, secrets)


def _input_name(field: str) -> str:
    """A stack-config field name as the component's input is called."""
    head, sep, rest = field.partition(".")
    return RENAMED.get(head, head) + sep + rest


def package_virtualenv() -> str:
    """The virtualenv scripts/install.sh made beside this package (README, "From TypeScript or Go"), when this
    package is a checkout that has one; else the one this process runs in (the plugin's, .venv-plugin)."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # llmgw_pulumi/stack/
    made = os.path.join(checkout, ".venv")
    return made if os.path.exists(os.path.join(made, "bin", "python")) else sys.prefix


def python_problem(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the dynamic-provider plugin, started by the engine from the consumer's project, would find no Python
    with this package; None when it will. It runs the virtualenv ``VIRTUALENV_ENV`` names, else
    ``PULUMI_PYTHON_CMD`` or ``python3`` (pulumi-resource-pulumi-python)."""
    env = os.environ if environ is None else environ
    venv = env.get(VIRTUALENV_ENV, "")
    python = os.path.join(venv, "bin", "python") if venv else env.get("PULUMI_PYTHON_CMD") or "python3"
    if venv and not os.path.isabs(venv):
        return None  # relative to the consumer's project, which this process does not know: the plugin says
    try:
        found = subprocess.run([python, "-c", "import llmgw_pulumi, pulumi.dynamic"], capture_output=True,
                               timeout=60, check=False, env=child_env.for_child()).returncode == 0
    except OSError:
        found = False
    if found:
        return None
    where = f"{VIRTUALENV_ENV}={venv}" if venv else f"{python} (no {VIRTUALENV_ENV} is set)"
    return (f"llmgw Node {name}: the dynamic-provider plugin would run {where}, which does not have llmgw-pulumi\n"
            f"  fix: export {VIRTUALENV_ENV}={package_virtualenv()} (this package's virtualenv) before `pulumi up`, "
            "or see the README, \"From TypeScript or Go\"")


# --------------------------------------------------------------------------- the component


_started_runs: set[tuple[Any, ...]] = set()


def _rollout(spec: stack_config.StackSpec) -> Rollout | None:
    """llmgw:rollout with its coordination directory, the run started once per deployment (not once per node)."""
    if spec.rollout is None:
        return None
    key = (pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack())
    directory = rollout.stack_dir(os.getcwd(), *key)
    if not pulumi.runtime.is_dry_run() and (*key, os.getppid()) not in _started_runs:
        _started_runs.add((*key, os.getppid()))
        rollout.start_run(directory, spec.rollout.canaries)
    return dataclasses.replace(spec.rollout, directory=str(directory))


def node_args(parsed: Parsed) -> NodeArgs:
    """The Python ``NodeArgs`` of a parsed component, as the stack program builds them (program.node_args)."""
    spec, n = parsed.spec, parsed.node
    secrets = {k: v for k, v in parsed.secrets.items()}
    registration = program.Registration(
        spec, {n.node_id: program.agent_inputs(n.agent or spec.agent)}, program.ssh_credentials(spec, secrets),
        os.path.abspath(os.path.expanduser(spec.pki_dir)) if spec.pki_dir else None, _rollout(spec),
        program.signer_inputs(spec.signer),
        secrets.get(stack_config.CA_KEY) if spec.signer is not None and spec.signer.kind == KIND_CA_KEY else None,
        secrets.get(stack_config.CA_PASSPHRASE_KEY))
    args = program.node_args(registration, n)
    replaced = {"host": parsed.outputs.get("address"), "host_key": parsed.outputs.get("hostKey")}
    # The spec types are typed for known values; in Args any of them may be a pulumi Output (as in node.Node).
    connection = dataclasses.replace(args.connection, **{k: v for k, v in replaced.items() if v is not None})  # type: ignore[arg-type]
    settings = args.settings
    if "servers" in parsed.outputs and settings is not None:
        settings = dataclasses.replace(settings, servers=parsed.outputs["servers"])  # type: ignore[arg-type]
    return dataclasses.replace(args, connection=connection, settings=settings)


class Prepared(dict[str, Any]):
    """A component's inputs as given, with what ``prepare`` made of them: the node's Python NodeArgs."""

    def __init__(self, inputs: Mapping[str, Any], parsed: Parsed, args: NodeArgs) -> None:
        super().__init__(inputs)
        self.parsed, self.args = parsed, args


def prepare(name: str, inputs: Mapping[str, Any]) -> Prepared:
    """The inputs checked as stack config and made the node's NodeArgs (the release approved, the key found).

    Every problem is raised as InputPropertiesError, the list the operator reads, before anything is registered.
    """
    parsed = parse(name, inputs)
    try:
        return Prepared(inputs, parsed, node_args(parsed))
    except LlmgwError as exc:  # a release that is not the operator's, an unreadable key...
        raise InputPropertiesError(f"llmgw Node {name}: {exc}", []) from None


class Node(pulumi.ComponentResource):
    """One GPU node onboarded into an llmgw cluster: ClientCertificate -> NodeIdentity -> AgentInstall ->
    EngineCheck. Its inputs are the node's settings as the stack config gives them (README, "Running it against
    real machines"); pass the VM it runs on as dependsOn and replaceWith, so re-imaging the VM re-onboards it."""

    hostname: pulumi.Output[str]
    """The node's hostname, as read on it."""
    host_key: pulumi.Output[str]
    """The SSH host key trusted for the node ('TYPE BASE64')."""
    certificate_not_after: pulumi.Output[str]
    """When the node's client certificate expires (ISO 8601, UTC)."""
    agent_version: pulumi.Output[str]
    """The llmgw agent version installed on the node."""
    problems: pulumi.Output[list[dict[str, str]]]
    """Engine and hardware problems found on the node, each with its problem and hint (and engine or HCA)."""
    inventory: pulumi.Output[Inventory]
    """What the node has: its GPUs, driver and CUDA version, and InfiniBand HCAs."""
    readiness: pulumi.Output[str]
    """ready, degraded (warnings only) or not ready (a critical problem), as of the node's last probe."""

    def __init__(self, name: str, args: Mapping[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        prepared = args if isinstance(args, Prepared) else prepare(name, args)
        parsed = prepared.parsed
        opts = opts or pulumi.ResourceOptions()
        if not opts.providers:  # the node's shard, shared by every node of the deployment in it
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                providers={"pulumi-python": provider_for(parsed.node.node_id, run=_deployment())}))
        super().__init__(decisions.NODE_TYPE, name, None, opts)
        parts = onboard(self, name, prepared.args, opts)
        check = parts.engine_check
        self.hostname = parts.identity.hostname
        self.host_key = parts.identity.host_key
        self.certificate_not_after = parts.certificate.not_after
        self.agent_version = parts.agent.version
        self.problems = check.problems.apply(lambda p: [{k: str(v) for k, v in i.items() if v is not None}
                                                        for i in p or []])
        self.inventory = check.inventory.apply(inventory_output)
        self.readiness = node_readiness(check)
        self.register_outputs({"hostname": self.hostname, "hostKey": self.host_key,
                               "certificateNotAfter": self.certificate_not_after, "agentVersion": self.agent_version,
                               "problems": self.problems, "inventory": self.inventory, "readiness": self.readiness})


def _deployment() -> tuple[Any, ...]:
    """What one deployment's constructs share (each construct call has an engine connection of its own)."""
    return (pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack(), pulumi.runtime.is_dry_run())


Node.__init__.__annotations__["args"] = input_type()
