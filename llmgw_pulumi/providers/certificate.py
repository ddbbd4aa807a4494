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

How it is signed is the stack's ``llmgw:signer`` (llmgw_pulumi.certificates.signer): the CA key read from the PKI dir at
issue time (the default), the CA key as the ``llmgw:caKey`` secret, or an external signer command. The CA key
never enters state: the caKey secret arrives as the secret input ``ca_key``, which ``check`` takes out of the
inputs the engine records and keeps in this provider process's memory for the create or update that follows.
A node's request is checked before any signer sees it (``Signing.sign``: ``pki.requested_key``), and whatever
signed it, the certificate is checked against the request before it is used (``pki.accept_signed``).
How it is signed is not a change to the node: a second checkout that signs another way (a CI runner with the
signer command and no PKI dir) shows nothing to change.

Which machine is reached (SPEC step 2; the trust rules in docs/operations.md):

- A new node id, address or port is a new machine: the certificate is
  replaced, and its ``create()`` trusts the host key it meets on first use
  (unless ``hostKey`` is pinned). So is a node whose VM the program replaced
  (``replace_with``: the engine replaces the resource).
- Everything else that needs a new certificate for the same machine (renewal,
  another CA, the node's key lost or replaced, another ``keyOrigin``) is an
  update in place: ``update()`` sees the old outputs, so it reaches the node
  expecting the host key and jump-host keys recorded there, and a machine
  presenting another key is refused before anything is made on it or signed.
  ``diff`` says why under the resource (``reissue_reasons``): the engine
  shows an update's reason only through the provider's own log, since a
  dynamic provider sends no detailed diff. The new certificate flows into
  NodeIdentity as an in-place update that swaps certificate and key together.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from .. import decisions, errors
from ..config.schema import defaults
from ..config.specs import KEY_ORIGIN_NODE, NODE_REPLACE_KEYS, CertificateSpec, Connection
from ..nodestate import commands, desired, facts
from . import base

log = logging.getLogger(__name__)

INPUT_KEYS = ("node_id", "validity_hours", "renew_before_hours", "key_origin", "connection", "ca_key_passphrase")
"""The inputs compared by diff. Not ``pki_dir`` nor ``signer``: how certificates are signed is the operator's side
(another CA is told by ``ca_fingerprint``)."""
CA_KEY_INPUT = "ca_key"
"""The secret input that brings the caKey signer's key; never recorded (see ``check``)."""
_ca_keys: dict[str, str] = {}
"""Node id -> the CA key ``check`` took out of its inputs, for this process's create or update."""
REPLACE_KEYS = NODE_REPLACE_KEYS
"""A new node id, or (with the key made on the node) another machine: a new certificate, from a new resource, for a
machine trusted on first use unless its host key is pinned. A PKI dir that moved, or another user or key to log in
with, changes nothing."""
REISSUE_REASONS = {
    decisions.EXPIRES: "the certificate expires {not_after}, inside its renewal window",
    decisions.CA_CHANGED: "the CA (pkiDir's ca.pem, or llmgw:signer.ca) is another one",
    decisions.KEY_LOST: "the node no longer holds the certificate's key",
    decisions.KEY_ORIGIN_CHANGED: "keyOrigin changed",
}
"""Why the same machine gets a new certificate: an update in place, which expects the host keys recorded."""
NODE_KEY_HELD, NODE_KEY_GONE, NODE_KEY_OTHER = decisions.NODE_KEY_HELD, "gone", "another key"
"""The ``node_key`` output (keyOrigin node): does the node hold the key of this certificate (in place, or made and
waiting for NodeIdentity)? Read by refresh; a key gone or replaced on the node has the certificate replaced by the
next `up`: a new pair is made there and signed."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def reissue_reasons(olds: dict[str, Any], news: dict[str, Any], now: dt.datetime) -> list[str]:
    """Why the machine already known needs a new certificate (keys of REISSUE_REASONS), in that order: the one
    decision the review of a preview reads too (``decisions.reissue``)."""
    return list(decisions.reissue(olds, news, now).reasons)


def why_reissued(news: dict[str, Any], olds: dict[str, Any], reasons: list[str]) -> str:
    """What the preview and `up` say about a certificate issued again for the same machine."""
    node = news.get("node_id", "?")
    why = "; ".join(REISSUE_REASONS[r].format(not_after=olds.get("not_after")) for r in reasons)
    if news.get("key_origin", KEY_ORIGIN_NODE) != KEY_ORIGIN_NODE:
        return f"{node}: a new certificate is issued ({why}); its key is made here"
    host_key = olds.get("host_key")
    seen = f"host key {openssh_fingerprint(host_key)}" if isinstance(host_key, str) else "no host key recorded"
    return (f"{node}: a new certificate is issued ({why}), for a key pair made on the machine already known "
            f"({seen}); a machine presenting another host key is refused")


def openssh_fingerprint(host_key: str) -> str:
    """'SHA256:...' of 'type base64' public key text, as ssh-keygen -l prints it (without paramiko: diff runs in
    every preview)."""
    try:
        blob = base64.b64decode(host_key.split()[1], validate=True)
    except (IndexError, ValueError):
        return "an unreadable key"
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def ca_fingerprint(pki_dir: str) -> str | None:
    """SHA-256 of the CA certificate in the PKI dir (of its DER form), or None where it cannot be read here.

    Public data, read locally: it lets a preview tell a rotated CA (every
    certificate must be re-issued) from a PKI dir that merely moved. The
    standard library's PEM decoding and hashlib, so previews need not load
    cryptography.
    """
    try:
        return pem_fingerprint((Path(pki_dir) / "ca.pem").read_text())
    except OSError:
        return None


def pem_fingerprint(ca_pem: str) -> str | None:
    """SHA-256 of a PEM certificate's DER form (the first one in the text), or None where it is not one."""
    try:
        der = ssl.PEM_cert_to_DER_cert(ca_pem)
    except ValueError:
        return None
    return hashlib.sha256(der).hexdigest()


class ClientCertificateProvider(base.ModuleProvider):
    """Stateless: every method works from its arguments alone."""


    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        news = dict(news)
        ca_key = news.pop(CA_KEY_INPUT, None)
        if isinstance(ca_key, str) and isinstance(news.get("node_id"), str):
            _ca_keys[news["node_id"]] = ca_key  # memory only: the recorded inputs are check's, without it

        def derive(inputs: dict[str, Any]) -> None:
            # Where ca.pem cannot be read (a reviewer's machine), the CA is taken to be unchanged.
            signer = inputs.get("signer")
            given = signer.get("ca_pem") if isinstance(signer, dict) else None
            if isinstance(given, str):
                fp = pem_fingerprint(given)
            else:
                fp = ca_fingerprint(inputs["pki_dir"]) if isinstance(inputs.get("pki_dir"), str) else None
            if fp or olds.get("ca_fingerprint"):
                inputs["ca_fingerprint"] = fp or olds["ca_fingerprint"]

        return base.check(news, CertificateSpec.collect, derive=derive,
                           defaults=defaults(CertificateSpec, ("validity_hours", "renew_before_hours", "key_origin")))

    @base.operator_errors
    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changes = base.changed_keys(olds, news, INPUT_KEYS)
        reasons = reissue_reasons(olds, news, _now())
        changes += [r for r in reasons if r not in changes]
        replaces = base.diff_result(changes, REPLACE_KEYS)
        if reasons and not replaces.replaces:
            log.info("%s", why_reissued(news, olds, reasons))  # the preview's only place to say why
        return replaces

    @base.operator_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        # A new resource: a new node id or another machine, trusted on first use unless its host key is pinned.
        outs = _issue(props, None)
        return CreateResult(f"{outs['node_id']}:{outs['serial']}", outs)

    @base.operator_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        reasons = reissue_reasons(olds, news, _now())
        if not reasons:
            # Only validity settings or the way to reach the node changed: they apply at the next issuance.
            return UpdateResult(base.carried(olds, news, OUTPUT_KEYS))
        # The same machine: the host keys recorded when it was first reached are expected.
        return UpdateResult(_issue(news, Recorded(olds.get("host_key"), olds.get("jump_host_keys"))))

    @base.operator_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # The certificate lives in state; with the key made on the node, whether the node still holds it is read.
        spec = CertificateSpec.from_props(props)
        cert_pem = props.get("cert_pem")
        if not spec.key_on_node or spec.connection is None or not isinstance(cert_pem, str):
            return ReadResult(id_, props)
        from ..certificates import pki

        def look() -> dict[str, str]:
            with base.session(base.for_read(spec.connection), spec.node_id, props.get("host_key"),
                               props.get("jump_host_keys")) as s:
                return _held_identity(s, spec)[1]

        try:
            seen = base.read_once_more(look, spec.node_id)
        except errors.UnreachableError as exc:
            return base.unreachable_on_read(id_, props, exc)
        want = pki.spki_b64(cert_pem)
        held = want in (seen.get("key_spki"), seen.get("pending_spki"))
        node_key = NODE_KEY_HELD if held else NODE_KEY_OTHER if seen.get("key_spki") else NODE_KEY_GONE
        return ReadResult(id_, {**props, "node_key": node_key})

    @base.operator_errors
    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # Revoking the old certificate is a separate decision (SPEC step 2).
        return None


PROVIDER = ClientCertificateProvider()
"""The one instance every resource is registered with (``base.ModuleProvider``)."""


def _held_identity(s: Any, spec: CertificateSpec) -> tuple[str | None, dict[str, str]]:
    """The certificate the node holds (public), and the public halves of its key and of a pending one
    (``key_spki``, ``pending_spki``): node-key.sh read, over session ``s``."""
    assert spec.connection is not None
    res = s.run(commands.read_node_key())
    base.raise_for(res, spec.node_id, f"reading the identity on {spec.connection.host}")
    return facts.parse_survey(res.stdout).texts.get(desired.CERT_PATH), facts.key_values(res.stdout)


@dataclass(frozen=True)
class Recorded:
    """The host keys recorded when this resource first reached its node (its ``host_key`` and ``jump_host_keys``
    outputs): what an update expects to meet again."""

    host_key: str | None
    jump_host_keys: dict[str, str] | None


def _issue(props: dict[str, Any], recorded: Recorded | None) -> dict[str, Any]:
    """Issue the certificate ``props`` ask for; its outputs. ``recorded``: None for a new resource (first use),
    else the keys its node must present (an update)."""
    from cryptography.hazmat.primitives import serialization

    from ..certificates import pki, signer, signing  # cryptography: only when a certificate is issued

    spec = CertificateSpec.from_props(props)
    now = _now()
    # The signer is found (a PKI dir read, a key loaded, a command seen to be there) before the node is reached.
    how = Signing(*signing.chosen(signer.SignerSpec.from_input(spec.signer), spec.node_id, spec.pki_dir,
                                 _ca_keys.get(spec.node_id), now, spec.ca_key_passphrase), now=now)
    if spec.key_on_node:
        issued, reached = _issue_for_node_key(spec, how, recorded)
    else:
        key_pem, csr = pki.operator_key_and_csr(spec.node_id)
        issued, reached = dataclasses.replace(how.sign(spec, csr), key_pem=key_pem), {}
    return base.outputs(
        props,
        cert_pem=issued.cert_pem,
        key_pem=issued.key_pem or None,
        ca_pem=how.ca.public_bytes(serialization.Encoding.PEM).decode(),
        ca_not_after=how.ca.not_valid_after_utc.isoformat(),
        serial=issued.serial,
        not_after=issued.not_after,
        fingerprint_sha256=issued.fingerprint_sha256,
        **reached,
    )


@dataclass(frozen=True)
class Signing:
    """The signer of one issuance, the CA certificate it must chain to, and the time it is made at."""

    signer: Any
    ca: Any
    now: dt.datetime

    def sign(self, spec: CertificateSpec, csr_pem: str) -> Any:
        """The certificate for ``csr_pem`` (``pki.IssuedCertificate``), checked against what was asked.

        The request is checked first (``pki.requested_key``: CN=<node id> alone, no extension, signed by its own
        strong key): one that asks for anything else never reaches the signer, whichever it is (a command signer
        may sign what it is given verbatim)."""
        from ..certificates import pki, signer

        pki.requested_key(csr_pem, spec.node_id)
        req = signer.request(spec.node_id, csr_pem, dt.timedelta(hours=spec.validity_hours), self.now,
                             self.ca.not_valid_after_utc)
        return pki.accept_signed(self.ca, self.signer.sign(req), req, _now())


def _issue_for_node_key(spec: CertificateSpec, how: Signing,
                        recorded: Recorded | None) -> tuple[Any, dict[str, Any]]:
    """keyOrigin node: keep the identity the node holds, if it can be kept (``pki.adoptable``); else have the node
    make a new key pair and sign its request. Returns the certificate and what reaching the node recorded.

    ``recorded``: the host keys an update expects (see ``Recorded``); the session refuses another machine before
    anything runs on it. An update that has none recorded (the key was made here until now) reaches a machine this
    resource never met: it needs the host key pinned, as a first contact of NodeIdentity's would have recorded it.
    """
    from ..certificates import pki

    assert spec.connection is not None  # checked by ClientCertificateArgs / check()
    if recorded is not None and recorded.host_key is None and spec.connection.host_key is None:
        raise errors.ConfigError(
            spec.node_id, "hostKey",
            "no host key is recorded for this machine here (its key was made by the operator until now), and none is "
            "pinned, so the machine that would make the new key pair cannot be told from another one",
            "pin the node's hostKey (ConnectionArgs.host_key) to the key its NodeIdentity recorded (host_key in "
            "`pulumi stack export`), after comparing its fingerprint with `ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub` run on the machine's console")
    expected_host_key, expected_jump_keys = (recorded.host_key, recorded.jump_host_keys) if recorded else (None, None)
    with base.session(spec.connection, spec.node_id, expected_host_key, expected_jump_keys) as s:
        held, seen = _held_identity(s, spec)
        adopted = pki.adoptable(pki.Authority(how.ca, None), spec.node_id, held, seen.get("key_spki", ""),
                                dt.timedelta(hours=spec.renew_before_hours), how.now)
        issued = adopted
        if issued is None:
            res = s.run(commands.make_node_key(spec.node_id))
            base.raise_for(res, spec.node_id, f"making the node's key pair on {spec.connection.host}")
            csr = base64.b64decode(facts.key_values(res.stdout).get("csr", "")).decode(errors="replace")
            # how.sign refuses a request for anything but CN=<node id> before any signer sees it. A signer that
            # fails leaves the new key pending on the node, unused: the next attempt replaces it.
            issued = how.sign(spec, csr)
        return issued, {"adopted": adopted is not None, "host_key": s.host_key, "jump_host_keys": s.jump_host_keys,
                        "node_key": NODE_KEY_HELD}


@dataclass
class ClientCertificateArgs:
    node_id: pulumi.Input[str]
    pki_dir: pulumi.Input[str] | None = None
    """Directory holding the cluster CA: ca.pem and ca-key.pem (from `llmgw ctl cert init-ca`): the default signer."""
    validity_hours: pulumi.Input[float] | None = None
    renew_before_hours: pulumi.Input[float] | None = None
    """A `pulumi up` this close to expiry issues a new certificate."""
    key_origin: pulumi.Input[str] | None = None
    """``node`` (the default): the node makes its key pair, which never leaves it; ``operator``: made here."""
    connection: Connection | None = None
    """How to reach the node: needed when the key is made on the node."""
    signer: pulumi.Input[Mapping[str, Any]] | None = None
    """How it is signed: llmgw_pulumi.certificates.signer.SignerSpec's fields (kind, ca_pem, command, timeout_seconds,
    max_parallel); None: from pki_dir."""
    ca_key: pulumi.Input[str] | None = None
    """Signer caKey: the CA key PEM, as a secret. Taken out of the inputs by check: never recorded in state."""
    ca_key_passphrase: pulumi.Input[str] | None = field(default=None, repr=False, metadata={"secret": True})
    """The passphrase of an encrypted ca-key.pem: a secret input (and output), read only when a certificate is
    issued; None (absent) for a CA key that is not encrypted."""


class ClientCertificate(base.NodeResource, module=decisions.PACKAGE, name=decisions.CERTIFICATE):
    PROVIDER = ClientCertificateProvider
    SECRET_OUTPUTS = ("key_pem", "ca_key_passphrase")

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
        secret = {CA_KEY_INPUT: pulumi.Output.secret(args.ca_key)} if args.ca_key is not None else {}
        super().__init__(*self.registration(name, args, opts, **secret))


OUTPUT_KEYS = ClientCertificate.output_keys()
