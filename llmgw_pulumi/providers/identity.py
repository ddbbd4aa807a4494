"""NodeIdentity: the node's certificate, key and CA root in /etc/llmgw, and the root as a trust anchor.

SPEC steps 1, 3 and 4. It is also where the node is first reached: the host key
seen on first use is recorded as the ``host_key`` output, and the node's
hostname and architecture are recorded for AgentInstall.

With ``keyOrigin: operator`` the node's private key travels in the install
script's stdin. It is only ever sent to a machine whose host key is pinned
(``hostKey``) or already recorded: never on a first contact trusted on first
use, where it would go to whichever machine answered (``operator_key_unguarded``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from .. import desired, errors, facts, remote
from ..schema import defaults
from ..specs import (
    KEY_ORIGIN_NODE,
    KEY_ORIGIN_OPERATOR,
    NODE_REPLACE_KEYS,
    CertificateSpec,
    Connection,
    IdentitySpec,
    Problems,
    is_unknown,
    to_inputs,
)
from . import _glue

INPUT_KEYS = ("node_id", "connection", "ca_pem", "cert_pem", "key_pem", "key_origin")
REPLACE_KEYS = NODE_REPLACE_KEYS
OUTPUT_KEYS = ("host_key", "jump_host_keys", "hostname", "arch", "files", "trust")
PEM_KEYS = ("ca_pem", "cert_pem", "key_pem")
KEY_FILE = desired.file_with(desired.Content.KEY_PEM, desired.IDENTITY)
KEY_MADE_ON_NODE = "the key pair made on the node for cert_pem"
"""What the key file should hold with keyOrigin node, before the node has been seen to hold it."""


def key_on_node(props: dict[str, Any]) -> bool:
    return bool(props.get("key_origin", KEY_ORIGIN_NODE) == KEY_ORIGIN_NODE)


def desired_hashes(props: dict[str, Any], recorded: dict[str, Any] | None = None) -> dict[str, str] | None:
    """path -> sha256 the node should hold, or None while a PEM is unknown (preview).

    With the key made on the node its bytes are never seen here: the key file
    should hold what it held when this resource last installed or read it
    (``recorded``'s ``files``), as long as the certificate is the same.
    """
    on_node = key_on_node(props)
    ca, cert, key = props.get("ca_pem"), props.get("cert_pem"), None if on_node else props.get("key_pem")
    if not isinstance(ca, str) or not isinstance(cert, str) or not (on_node or isinstance(key, str)):
        return None
    want = {f.path: f.sha256 for f in desired.identity_files(ca, cert, key)}
    if on_node:
        seen = ((recorded if recorded is not None else props).get("files") or {}).get(KEY_FILE.path)
        sha = seen.split(";")[0] if isinstance(seen, str) else facts.ABSENT
        want[KEY_FILE.path] = sha if sha != facts.ABSENT else KEY_MADE_ON_NODE
    return want


def files_state(node: facts.NodeFacts) -> dict[str, str]:
    """The ``files`` output: path -> the file as seen (its sha256, or what differs from the desired state)."""
    return {f.path: node.state(f) for f in desired.files_of(desired.IDENTITY)}


def recorded_keys(props: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The host keys to expect: those this resource recorded (its outputs ``host_key`` and ``jump_host_keys``),
    else those ClientCertificate recorded when it had the node make its key (``known_*``)."""
    return (props.get("host_key") or props.get("known_host_key"),
            props.get("jump_host_keys") or props.get("known_jump_host_keys"))


OPERATOR_KEY_UNGUARDED = (
    "keyOrigin operator sends the node's private key over SSH, and no host key is pinned or recorded for this "
    "machine: the key would go to whichever machine answers at its address",
    "pin the node's hostKey (ConnectionArgs.host_key), read on the machine itself, not over the network: "
    "`cat /etc/ssh/ssh_host_ed25519_key.pub` on its console, or the key its image or provisioning system gave it; "
    "or leave keyOrigin at node (the default): that key never leaves the node")
"""The problem and fix of an operator-made key about to be sent to a machine nobody vouched for."""


def operator_key_unguarded(sends_key: bool, pin: Any, recorded: Mapping[str, Any]) -> bool:
    """Would an operator-made key (``sends_key``) go to a machine that neither a pinned host key (``pin``) nor one
    recorded (``recorded``'s, see recorded_keys) vouches for?"""
    return sends_key and pin is None and recorded_keys(recorded)[0] is None


def _apply(spec: IdentitySpec, recorded: dict[str, Any], restart_agent: bool) -> dict[str, Any]:
    if operator_key_unguarded(spec.key_pem is not None, spec.connection.host_key, recorded):
        # Refused before any connection: nothing is sent, not even the session's first command.
        raise errors.ConfigError(spec.node_id, "hostKey", *OPERATOR_KEY_UNGUARDED)
    files = desired.identity_files(spec.ca_pem, spec.cert_pem, spec.key_pem)
    spki = None
    if spec.key_pem is None:
        from .. import pki  # cryptography: only to name the node's key by its public half

        spki = pki.spki_b64(spec.cert_pem)
    with _glue.session(spec.connection, spec.node_id, *recorded_keys(recorded)) as s:
        res = s.run(remote.install_identity(files, restart_agent, spki))
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
    want = desired_hashes(news, olds)
    if want is not None and not set(PEM_KEYS) & set(found) and olds.get("files") != want:
        found.append("files")
    return found


class NodeIdentityProvider(ResourceProvider):
    # Pickled by reference (module + class name): the payload holds nothing secret.
    serialize_as_secret_always = False

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        def collect(props: Mapping[str, Any], problems: Problems) -> None:
            IdentitySpec.collect(props, problems)
            # A resource that will be created (none yet, or another machine) has recorded nothing: say so in the
            # preview already. create() refuses in any case (a replacement the engine decides on, replace_with).
            conn = props.get("connection")
            if not isinstance(conn, Mapping) or is_unknown(conn.get("host_key")):
                return  # the pin is not known yet (a preview): create() decides
            new_machine = not olds or not _glue.same_machine(olds, props) or olds.get("node_id") != props.get("node_id")
            operator_key = props.get("key_origin") == KEY_ORIGIN_OPERATOR
            if new_machine and operator_key_unguarded(operator_key, conn.get("host_key"), props):
                problems.add("hostKey", *OPERATOR_KEY_UNGUARDED)

        return _glue.check(news, collect, defaults=defaults(CertificateSpec, ("key_origin",)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A replacement is created before the old one is deleted; the delete
        # leaves the node alone once it carries the replacement's certificate.
        return _glue.diff_result(changes(olds, news), REPLACE_KEYS)

    @_glue.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = IdentitySpec.from_props(props)
        computed = _apply(spec, props, restart_agent=False)
        return CreateResult(spec.node_id, _glue.outputs(props, **computed))

    @_glue.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if _glue.operator_side_only(changes(olds, news)):
            return UpdateResult(_glue.carried(olds, news, OUTPUT_KEYS))
        spec = IdentitySpec.from_props(news)
        renewed = olds.get("cert_pem") != news.get("cert_pem") or olds.get("key_pem") != news.get("key_pem")
        computed = _apply(spec, olds, restart_agent=renewed or olds.get("files") != desired_hashes(news, olds))
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
        owned = {path: sha for path, sha in (desired_hashes(props) or {}).items() if sha != KEY_MADE_ON_NODE}
        _glue.remove_from_node(spec.connection, spec.node_id, recorded_keys(props),
                               remote.remove_identity(owned), "the identity")


@dataclass
class NodeIdentityArgs:
    node_id: pulumi.Input[str]
    connection: Connection
    ca_pem: pulumi.Input[str]
    cert_pem: pulumi.Input[str]
    key_pem: pulumi.Input[str] | None = None
    """keyOrigin operator: the key ClientCertificate made. Absent with the key made on the node."""
    key_origin: pulumi.Input[str] | None = None
    """``node`` (the default) or ``operator``, as the node's ClientCertificate was given."""
    known_host_key: pulumi.Input[str] | None = None
    """The host key ClientCertificate saw when it had the node make its key (keyOrigin node): expected here."""
    known_jump_host_keys: pulumi.Input[dict[str, str]] | None = None


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
