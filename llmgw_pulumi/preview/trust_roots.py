"""The fleet's trust roots, and what a change does to them (pure).

A trust root is a setting that decides whom the fleet trusts: which key signs
the agent's releases, which digests a release must have, which server and CA
it is downloaded from, which program or CA signs the nodes' certificates,
which SSH host keys the operator's side accepts. A change to one touches no
node, so the rest of the summary calls such a node "untouched"; it still
decides what every later `pulumi up` trusts. ``TRUST_ROOTS`` declares each one
once: the setting as the operator writes it, the resource whose inputs carry
it, and how its value is shown.

A value is shown as a fingerprint (the SHA256 of a public key or of a
certificate) or as plain text that holds no secret (a URL's host, a path),
never as the key, the certificate or a whole URL. ``changes`` compares one
resource's recorded inputs with its new ones; the pull-request summary
(llmgw_pulumi.preview.changes, markdown) shows each change as a row, and
the policy rule ``trust-roots-unchanged`` (llmgw_pulumi.preview.rules) fails it
unless the base branch's policy config approves it (``approved``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .. import validate
from ..config.agent_settings import BinarySource
from ..releases.policy import key_fingerprint
from ..text import printable
from .changes import AGENT, CERTIFICATE, CONNECTION, ENGINES, HOST_KEY, IDENTITY, JUMP, UNKNOWN, VERSION

NOT_SET = "none"
"""How a trust root that is not set is shown (no signing key, no pin, the system's CAs, no jump host)."""
NOT_KNOWN = "not known in a preview"
"""How a value the preview cannot know yet is shown: a change to it is a change (judged, never waved through)."""
WITH_CONNECTION = frozenset({CERTIFICATE, IDENTITY, AGENT, ENGINES})


@dataclass(frozen=True)
class TrustRoot:
    setting: str
    """As the operator writes it in the stack config (``agent.signingKey``), and as the policy config names it."""
    what: str
    """What it is and how its value is shown, for the reviewer."""
    kinds: frozenset[str]
    """The resources whose inputs carry it (``changes`` kinds)."""
    show: Callable[[Mapping[str, Any]], str]
    """Its value, shown, from one resource's inputs: NOT_SET when absent, NOT_KNOWN when unknown."""
    compared: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] = lambda old, new: True
    """Whether (old inputs, new inputs) can say anything about it (a preview leaves some values out)."""


@dataclass(frozen=True, order=True)
class Change:
    """One trust root of one resource changes from ``old`` to ``new`` (both shown, never secret)."""

    setting: str
    old: str
    new: str


def _unknown(value: Any) -> bool:
    return isinstance(value, str) and value == UNKNOWN


def _shown(value: Any, show: Callable[[Any], str]) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return NOT_SET
    if _unknown(value):
        return NOT_KNOWN
    return printable(show(value))


def ssh_key(value: Any) -> str:
    """An OpenSSH public key as its ``SHA256:`` fingerprint (ssh-keygen's)."""
    try:
        return key_fingerprint(str(value))
    except (IndexError, ValueError, binascii.Error):
        return "an unreadable key"


PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def pem_sha256(pem: Any) -> str | None:
    """The SHA256 (hex) of a PEM certificate's DER form (the first in the text); None where there is none."""
    found = PEM_CERTIFICATE.search(str(pem))
    try:
        der = base64.b64decode("".join(found.group(1).split()), validate=True) if found else b""
    except (ValueError, binascii.Error):
        der = b""
    return hashlib.sha256(der).hexdigest() if der else None


def certificate(pem: Any) -> str:
    """A PEM certificate (the first in the text) as the SHA256 of its DER form: ``sha256:<hex>``."""
    digest = pem_sha256(pem)
    return f"sha256:{digest}" if digest else "an unreadable certificate"


def url_host(url: Any) -> str:
    """The host (and port, when not 443) of a URL: never its path, query or anything before an ``@``."""
    try:
        parts = urlsplit(str(url))
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "an unreadable URL"
    if not host:
        return "an unreadable URL"
    host = f"[{host}]" if ":" in host else host
    return host if port in (None, 443) else f"{host}:{port}"


def pins(value: Any) -> str:
    """``agent.sha256`` (arch -> digest) as ``arch digest`` pairs, sorted."""
    if not isinstance(value, Mapping):
        return "an unreadable pin list"
    return ", ".join(f"{arch} {str(digest).lower()}" for arch, digest in sorted(value.items()))


def signer_command(argv: Any) -> str:
    """The signer program's path; its arguments, when there are any, counted and fingerprinted (they may say
    which key or profile signs, so a change to them is a change)."""
    if not isinstance(argv, Sequence) or isinstance(argv, str) or not argv:
        return "an unreadable command"
    if len(argv) == 1:
        return str(argv[0])
    digest = hashlib.sha256("\0".join(map(str, argv)).encode()).hexdigest()[:16]
    return f"{argv[0]} (+{len(argv) - 1} arguments, argv sha256:{digest})"


def jump_hosts(hops: Any) -> str:
    """Jump hosts, outermost first: each one's host (and port) and its pinned host key's fingerprint."""
    if not isinstance(hops, Sequence) or isinstance(hops, str):
        return "an unreadable jump host list"
    shown = []
    for hop in hops:
        address = hop.get("address") if isinstance(hop, Mapping) else None
        if not isinstance(address, str) or validate.hop(address):
            shown.append("an unreadable jump host")
            continue
        _, host, port = validate.split_hop(address)
        key = hop.get(HOST_KEY) if isinstance(hop, Mapping) else None
        pin = f"key {ssh_key(key)}" if key and not _unknown(key) else "key not pinned"
        shown.append(f"{host}{f':{port}' if port != 22 else ''} ({pin})")
    return " → ".join(shown)


def _input(name: str, show: Callable[[Any], str]) -> Callable[[Mapping[str, Any]], str]:
    return lambda inputs: _shown(inputs.get(name), show)


def _signer(field: str, show: Callable[[Any], str], default: str = NOT_SET) -> Callable[[Mapping[str, Any]], str]:
    def read(inputs: Mapping[str, Any]) -> str:
        signer = inputs.get(SIGNER)
        if _unknown(signer):
            return NOT_KNOWN
        value = signer.get(field) if isinstance(signer, Mapping) else None
        return default if value is None else _shown(value, show)

    return read


def _the_ca(inputs: Mapping[str, Any]) -> str:
    """The CA the certificates chain to: the fingerprint check() records (of signer.ca, or of pkiDir's ca.pem
    where the preview can read it), else that of signer.ca's certificate; NOT_KNOWN where the fingerprint is
    known not to have been read (``ca_as_read``)."""
    recorded = inputs.get(CA_FINGERPRINT)
    if _unknown(recorded):
        return NOT_KNOWN
    if isinstance(recorded, str) and recorded:
        return printable(f"sha256:{recorded.lower()}")
    return _signer("ca_pem", certificate)(inputs)


def ca_from_pki_dir(inputs: Mapping[str, Any]) -> bool:
    """Whether a ClientCertificate's CA is pkiDir's ca.pem, read from the machine that runs Pulumi (no signer
    input, or kind pkiDir), rather than signer.ca, whose certificate the inputs hold."""
    signer = inputs.get(SIGNER)
    return signer is None or (isinstance(signer, Mapping) and signer.get("kind", PKI_DIR_KIND) == PKI_DIR_KIND)


def ca_as_read(inputs: Mapping[str, Any], read: str | None) -> dict[str, Any]:
    """New ClientCertificate inputs with the fingerprint of pkiDir's CA as this machine reads it now (``read``,
    hex; None: ca.pem cannot be read here). check() keeps the recorded fingerprint where it cannot read ca.pem,
    so that the diff sees no CA rotation it cannot tell; that kept value says nothing about the CA the change
    would make every later `up` trust. A CA that was not read is shown as not known, and so judged, never as
    unchanged. Inputs whose CA is signer.ca are returned as they are."""
    if not ca_from_pki_dir(inputs):
        return dict(inputs)
    return {**inputs, CA_FINGERPRINT: read or UNKNOWN}


def _connection(show: Callable[[Mapping[str, Any]], str]) -> Callable[[Mapping[str, Any]], str]:
    def read(inputs: Mapping[str, Any]) -> str:
        connection = inputs.get(CONNECTION)
        if _unknown(connection):
            return NOT_KNOWN
        return show(connection) if isinstance(connection, Mapping) else NOT_SET

    return read


def _both_connected(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Host keys are compared where the resource reaches the node before and after: a ClientCertificate whose key
    is made on the operator's side (keyOrigin operator) has no connection, and trusts no host key."""
    return all(isinstance(inputs.get(CONNECTION), Mapping) or _unknown(inputs.get(CONNECTION)) for inputs in (old, new))


def _same_release(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Pins are compared for the same release only, and only when the new inputs hold them: another version has
    other digests (its upgrade is the summary's and ``release-verified``'s), and a preview of a stack that pins
    nothing leaves the digests out."""
    return old.get(VERSION) == new.get(VERSION) and new.get(RELEASE_SHA256) is not None


# --------------------------------------------------------------------------- names read from the inputs
SIGNING_KEY, RELEASE_SHA256, RELEASE_CA, RELEASE_URL = "signing_key", "release_sha256", "release_ca", "release_url"
SIGNER, CA_FINGERPRINT = "signer", "ca_fingerprint"
PKI_DIR_KIND = "pkiDir"
"""llmgw:signer's kind when no signer input is given (the default: pkiDir's ca-key.pem)."""

TRUST_ROOTS: tuple[TrustRoot, ...] = (
    TrustRoot("agent.signingKey", "the key whose signature checksums.txt must carry (its SHA256 fingerprint)",
              frozenset({AGENT}), _input(SIGNING_KEY, ssh_key)),
    TrustRoot("agent.sha256", "the digests a release's binary must have, per architecture (pins)",
              frozenset({AGENT}), _input(RELEASE_SHA256, pins), _same_release),
    TrustRoot("agent.releaseCa", "the only CA trusted for the release server (a path on the operator's machine; "
              "none: the system's CAs)", frozenset({AGENT}), _input(RELEASE_CA, str)),
    TrustRoot("agent.releaseUrl", "the release server's host", frozenset({AGENT}), _input(RELEASE_URL, url_host)),
    TrustRoot("signer.kind", "what signs the nodes' certificates", frozenset({CERTIFICATE}),
              lambda inputs: PKI_DIR_KIND if inputs.get(SIGNER) is None else _signer("kind", str, PKI_DIR_KIND)(inputs)),
    TrustRoot("signer.command", "the program that signs the nodes' certificates", frozenset({CERTIFICATE}),
              _signer("command", signer_command)),
    TrustRoot("ca", "the CA certificate the nodes' certificates chain to (pkiDir's ca.pem or signer.ca: the "
              "SHA256 of its DER form)", frozenset({CERTIFICATE}), _the_ca),
    TrustRoot("hostKey", "the node's pinned SSH host key (its SHA256 fingerprint; none: the key seen first, "
              "as recorded)", WITH_CONNECTION, _connection(lambda c: _shown(c.get(HOST_KEY), ssh_key)), _both_connected),
    TrustRoot("ssh.jump", "the jump hosts on the way to the node, each with its pinned host key",
              WITH_CONNECTION, _connection(lambda c: _shown(c.get(JUMP), jump_hosts)), _both_connected),
)
SETTINGS = {root.setting: root for root in TRUST_ROOTS}
# ---------------------------------------------------------------------------


RELEASE_ROOTS = ("agent.signingKey", "agent.sha256", "agent.releaseCa")
"""The trust roots an AgentInstall records among its release inputs (``BinarySource.RELEASE_FIELDS``), which its
outputs do not keep: a refresh that finds the node drifted records inputs rebuilt from the outputs, without them."""


def release_recorded(old: Mapping[str, Any]) -> bool:
    """Whether recorded AgentInstall inputs hold the release inputs (every install records how its release was
    verified); not after a refresh rebuilt them, when they are not known and so not judged."""
    return any(old.get(key) is not None for key in BinarySource.RELEASE_FIELDS)


def changes(kind: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The trust roots a resource of ``kind`` changes, from its recorded inputs to its new ones (both given: a
    resource created or deleted changes none)."""
    found = []
    for root in TRUST_ROOTS:
        if root.setting in RELEASE_ROOTS and not release_recorded(old):
            continue
        if kind in root.kinds and root.compared(old, new):
            before, after = root.show(old), root.show(new)
            if before != after:
                found.append(Change(root.setting, before, after))
    return found


def approved(change: Change, allowed: Iterable[Any]) -> bool:
    """Whether the policy config's allow list (``[{"setting": "agent.signingKey", "to": "SHA256:..."}]``) approves
    ``change``: an entry naming its setting and exactly the value it changes to (as shown). A change to a value
    the preview does not know is never approved: an entry could only approve whatever it turns out to be."""
    return change.new != NOT_KNOWN and any(isinstance(entry, Mapping) and entry.get("setting") == change.setting
                                           and entry.get("to") == change.new for entry in allowed)


def allow_entry(change: Change) -> str:
    """The policy config entry that approves ``change``, as JSON text."""
    return json.dumps({"setting": change.setting, "to": change.new}, ensure_ascii=False)
