"""What a release is and what is accepted of it: its files' names, checksums.txt's format, the namespace its
signature is made in, the digests a pin may give. Decisions on text only: fetching a release and running
``ssh-keygen`` to verify it are in ``llmgw_pulumi.releases.approval``, which re-exports every name here.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ChecksumMismatchError
from ..validate import RELEASE_TAG

NAMESPACE = "llmgw-release"
"""The OpenSSH signature namespace (``ssh-keygen -Y sign -n``) a release's checksums.txt is signed in."""
CHECKSUMS = "checksums.txt"
SIGNATURE_SUFFIX = ".sig"
"""The detached signature sits beside checksums.txt, as ``ssh-keygen -Y sign`` names it."""
WHO = "llmgw"
"""Errors here are about a release, before any node is reached: they name the stack's agent settings."""

_LINE = re.compile(r"\A([0-9A-Fa-f]{64}) [ *](\S+)\Z")
_ARCH = re.compile(r"\A[a-z0-9_]{1,32}\Z")
DIGEST = re.compile(r"\A[0-9a-f]{64}\Z")


def binary_name(tag: str, arch: str) -> str:
    """The release file of ``arch`` (``llmgw-v1.4.2-linux-amd64``)."""
    return f"llmgw-{tag}-linux-{arch}"


@dataclass(frozen=True)
class Release:
    """A release as the operator configured it (agent.version, releaseUrl, signingKey, sha256, releaseCa)."""

    url: str
    tag: str
    signing_key: str | None = None
    pins: tuple[tuple[str, str], ...] = ()
    """(arch, sha256) pairs given in agent.sha256; when given, nothing is fetched to learn the digests."""
    ca_file: str | None = None
    """A PEM bundle trusted (alone) for the release server's certificate; None: the system's (and SSL_CERT_FILE)."""

    @property
    def base(self) -> str:
        return f"{self.url.rstrip('/')}/{self.tag}"

    @property
    def how(self) -> str:
        """How the digests were approved, for the operator's log."""
        if self.pins:
            return "pinned in agent.sha256"
        if self.signing_key:
            return f"from checksums.txt signed by {key_fingerprint(self.signing_key)}"
        return "from checksums.txt as the server sent it over https (no signingKey or sha256 pin)"


def key_fingerprint(public_key: str) -> str:
    """``SHA256:...`` of an OpenSSH public key line, as ssh-keygen prints it."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def shown(text: str, limit: int = 120) -> str:
    """Text that came from a server, safe to print: quoted, control characters escaped, cut short."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


# --------------------------------------------------------------------------- checksums.txt


def parse_checksums(text: str, tag: str, source: str = "") -> dict[str, str]:
    """arch -> sha256 of every ``llmgw-<tag>-linux-<arch>`` that ``checksums.txt`` lists (sha256sum format).

    Strict: every line is ``<64 hex digits>  <name>`` (or `` *<name>``), each
    binary once; lines for other files are allowed (and not used). Anything else raises
    ChecksumMismatchError naming the line, since a file we cannot read exactly
    is not one to install from.
    """
    fix = (f"republish {CHECKSUMS} in sha256sum format (`sha256sum llmgw-{tag}-linux-* > {CHECKSUMS}`): "
           "one line per file, 64 hex digits, two spaces, the file name")
    prefix = f"llmgw-{tag}-linux-"
    where = f"{CHECKSUMS} of {tag}" + (f" ({source})" if source else "")
    found: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise ChecksumMismatchError(WHO, f"{where}, line {number}: {shown(line)} is not "
                                        "'<sha256> <file name>'", fix)
        digest, name = m[1].lower(), m[2]
        arch = name[len(prefix):]
        if not name.startswith(prefix) or not _ARCH.match(arch):
            continue  # another file of the release (a tarball, llmgw-<tag>-linux-amd64.sig, ...)
        if arch in found:
            raise ChecksumMismatchError(WHO, f"{where} lists {name} more than once (line {number})", fix)
        found[arch] = digest
    if not found:
        raise ChecksumMismatchError(WHO, f"{where} lists no {prefix}<arch> binary", fix)
    return found


# --------------------------------------------------------------------------- signatures


def allowed_signers_line(signing_key: str) -> str:
    """The ``ssh-keygen -Y verify`` allowed-signers line that lets ``signing_key`` sign releases, and only them."""
    return f'{NAMESPACE} namespaces="{NAMESPACE}" {signing_key}\n'


# --------------------------------------------------------------------------- pins


def digests_problem(value: object) -> tuple[str, str] | None:
    """Is ``value`` a mapping of architecture -> sha256 (64 lowercase hex digits)? (problem, fix) if not."""
    fix = "give each architecture's sha256 as `sha256sum` prints it, e.g. {amd64: 3f9c...(64 hex digits)}"
    if not isinstance(value, Mapping) or not value:
        return "is not a mapping of architecture to sha256", fix
    for arch, digest in value.items():
        if not isinstance(arch, str) or not _ARCH.match(arch):
            return f"{arch!r} is not an architecture (amd64, arm64, ...)", fix
        if not isinstance(digest, str) or not DIGEST.match(digest.lower()):
            return f"the {arch} digest is not 64 hex digits", fix
    return None


def pins_problem(value: object) -> tuple[str, str] | None:
    """agent.sha256 as the stack config may give it: architecture -> sha256 (pins of the same mapping's
    agent.version), and/or release tag -> {architecture -> sha256} (pins per version). (problem, fix) if not."""
    if not isinstance(value, Mapping) or not value:
        return digests_problem(value)
    arch_pins = {k: v for k, v in value.items() if not isinstance(v, Mapping)}
    if arch_pins:
        bad = digests_problem(arch_pins)
        if bad:
            return bad
    for tag, digests in value.items():
        if not isinstance(digests, Mapping):
            continue
        if not isinstance(tag, str) or not RELEASE_TAG.match(tag):
            return (f"{tag!r} is not a release tag vX.Y.Z",
                    "key each release's pins by its tag, e.g. {v1.4.2: {amd64: 3f9c...(64 hex digits)}}")
        bad = digests_problem(digests)
        if bad:
            return f"{tag}: {bad[0]}", bad[1]
    return None


def pins_for(given: object, tag: str, given_for: str | None) -> dict[str, str] | None:
    """The architecture -> sha256 pins that agent.sha256 as configured (``given``) holds for release ``tag``:
    its entry ``tag: {arch: sha256}``, else its own ``arch: sha256`` entries when they are for ``tag`` (they
    pin ``given_for``, the version of the mapping that holds them). None: no pin for ``tag``."""
    if not isinstance(given, Mapping):
        return None
    found = given.get(tag)
    if isinstance(found, Mapping) and found:
        return {str(a): str(d).lower() for a, d in found.items()}
    own = {str(a): str(d).lower() for a, d in given.items() if not isinstance(d, Mapping)}
    return own if own and tag == given_for else None


# --------------------------------------------------------------------------- how a release is verified


SIGNATURE, PIN, OPT_OUT, LOCAL_BUILD = "signature", "pin", "opt-out", "local build"
"""How a node's agent binary was verified, as AgentInstall records it (its ``verification`` input): checksums.txt
signed by agent.signingKey; the sha256 pinned in agent.sha256; a release trusted as the server sends it because
agent.allowUnverifiedRelease says so; a local build (agent.binary), copied as it is."""
VERIFICATIONS = (SIGNATURE, PIN, OPT_OUT, LOCAL_BUILD)
OPT_OUT_SETTING = "allowUnverifiedRelease"
"""The stack-config key of the opt-out (``agent.allowUnverifiedRelease: true``)."""
UNVERIFIED_WARNING = "installs an unverified release"
"""What the warning under each node that opted out says (the pull-request summary finds it by these words)."""


def verification(is_release: bool, signing_key: object, pins: object, allow_unverified: object) -> str | None:
    """How a binary is verified (one of VERIFICATIONS), from what the operator configured for it; None: a
    release that nothing verifies, which is refused. Pins come first: with them nothing is fetched to learn
    the digests (``llmgw_pulumi.releases.approval.approve``)."""
    if not is_release:
        return LOCAL_BUILD
    if pins:
        return PIN
    if signing_key:
        return SIGNATURE
    if allow_unverified is True:
        return OPT_OUT
    return None


def unverified_warning(node: str, tag: str) -> str:
    """The warning shown under ``node`` (and in the pull-request summary) when it installs ``tag`` unverified."""
    return (f"{node} {UNVERIFIED_WARNING}: llmgw {tag} is installed from checksums.txt as the release server "
            f"sends it, because agent.{OPT_OUT_SETTING} is true. Set agent.signingKey or pin agent.sha256 for "
            f"{tag}, then remove agent.{OPT_OUT_SETTING}")
