"""The operator's SSH key as the transport loads it: ed25519, ECDSA and RSA; OpenSSH and PEM; protected or not.

Keys are made at run time with ssh-keygen (the tool operators use), so nothing key-shaped is in the repository.
"""

import subprocess
from pathlib import Path

import paramiko
import pytest

from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.ssh.keys import load_private_key

KINDS = [("ed25519", "RFC4716", paramiko.Ed25519Key), ("ecdsa", "PEM", paramiko.ECDSAKey),
         ("ecdsa", "RFC4716", paramiko.ECDSAKey), ("rsa", "PEM", paramiko.RSAKey), ("rsa", "RFC4716", paramiko.RSAKey)]


def keygen(tmp_path: Path, kind: str, fmt: str, passphrase: str = "") -> Path:
    path = tmp_path / f"id_{kind}_{fmt}"
    # RFC4716 is ssh-keygen's name for its own OpenSSH format (-m); PEM the traditional one. ed25519 has no PEM form.
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-m", fmt, "-N", passphrase, "-f", str(path)], check=True)
    return path


@pytest.mark.parametrize("kind,fmt,cls", KINDS, ids=[f"{k}-{f}" for k, f, _ in KINDS])
def test_each_key_type_and_format_loads_by_path_and_inline(tmp_path: Path, kind: str, fmt: str, cls: type) -> None:
    path = keygen(tmp_path, kind, fmt)
    by_path = load_private_key(Connection(host="h", user="u", private_key_path=str(path)), "gpu-01")
    inline = load_private_key(Connection(host="h", user="u", private_key=path.read_text()), "gpu-01")
    assert type(by_path) is cls and type(inline) is cls
    want = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout.split()[1]
    assert by_path.fingerprint == inline.fingerprint == want


@pytest.mark.parametrize("kind,fmt,cls", KINDS, ids=[f"{k}-{f}" for k, f, _ in KINDS])
def test_a_protected_key_needs_its_passphrase(tmp_path: Path, kind: str, fmt: str, cls: type) -> None:
    path = keygen(tmp_path, kind, fmt, passphrase="s3cret phrase")
    conn = Connection(host="h", user="u", private_key_path=str(path))
    with pytest.raises(ConfigError, match="protected by a passphrase, and none is configured") as missing:
        load_private_key(conn, "gpu-01")
    assert "llmgw:sshKeyPassphrase" in str(missing.value)
    with pytest.raises(ConfigError, match="cannot be decrypted with the configured passphrase") as wrong:
        load_private_key(Connection(host="h", user="u", private_key_path=str(path), passphrase="wrong"), "gpu-01")
    assert "wrong" not in str(wrong.value) and "s3cret" not in str(wrong.value)
    key = load_private_key(Connection(host="h", user="u", private_key_path=str(path), passphrase="s3cret phrase"), "gpu-01")
    assert type(key) is cls


def test_no_key_configured_is_none_and_garbage_is_refused_without_echo(tmp_path: Path) -> None:
    assert load_private_key(Connection(host="h", user="u"), "gpu-01") is None
    with pytest.raises(ConfigError, match="cannot be parsed") as bad:
        garbage = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nS3CRETBODY\n"  # PEM-shaped, built at run time
        load_private_key(Connection(host="h", user="u", private_key=garbage), "gpu-01")
    assert "S3CRETBODY" not in str(bad.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_private_key(Connection(host="h", user="u", private_key_path=str(tmp_path / "absent")), "gpu-01")
