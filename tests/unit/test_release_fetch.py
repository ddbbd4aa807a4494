"""The operator's side of a release, against real parts: downloads over real TLS from an in-process server on loopback
(its own CA, as agent.releaseCa names one), and signatures checked by ssh-keygen (the real one, or a stand-in on
PATH that answers as the test chooses: missing, failing, hanging, printing junk)."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.release_server import make_signing_key, publish_release
from llmgw_pulumi import errors
from llmgw_pulumi.releases import approval
from tests.unit.error_checks import assert_refused
from tests.unit.https_release_server import https_server

TAG = "v1.2.3"
BINARY = b"the release binary\n"
FETCH_FIX = ("check agent.releaseUrl and that this machine reaches it and trusts its certificate (agent.releaseCa for a "
             "private CA); no node was changed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(base URL, agent.releaseCa, the directory served) of an HTTPS release server on loopback serving TAG."""
    base = tmp_path_factory.mktemp("releases")
    root = base / "root"
    publish_release(root, TAG, {"amd64": BINARY, "arm64": b"arm"}, tamper={"arm64": b"tampered"})
    (root / "big").write_bytes(b"x" * 5000)
    with https_server(base, root) as (url, ca):
        yield url, ca, root


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- https


def test_https_get_reads_the_body_trusting_only_the_ca_given(server: tuple[str, str, Path]) -> None:
    url, ca, root = server
    assert approval.https_get(f"{url}/{TAG}/checksums.txt", ca) == (root / TAG / "checksums.txt").read_bytes()
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{url}/{TAG}/checksums.txt", None)  # the system's trust store does not know this CA
    assert str(err.value).startswith(f"llmgw: cannot download {url}/{TAG}/checksums.txt: ")
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) and str(err.value).endswith(f"\n  fix: {FETCH_FIX}")


def test_a_release_ca_that_cannot_be_read_is_named_with_its_setting(tmp_path: Path, server: tuple[str, str, Path]) -> None:
    url, _, _ = server
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{url}/{TAG}/checksums.txt", str(tmp_path / "missing.pem"))
    text = str(err.value)
    assert text.startswith(f"llmgw: agent.releaseCa: cannot read {tmp_path / 'missing.pem'}: ")
    assert text.endswith("\n  fix: point agent.releaseCa at the PEM bundle of the release server's CA")


def test_what_is_not_there_too_big_or_not_https_is_refused(server: tuple[str, str, Path]) -> None:
    url, ca, _ = server
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{url}/{TAG}/nothing-here", ca)
    assert str(err.value) == f"llmgw: cannot download {url}/{TAG}/nothing-here: HTTP 404\n  fix: {FETCH_FIX}"
    assert approval.https_get(f"{url}/big", ca, limit=5000) == b"x" * 5000
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{url}/big", ca, limit=4999)
    assert str(err.value) == f"llmgw: {url}/big is larger than 4999 bytes\n  fix: {FETCH_FIX}"
    plain = url.replace("https://", "http://")
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{plain}/big", ca)
    assert str(err.value) == f"llmgw: refusing to download {plain}/big: not https\n  fix: serve releases over https"


def test_a_redirect_is_followed_only_to_https(server: tuple[str, str, Path]) -> None:
    url, ca, _ = server
    for scheme in ("https", "HTTPS"):
        target = url.replace("https", scheme, 1) + "/big"
        assert approval.https_get(f"{url}/to/{target}", ca) == b"x" * 5000
    plain = url.replace("https://", "http://") + "/big"
    with pytest.raises(errors.ReleaseFetchError) as err:
        approval.https_get(f"{url}/to/{plain}", ca)
    assert str(err.value) == (f"llmgw: cannot download {url}/to/{plain}: "
                              f"{repr(f'redirected to {plain!r}, which is not https')}\n  fix: {FETCH_FIX}")


# --------------------------------------------------------------------------- fetch: operator


def test_fetch_operator_downloads_over_the_release_ca_into_a_private_cache(server: tuple[str, str, Path],
                                                                            tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url, ca, _ = server
    cache = tmp_path / "not" / "yet" / "there"
    # The download is written beside the cache, never in the temporary directory (then moved into place).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    umask = os.umask(0o022)
    try:
        assert approval.fetch_binary_file(approval.Release(url, TAG, ca_file=ca), "amd64", sha(BINARY), cache).read_bytes() == BINARY
    finally:
        os.umask(umask)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert sorted(p.name for p in cache.iterdir()) == sorted([sha(BINARY), f"{sha(BINARY)}.lock"])
    assert (cache / sha(BINARY)).read_bytes() == BINARY


def test_fetch_operator_leaves_nothing_behind_when_the_download_fails_or_does_not_match(
        server: tuple[str, str, Path], tmp_path: Path) -> None:
    url, ca, _ = server
    source = approval.Release(url, TAG, ca_file=ca)
    with pytest.raises(errors.ReleaseFetchError, match="HTTP 404"):
        approval.fetch_binary_file(source, "riscv64", "e" * 64, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["e" * 64 + ".lock"]
    with pytest.raises(errors.ChecksumMismatchError) as err:
        approval.fetch_binary_file(source, "arm64", sha(b"arm"), tmp_path)
    assert_refused(err.value, errors.ChecksumMismatchError, "llmgw")
    assert err.value.message == (
        f"{url}/{TAG}/llmgw-{TAG}-linux-arm64 has sha256 {sha(b'tampered')}, but {sha(b'arm')} was approved "
        "(from checksums.txt as the server sent it over https (no signingKey or sha256 pin)); nothing was pushed to "
        "any node")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["e" * 64 + ".lock", sha(b"arm") + ".lock"])


# --------------------------------------------------------------------------- ssh-keygen


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, str]:
    """(checksums.txt, its signature, the signing key's public line)."""
    base = tmp_path_factory.mktemp("signed")
    key, public = make_signing_key(base / "key")
    publish_release(base / "releases", TAG, {"amd64": BINARY}, sign_with=key)
    directory = base / "releases" / TAG
    return (directory / "checksums.txt").read_bytes(), (directory / "checksums.txt.sig").read_bytes(), public


def test_verifying_writes_nothing_where_pulumi_runs(signed: tuple[bytes, bytes, str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data, signature, public = signed
    monkeypatch.chdir(tmp_path)
    approval.verify_signature(data, signature, public, "checksums.txt")
    assert list(tmp_path.iterdir()) == []


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str | None) -> None:
    """PATH holds only an ssh-keygen that runs ``body`` (sh), or none at all."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if body is not None:
        (bin_dir / "ssh-keygen").write_text(body)
        (bin_dir / "ssh-keygen").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def verify_error(data: bytes, signature: bytes, public: str) -> errors.ReleaseSignatureError:
    """The refusal of ``signature``: a ReleaseSignatureError of the operator's side that shows a fix."""
    with pytest.raises(errors.ReleaseSignatureError) as err:
        approval.verify_signature(data, signature, public, "https://r.example/v1.2.3/checksums.txt")
    assert_refused(err.value, errors.ReleaseSignatureError, "llmgw")
    return err.value


def test_without_ssh_keygen_a_signature_is_an_error_saying_what_to_install(
        signed: tuple[bytes, bytes, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path, monkeypatch, None)
    assert str(verify_error(*signed)) == ("llmgw: cannot verify the signature of https://r.example/v1.2.3/checksums.txt: "
                                          "ssh-keygen is not installed here\n"
                                          "  fix: install openssh-client on the machine running Pulumi")


REFUSED = "the signature of https://r.example/v1.2.3/checksums.txt does not verify with agent.signingKey"


@pytest.mark.parametrize("body, said", [
    ("printf 'Could not verify\\n   signature.\\n' >&2; printf 'on stdout' ; exit 255\n",
     "'Could not verify signature. on stdout'"),
    ("exit 3\n", "'exit 3'"),
    ("printf 'bad \\377 byte' >&2; exit 1\n", "'bad \ufffd byte'"),
    ("printf '%0300d' 0 >&2; exit 1\n", repr("0" * 200 + "...")),
], ids=["words", "silent", "not utf-8", "long"])
def test_what_ssh_keygen_says_when_it_refuses_is_quoted_on_one_line(
        signed: tuple[bytes, bytes, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, said: str) -> None:
    _, _, public = signed
    stand_in(tmp_path, monkeypatch, "#!/bin/sh\n/bin/cat >/dev/null\n" + body)
    assert verify_error(*signed).message == f"{REFUSED} {approval.key_fingerprint(public)} (ssh-keygen: {said})"


def test_an_ssh_keygen_that_cannot_run_or_hangs_is_an_error(signed: tuple[bytes, bytes, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path, monkeypatch, "#!/nonexistent/interpreter\n")
    text = str(verify_error(*signed))
    assert text.startswith("llmgw: cannot run ssh-keygen to verify https://r.example/v1.2.3/checksums.txt: ")
    assert text.endswith("\n  fix: check that `ssh-keygen -Y verify` works on this machine")
    (tmp_path / "bin" / "ssh-keygen").write_text("#!/bin/sh\nexec /bin/sleep 600\n")
    monkeypatch.setattr(approval, "VERIFY_SECONDS", 0.5)
    text = str(verify_error(*signed))
    assert text.startswith("llmgw: cannot run ssh-keygen to verify https://r.example/v1.2.3/checksums.txt: ")
    assert "timed out after 0.5 seconds" in text


# --------------------------------------------------------------------------- what a refusal of checksums.txt or a pin says

CHECKSUMS_FIX = ("\n  fix: republish checksums.txt in sha256sum format (`sha256sum llmgw-v1.2.3-linux-* > checksums.txt`): "
                 "one line per file, 64 hex digits, two spaces, the file name")


def test_blank_lines_and_other_files_before_the_binaries_are_passed_over() -> None:
    text = f"\n{'c' * 64}  llmgw-{TAG}.tar.gz\n\n{'a' * 64}  llmgw-{TAG}-linux-amd64\n"
    assert approval.parse_checksums(text, TAG) == {"amd64": "a" * 64}


def test_a_bad_line_is_named_by_file_tag_source_and_number() -> None:
    with pytest.raises(errors.ChecksumMismatchError) as err:
        approval.parse_checksums(f"\n{'a' * 63}  llmgw-{TAG}-linux-amd64\n", TAG)
    assert str(err.value) == (f"llmgw: checksums.txt of {TAG}, line 2: '{'a' * 63}  llmgw-{TAG}-linux-amd64' is not "
                              f"'<sha256> <file name>'{CHECKSUMS_FIX}")
    with pytest.raises(errors.ChecksumMismatchError) as err:
        approval.parse_checksums("", TAG, "https://r.example/v1.2.3/checksums.txt")
    assert str(err.value) == (f"llmgw: checksums.txt of {TAG} (https://r.example/v1.2.3/checksums.txt) lists no "
                              f"llmgw-{TAG}-linux-<arch> binary{CHECKSUMS_FIX}")


PIN_FIX = "give each architecture's sha256 as `sha256sum` prints it, e.g. {amd64: 3f9c...(64 hex digits)}"


@pytest.mark.parametrize("pins, problem", [
    ({}, "is not a mapping of architecture to sha256"),
    (["a" * 64], "is not a mapping of architecture to sha256"),
    ({"AMD64": "a" * 64}, "'AMD64' is not an architecture (amd64, arm64, ...)"),
    ({5: "a" * 64}, "5 is not an architecture (amd64, arm64, ...)"),
    ({"amd64": "a" * 63}, "the amd64 digest is not 64 hex digits"),
    ({"amd64": None}, "the amd64 digest is not 64 hex digits"),
], ids=["empty", "list", "capitals", "number", "short", "none"])
def test_a_bad_pin_says_what_is_wrong_with_it(pins: object, problem: str) -> None:
    assert approval.digests_problem(pins) == (problem, PIN_FIX)
    assert approval.digests_problem({"amd64": "A" * 64, "arm64": "b" * 64}) is None


def test_a_release_is_streamed_to_disk_and_hashed_on_the_way(server: tuple[str, str, Path], tmp_path: Path) -> None:
    """16 MiB served over https on loopback: the file in the cache is the body, its digest is checked, and the
    Python heap never held more than a small part of it (tracemalloc's peak), downloading or reusing the cache."""
    import tracemalloc

    url, ca, root = server
    body = os.urandom(16 << 20)
    (root / TAG / f"llmgw-{TAG}-linux-huge").write_bytes(body)
    source = approval.Release(url, TAG, ca_file=ca)
    for attempt in ("download", "cache"):
        tracemalloc.start()
        try:
            path = approval.fetch_binary_file(source, "huge", sha(body), tmp_path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert path == tmp_path / sha(body) and path.read_bytes() == body, attempt
        assert peak < 4 << 20, (attempt, peak)
    del body
    # The control of the bound above: reading the file whole, as before, peaks past it.
    tracemalloc.start()
    try:
        assert approval.fetch_binary_file(source, "huge", sha(path.read_bytes()), tmp_path).read_bytes()
        assert tracemalloc.get_traced_memory()[1] >= 16 << 20
    finally:
        tracemalloc.stop()


def test_the_download_returns_the_digest_of_what_it_wrote(server: tuple[str, str, Path]) -> None:
    import io

    url, ca, root = server
    out = io.BytesIO()
    got = approval._download(f"{url}/{TAG}/checksums.txt", ca, out, 1 << 20, 30)
    assert out.getvalue() == (root / TAG / "checksums.txt").read_bytes()
    assert got == hashlib.sha256(out.getvalue()).hexdigest()
