"""NodeIdentity: the node's certificate, key and CA root in /etc/llmgw, and the root as a trust anchor.

SPEC steps 1, 3 and 4. It is also where the node is first reached: the host key
seen on first use is recorded as the ``host_key`` output, and the node's
hostname and architecture are recorded for AgentInstall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from .. import desired, facts, remote
from ..specs import Connection, IdentitySpec, to_inputs
from . import _glue

INPUT_KEYS = ("node_id", "connection", "ca_pem", "cert_pem", "key_pem")
REPLACE_KEYS = ("node_id", "connection.host", "connection.port")
OUTPUT_KEYS = ("host_key", "jump_host_keys", "hostname", "arch", "files", "trust")


def desired_hashes(props: dict[str, Any]) -> dict[str, str] | None:
    """path -> sha256 the node should hold, or None while a PEM is unknown (preview)."""
    pems = [props.get(k) for k in ("ca_pem", "cert_pem", "key_pem")]
    if not all(isinstance(p, str) for p in pems):
        return None
    return {f.path: f.sha256 for f in desired.identity_files(*pems)}  # type: ignore[arg-type]


def files_state(node: facts.NodeFacts) -> dict[str, str]:
    """The ``files`` output: path -> the file as seen (its sha256, or what differs from the desired state)."""
    return {f.path: node.state(f) for f in desired.files_of(desired.IDENTITY)}


def recorded_keys(props: dict[str, Any]) -> tuple[str | None, Any]:
    """The host keys this resource recorded (its outputs ``host_key`` and ``jump_host_keys``), for the next session."""
    return props.get("host_key"), props.get("jump_host_keys")


def _apply(spec: IdentitySpec, recorded: dict[str, Any], restart_agent: bool) -> dict[str, Any]:
    files = desired.identity_files(spec.ca_pem, spec.cert_pem, spec.key_pem)
    with _glue.session(spec.connection, spec.node_id, *recorded_keys(recorded)) as s:
        res = s.run(remote.install_identity(files, restart_agent))
        _glue.raise_for(res, spec.node_id, f"installing the identity on {spec.connection.host}")
        node = facts.parse_survey(res.stdout)
        return {
            "host_key": s.host_key,
            "jump_host_keys": s.jump_host_keys,  # {} without jump hosts: a known value in every preview
            "hostname": node.hostname,
            "arch": node.arch,
            "files": files_state(node),
            "trust": facts.key_values(res.stdout).get("trust", ""),
        }


def changes(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """Changed inputs, and drift found by refresh: the node's files differ from what they should hold."""
    found = _glue.changed_keys(olds, news, INPUT_KEYS)
    want = desired_hashes(news)
    if want is not None and not {"ca_pem", "cert_pem", "key_pem"} & set(found) and olds.get("files") != want:
        found.append("files")
    return found


class NodeIdentityProvider(ResourceProvider):
    # Pickled by reference (module + class name): the payload holds nothing secret.
    serialize_as_secret_always = False

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return _glue.check(news, IdentitySpec.collect)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A replacement is created before the old one is deleted; the delete
        # leaves the node alone once it carries the replacement's certificate.
        return _glue.diff_result(changes(olds, news), REPLACE_KEYS)

    @_glue.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = IdentitySpec.from_props(props)
        computed = _apply(spec, {}, restart_agent=False)
        return CreateResult(spec.node_id, _glue.outputs(props, **computed))

    @_glue.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if _glue.operator_side_only(changes(olds, news)):
            return UpdateResult(_glue.carried(olds, news, OUTPUT_KEYS))
        spec = IdentitySpec.from_props(news)
        renewed = olds.get("cert_pem") != news.get("cert_pem") or olds.get("key_pem") != news.get("key_pem")
        computed = _apply(spec, olds, restart_agent=renewed or olds.get("files") != desired_hashes(news))
        return UpdateResult(_glue.outputs(news, **computed))

    @_glue.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        spec = IdentitySpec.from_props(props)
        seen = _glue.survey_for_read(spec.connection, spec.node_id, recorded_keys(props),
                                     desired.files_of(desired.IDENTITY))
        if seen is None:
            return ReadResult(id_, props)  # an outage never rewrites the record
        node = seen.node
        jump_host_keys = {**(props.get("jump_host_keys") or {}), **seen.jump_host_keys}
        files = files_state(node)
        outs = _glue.outputs({**props, "files": files, "hostname": node.hostname, "arch": node.arch},
                             jump_host_keys=jump_host_keys)
        want = desired_hashes(props) or {}
        drift = {path: state for path, state in files.items() if state != want.get(path)}
        return _glue.read_result(id_, props, OUTPUT_KEYS, outs, {"drift": drift or None})

    @_glue.operator_errors
    def delete(self, _id: str, props: dict[str, Any]) -> None:
        spec = IdentitySpec.from_props(props)
        # What this resource installed: a refresh may since have recorded another identity's files.
        owned = desired_hashes(props) or {}
        _glue.remove_from_node(spec.connection, spec.node_id, recorded_keys(props),
                               remote.remove_identity(owned), "the identity")


@dataclass
class NodeIdentityArgs:
    node_id: pulumi.Input[str]
    connection: Connection
    ca_pem: pulumi.Input[str]
    cert_pem: pulumi.Input[str]
    key_pem: pulumi.Input[str]


class NodeIdentity(Resource, module="llmgw", name="NodeIdentity"):
    host_key: pulumi.Output[str]
    jump_host_keys: pulumi.Output[dict[str, str]]
    """The key each jump host presented, by 'host:port': checked on every later connection."""
    hostname: pulumi.Output[str]
    arch: pulumi.Output[str]
    files: pulumi.Output[dict[str, Any]]
    trust: pulumi.Output[str]

    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = {**to_inputs(args), **{k: None for k in OUTPUT_KEYS}}
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["key_pem"]))
        super().__init__(NodeIdentityProvider(), name, _glue.with_urn(type(self), name, props, opts), opts)
