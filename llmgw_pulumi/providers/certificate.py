"""ClientCertificate: a node's client certificate, issued from the cluster CA (SPEC step 2).

Where the key pair is made is the node's ``key_origin``:

- ``node`` (the default): the node makes its key pair in /etc/llmgw and sends
  back a certificate signing request (``node-key.sh``); the certificate is
  signed here for the request's public key. The private key never crosses
  the network and never enters state or outputs. NodeIdentity installs the
  certificate and, in the same step, puts the key made for it in place.
  Before it makes a key, the provider reads the identity the node already
  holds: one that this CA issued to this node id for client authentication,
  outside the renewal window, whose key is on the node, is kept as it is
  (``adopted``) — how the first `pulumi up` over a node onboarded by
  ``onboard-node.sh`` takes it over without re-issuing anything. This is also
  where the node is first reached: the host key seen (trusted on first use,
  unless pinned) is the ``host_key`` output, which NodeIdentity then expects.
- ``operator``: the key pair is made on the machine running Pulumi and kept in
  state as a secret output (``key_pem``), for nodes without openssl.

The CA key is read from the PKI dir at issue time and never enters state.
Renewal is a replacement: inside the renewal window the preview says
``replace (not_after)``; with the key on the node the replacement has the
node make a new pair, and the new certificate flows into NodeIdentity as an
in-place update that swaps certificate and key together.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from .. import desired, errors, facts, remote
from ..specs import DEFAULT_RENEW_BEFORE_HOURS, DEFAULT_VALIDITY_HOURS, KEY_ORIGIN_NODE, CertificateSpec, Connection, to_inputs
from . import _glue

INPUT_KEYS = ("node_id", "pki_dir", "validity_hours", "renew_before_hours", "key_origin", "connection", "ca_key_passphrase")
REPLACE_KEYS = ("node_id", "ca_fingerprint", "key_origin", "connection.host", "connection.port")
"""A new node id, another CA, another origin of the key, or (with the key made on the node) another machine needs a
new certificate; a PKI dir that moved, or another user or key to log in with, does not."""
OUTPUT_KEYS = ("cert_pem", "key_pem", "ca_pem", "ca_not_after", "serial", "not_after", "fingerprint_sha256",
               "adopted", "host_key", "jump_host_keys", "node_key")
NODE_KEY_HELD, NODE_KEY_GONE, NODE_KEY_OTHER = "held", "gone", "another key"
"""The ``node_key`` output (keyOrigin node): does the node hold the key of this certificate (in place, or made and
waiting for NodeIdentity)? Read by refresh; a key gone or replaced on the node has the certificate replaced by the
next `up`: a new pair is made there and signed."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def renewal_due(olds: dict[str, Any], news: dict[str, Any], now: dt.datetime) -> bool:
    """Inside the renewal window, unless the certificate already ends with its CA (a new one could not last longer)."""
    not_after = olds.get("not_after")
    before = news.get("renew_before_hours", DEFAULT_RENEW_BEFORE_HOURS)
    if not isinstance(not_after, str) or not isinstance(before, (int, float)):
        return False
    ca_not_after = olds.get("ca_not_after")
    if isinstance(ca_not_after, str) and dt.datetime.fromisoformat(not_after) >= dt.datetime.fromisoformat(ca_not_after):
        return False
    return dt.datetime.fromisoformat(not_after) - dt.timedelta(hours=before) <= now


def ca_fingerprint(pki_dir: str) -> str | None:
    """SHA-256 of the CA certificate in the PKI dir (of its DER form), or None where it cannot be read here.

    Public data, read locally: it lets a preview tell a rotated CA (every
    certificate must be re-issued) from a PKI dir that merely moved. The
    standard library's PEM decoding and hashlib, so previews need not load
    cryptography.
    """
    try:
        der = ssl.PEM_cert_to_DER_cert((Path(pki_dir) / "ca.pem").read_text())
    except (OSError, ValueError):
        return None
    return hashlib.sha256(der).hexdigest()


class ClientCertificateProvider(ResourceProvider):
    """Stateless: every method works from its arguments alone."""
    # Pickled by reference (module + class name): the payload holds nothing secret.
    serialize_as_secret_always = False


    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        def derive(inputs: dict[str, Any]) -> None:
            # Where ca.pem cannot be read (a reviewer's machine), the CA is taken to be unchanged.
            fp = ca_fingerprint(inputs["pki_dir"]) if isinstance(inputs.get("pki_dir"), str) else None
            if fp or olds.get("ca_fingerprint"):
                inputs["ca_fingerprint"] = fp or olds["ca_fingerprint"]

        return _glue.check(news, CertificateSpec.collect, derive=derive,
                           defaults={"validity_hours": DEFAULT_VALIDITY_HOURS, "renew_before_hours": DEFAULT_RENEW_BEFORE_HOURS,
                                     "key_origin": KEY_ORIGIN_NODE})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changes = _glue.changed_keys(olds, news, INPUT_KEYS)
        if olds.get("ca_fingerprint") and news.get("ca_fingerprint") and olds["ca_fingerprint"] != news["ca_fingerprint"]:
            changes.append("ca_fingerprint")
        if renewal_due(olds, news, _now()):
            changes.append("not_after")
        if news.get("key_origin") == KEY_ORIGIN_NODE and olds.get("node_key") not in (None, NODE_KEY_HELD):
            changes.append("node_key")
        return _glue.diff_result(changes, (*REPLACE_KEYS, "not_after", "node_key"))

    @_glue.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        from .. import pki  # cryptography: only when a certificate is issued

        spec = CertificateSpec.from_props(props)
        now = _now()
        authority = pki.load_authority(spec.pki_dir, spec.node_id, now, spec.ca_key_passphrase)
        if spec.key_on_node:
            issued, reached = _issue_for_node_key(spec, authority, now)
        else:
            issued, reached = pki.issue(authority, spec.node_id, dt.timedelta(hours=spec.validity_hours), now), {}
        outs = _glue.outputs(
            props,
            cert_pem=issued.cert_pem,
            key_pem=issued.key_pem or None,
            ca_pem=authority.cert_pem,
            ca_not_after=authority.cert.not_valid_after_utc.isoformat(),
            serial=issued.serial,
            not_after=issued.not_after,
            fingerprint_sha256=issued.fingerprint_sha256,
            **reached,
        )
        return CreateResult(f"{spec.node_id}:{issued.serial}", outs)

    @_glue.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only validity settings or the way to reach the node changed: they apply at the next issuance.
        return UpdateResult(_glue.outputs(news, **{k: olds.get(k) for k in OUTPUT_KEYS}))

    @_glue.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # The certificate lives in state; with the key made on the node, whether the node still holds it is read.
        spec = CertificateSpec.from_props(props)
        cert_pem = props.get("cert_pem")
        if not spec.key_on_node or spec.connection is None or not isinstance(cert_pem, str):
            return ReadResult(id_, props)
        from .. import pki

        def look() -> dict[str, str]:
            with _glue.session(_glue.for_read(spec.connection), spec.node_id, props.get("host_key"),
                               props.get("jump_host_keys")) as s:
                return _held_identity(s, spec)[1]

        try:
            seen = _glue.read_once_more(look, spec.node_id)
        except errors.UnreachableError as exc:
            return _glue.unreachable_on_read(id_, props, exc)
        want = pki.spki_b64(cert_pem)
        held = want in (seen.get("key_spki"), seen.get("pending_spki"))
        node_key = NODE_KEY_HELD if held else NODE_KEY_OTHER if seen.get("key_spki") else NODE_KEY_GONE
        return ReadResult(id_, {**props, "node_key": node_key})

    @_glue.operator_errors
    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # Revoking the old certificate is a separate decision (SPEC step 2).
        return None


def _held_identity(s: Any, spec: CertificateSpec) -> tuple[str | None, dict[str, str]]:
    """The certificate the node holds (public), and the public halves of its key and of a pending one
    (``key_spki``, ``pending_spki``): node-key.sh read, over session ``s``."""
    assert spec.connection is not None
    res = s.run(remote.read_node_key())
    _glue.raise_for(res, spec.node_id, f"reading the identity on {spec.connection.host}")
    return facts.parse_survey(res.stdout).texts.get(desired.CERT_PATH), facts.key_values(res.stdout)


def _issue_for_node_key(spec: CertificateSpec, authority: Any, now: dt.datetime) -> tuple[Any, dict[str, Any]]:
    """keyOrigin node: keep the identity the node holds, if it can be kept (``pki.adoptable``); else have the node
    make a new key pair and sign its request. Returns the certificate and what reaching the node recorded."""
    from .. import pki

    assert spec.connection is not None  # checked by ClientCertificateArgs / check()
    with _glue.session(spec.connection, spec.node_id, None) as s:
        held, seen = _held_identity(s, spec)
        adopted = pki.adoptable(authority, spec.node_id, held, seen.get("key_spki", ""),
                                dt.timedelta(hours=spec.renew_before_hours), now)
        issued = adopted
        if issued is None:
            res = s.run(remote.make_node_key(spec.node_id))
            _glue.raise_for(res, spec.node_id, f"making the node's key pair on {spec.connection.host}")
            csr = base64.b64decode(facts.key_values(res.stdout).get("csr", "")).decode(errors="replace")
            issued = pki.issue(authority, spec.node_id, dt.timedelta(hours=spec.validity_hours), now,
                               public_key=pki.requested_key(csr, spec.node_id))
        return issued, {"adopted": adopted is not None, "host_key": s.host_key, "jump_host_keys": s.jump_host_keys,
                        "node_key": NODE_KEY_HELD}


@dataclass
class ClientCertificateArgs:
    node_id: pulumi.Input[str]
    pki_dir: pulumi.Input[str]
    """Directory holding the cluster CA: ca.pem and ca-key.pem (from `llmgw ctl cert init-ca`)."""
    validity_hours: pulumi.Input[float] | None = None
    renew_before_hours: pulumi.Input[float] | None = None
    """A `pulumi up` this close to expiry issues a new certificate."""
    key_origin: pulumi.Input[str] | None = None
    """``node`` (the default): the node makes its key pair, which never leaves it; ``operator``: made here."""
    connection: Connection | None = None
    """How to reach the node: needed when the key is made on the node."""
    ca_key_passphrase: pulumi.Input[str] | None = field(default=None, repr=False, metadata={"secret": True})
    """The passphrase of an encrypted ca-key.pem: a secret input (and output), read only when a certificate is
    issued; None (absent) for a CA key that is not encrypted."""


class ClientCertificate(Resource, module="llmgw", name="ClientCertificate"):
    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]
    ca_pem: pulumi.Output[str]
    ca_not_after: pulumi.Output[str]
    serial: pulumi.Output[str]
    not_after: pulumi.Output[str]
    fingerprint_sha256: pulumi.Output[str]
    adopted: pulumi.Output[bool]
    """The node's certificate was kept as it was (onboarded before, e.g. by the script), not issued here."""
    host_key: pulumi.Output[str]
    """keyOrigin node: the host key the node presented (NodeIdentity expects it)."""
    jump_host_keys: pulumi.Output[dict[str, str]]
    node_key: pulumi.Output[str]
    """keyOrigin node: whether the node holds this certificate's key (``held``), as last read."""

    def __init__(self, name: str, args: ClientCertificateArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = {**to_inputs(args), **{k: None for k in OUTPUT_KEYS}}
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["key_pem", "ca_key_passphrase"]))
        super().__init__(ClientCertificateProvider(), name, _glue.with_urn(type(self), name, props, opts), opts)
