"""Releases as the operator approves them: the sha256 each node's binary must have, decided on this machine.

A node never decides for itself what a release is. The operator's side (the
Pulumi program, once per `pulumi up`, never in a preview) learns the sha256 of
``llmgw-<tag>-linux-<arch>`` for every architecture, in one of three ways:

- ``agent.sha256`` pins them (``{amd64: ..., arm64: ...}``): nothing is fetched;
- ``agent.signingKey`` is an OpenSSH public key: ``<url>/<tag>/checksums.txt``
  and its detached signature ``checksums.txt.sig`` are fetched over https, and
  ``ssh-keygen -Y verify`` must accept the signature for that key in the
  namespace ``llmgw-release`` before a line of the file is read;
- neither: refused before any node is reached, unless
  ``agent.allowUnverifiedRelease: true`` says to fetch ``checksums.txt`` over
  https and trust it as the server sends it (a warning under each such node;
  only a signature or a pin makes the release the operator's).

The digests reach each node as an input of its AgentInstall; the node downloads
only the binary, checks its sha256 and that its ``--version`` reports the tag,
before anything is installed. With ``agent.fetch: operator`` the binary is
downloaded here instead (``fetch_binary_file``: once per architecture, into a cache
named by digest) and pushed to the node over SSH.

Why OpenSSH signatures: ``ssh-keygen`` is already on every machine that runs
this package (openssh-client), the key is a one-line ``ssh-ed25519 AAAA...``
that operators already handle, a signature is made with ``ssh-keygen -Y sign``
(or a hardware key through ssh-agent), and no library is added.

What a release is and what is accepted of it (its files' names, checksums.txt's format, the pins) is decided
in ``llmgw_pulumi.releases.policy``, which imports no I/O; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .. import child_env
from ..errors import ChecksumMismatchError, ReleaseFetchError, ReleaseSignatureError
from .policy import CHECKSUMS as CHECKSUMS
from .policy import DIGEST as DIGEST
from .policy import LOCAL_BUILD as LOCAL_BUILD
from .policy import NAMESPACE as NAMESPACE
from .policy import OPT_OUT_SETTING as OPT_OUT_SETTING
from .policy import SIGNATURE_SUFFIX as SIGNATURE_SUFFIX
from .policy import WHO as WHO
from .policy import Release as Release
from .policy import allowed_signers_line as allowed_signers_line
from .policy import binary_name as binary_name
from .policy import digests_problem as digests_problem
from .policy import key_fingerprint as key_fingerprint
from .policy import parse_checksums as parse_checksums
from .policy import shown as _shown
from .policy import verification as verification

STALL_SECONDS = 20.0
"""A release server that sends nothing for this long is given up on."""
MAX_CHECKSUMS_BYTES = 1 << 20
MAX_BINARY_BYTES = 2 << 30
CHECKSUMS_DEADLINE = 60.0
BINARY_DEADLINE = 600.0
VERIFY_SECONDS = 60.0
"""How long ``ssh-keygen -Y verify`` may take before it is given up on."""


# --------------------------------------------------------------------------- signatures


def verify_signature(data: bytes, signature: bytes, signing_key: str, what: str) -> None:
    """Raise ReleaseSignatureError unless ``signature`` is ``signing_key``'s OpenSSH signature of ``data``
    in the release namespace (``ssh-keygen -Y verify``)."""
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise ReleaseSignatureError(WHO, f"cannot verify the signature of {what}: ssh-keygen is not installed here",
                                    "install openssh-client on the machine running Pulumi")
    with tempfile.TemporaryDirectory(prefix="llmgw-verify-") as tmp:
        signers, sig = Path(tmp, "allowed_signers"), Path(tmp, "signature")
        signers.write_text(allowed_signers_line(signing_key))
        sig.write_bytes(signature)
        try:
            done = subprocess.run([keygen, "-Y", "verify", "-f", str(signers), "-I", NAMESPACE, "-n", NAMESPACE,
                                   "-s", str(sig)], input=data, capture_output=True, timeout=VERIFY_SECONDS,
                                  check=False, env=child_env.for_child())
        except (OSError, subprocess.SubprocessError) as exc:
            raise ReleaseSignatureError(WHO, f"cannot run ssh-keygen to verify {what}: {exc}",
                                        "check that `ssh-keygen -Y verify` works on this machine") from None
    if done.returncode != 0:
        said = " ".join((done.stderr + done.stdout).decode(errors="replace").split()) or f"exit {done.returncode}"
        raise ReleaseSignatureError(WHO, f"the signature of {what} does not verify with agent.signingKey "
                                    f"{key_fingerprint(signing_key)} (ssh-keygen: {_shown(said, 200)})")


# --------------------------------------------------------------------------- https


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to another https URL."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not newurl.lower().startswith("https://"):
            raise urllib.error.URLError(f"redirected to {_shown(newurl)}, which is not https")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener(ca_file: str | None) -> urllib.request.OpenerDirector:
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ReleaseFetchError(WHO, f"agent.releaseCa: cannot read {ca_file}: {exc}",
                                "point agent.releaseCa at the PEM bundle of the release server's CA") from None
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _HttpsOnly())


def _download(url: str, ca_file: str | None, out: IO[bytes], limit: int, deadline: float) -> str:
    """Stream ``url`` (https only) into ``out``, chunk by chunk, and return the sha256 (hex) of what was written,
    computed on the way: the body is never held whole in memory. ReleaseFetchError when it fails, stalls or is
    too big."""
    if not url.lower().startswith("https://"):
        raise ReleaseFetchError(WHO, f"refusing to download {url}: not https", "serve releases over https")
    fix = ("check agent.releaseUrl and that this machine reaches it and trusts its certificate "
           "(agent.releaseCa for a private CA); no node was changed")
    end = time.monotonic() + deadline
    size = 0
    digest = hashlib.sha256()
    try:
        with _opener(ca_file).open(url, timeout=STALL_SECONDS) as response:
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise ReleaseFetchError(WHO, f"{url} is larger than {limit} bytes", fix)
                if time.monotonic() > end:
                    raise ReleaseFetchError(WHO, f"cannot download {url}: not done after {deadline:g}s", fix)
                out.write(chunk)
                digest.update(chunk)
    except urllib.error.HTTPError as exc:
        raise ReleaseFetchError(WHO, f"cannot download {url}: HTTP {exc.code}", fix) from None
    except urllib.error.URLError as exc:
        raise ReleaseFetchError(WHO, f"cannot download {url}: {_shown(str(exc.reason), 200)}", fix) from None
    except (OSError, ssl.SSLError) as exc:
        raise ReleaseFetchError(WHO, f"cannot download {url}: {_shown(str(exc), 200)}", fix) from None
    return digest.hexdigest()


def https_get(url: str, ca_file: str | None, limit: int = MAX_CHECKSUMS_BYTES,
              deadline: float = CHECKSUMS_DEADLINE) -> bytes:
    """The body of ``url``, fetched over https (redirects too), at most ``limit`` bytes."""
    import io

    buffer = io.BytesIO()
    _download(url, ca_file, buffer, limit, deadline)
    return buffer.getvalue()


# --------------------------------------------------------------------------- approval


@functools.cache
def approve(release: Release) -> dict[str, str]:
    """arch -> the sha256 the operator approves for ``release`` (see the module's docstring); at most one fetch
    per release and process: the program runs once per `pulumi up`."""
    if release.pins:
        return dict(release.pins)
    sums_url = f"{release.base}/{CHECKSUMS}"
    data = https_get(sums_url, release.ca_file)
    if release.signing_key:
        signature = https_get(sums_url + SIGNATURE_SUFFIX, release.ca_file)
        verify_signature(data, signature, release.signing_key, sums_url)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ChecksumMismatchError(WHO, f"{sums_url} is not text", "republish checksums.txt") from None
    return parse_checksums(text, release.tag, sums_url)


# --------------------------------------------------------------------------- fetch: operator


def cache_dir() -> Path:
    """Where binaries downloaded here are kept, by sha256: ``$XDG_CACHE_HOME/llmgw-pulumi/releases``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmgw-pulumi" / "releases"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def file_sha256(path: Path) -> str | None:
    """The sha256 (hex) of the file at ``path``, read a chunk at a time; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def fetch_binary_file(release: Release, arch: str, digest: str, directory: Path | None = None) -> Path:
    """The file of ``release``'s binary for ``arch`` in the cache, once its sha256 is seen to be ``digest``.

    Downloaded here once per architecture (the provider processes share the
    cache, one download at a time per digest, under a lock), kept under its
    digest; streamed to disk and hashed on the way, never held whole in memory.
    What the cache holds is hashed again each time it is used, so a file put
    there by anything else is never pushed.
    """
    where = directory or cache_dir()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    cached = where / digest
    with _locked(where / f"{digest}.lock"):
        if file_sha256(cached) == digest:
            return cached
        url = f"{release.base}/{binary_name(release.tag, arch)}"
        with tempfile.NamedTemporaryFile(dir=where, prefix=f".{digest}.", delete=False) as out:
            try:
                got = _download(url, release.ca_file, out, MAX_BINARY_BYTES, BINARY_DEADLINE)
            except BaseException:
                os.unlink(out.name)
                raise
        if got != digest:
            os.unlink(out.name)
            raise ChecksumMismatchError(WHO, f"{url} has sha256 {got}, but {digest} was approved ({release.how}); "
                                        "nothing was pushed to any node")
        os.replace(out.name, cached)
        return cached


