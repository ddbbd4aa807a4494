"""A host-key pin is accepted as an operator copies it, from a .pub file with its comment; one normalisation for all."""

from __future__ import annotations

import base64
import copy
import subprocess
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from llmgw_pulumi import validate
from llmgw_pulumi.config import stack_config
from llmgw_pulumi.config.specs import Connection
from llmgw_pulumi.config.stack_config import StackConfigError
from llmgw_pulumi.ssh import keys
from tests.unit.good_configs import GOOD


def openssh_public(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


ED25519 = openssh_public(ed25519.Ed25519PrivateKey.generate())
ECDSA = openssh_public(ec.generate_private_key(ec.SECP256R1()))
RSA = openssh_public(rsa.generate_private_key(public_exponent=65537, key_size=2048))
TYPE, BLOB = ED25519.split()


def with_pin(pin: str) -> dict:
    cfg = copy.deepcopy(GOOD)
    cfg["nodes"][0]["hostKey"] = pin
    return cfg


@pytest.mark.parametrize("pin", [
    f"{ED25519} root@gpu-01",
    f"{ED25519} root@gpu-01 (re-imaged 2024-05-01)",
    f"  {TYPE}   {BLOB}\troot@gpu-01\n",
    ED25519,
], ids=["pub file", "comment with spaces", "extra whitespace", "bare"])
def test_a_pub_file_line_is_pinned_as_type_and_key(pin: str) -> None:
    assert validate.host_key(pin) is None
    assert stack_config.parse(with_pin(pin)).nodes[0].connection.host_key == f"{TYPE} {BLOB}"


@pytest.mark.parametrize("key", [ECDSA, RSA], ids=["ecdsa", "rsa"])
def test_other_key_types_are_accepted(key: str) -> None:
    assert stack_config.parse(with_pin(f"{key} root@gpu-01")).nodes[0].connection.host_key == key


def ssh_blob(*strings: bytes) -> str:
    return base64.b64encode(b"".join(len(s).to_bytes(4, "big") + s for s in strings)).decode()


def test_the_providers_connection_normalises_the_same_way() -> None:
    conn = Connection.from_props({"host": "10.0.0.11", "host_key": f"{ED25519} root@gpu-01"}, "gpu-01")
    assert conn.host_key == f"{TYPE} {BLOB}"


@pytest.mark.parametrize("pin", [
    "AAAA-not-a-key",
    f"gpu-01 {ED25519}",                                   # a known_hosts line with its host
    f"ssh-rsa {BLOB}",                                     # the blob says ssh-ed25519
    f"{TYPE} {BLOB[:20]}",                                 # truncated: no longer base64 of a key
    f"{TYPE} {BLOB[:-4]}!!!=",                             # not base64
    f"{TYPE} " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed2551").decode(),  # type string cut short
    "ecdsa-sha2-nistp256 " + ssh_blob(b"ecdsa-sha2-nistp256", b"nistp384", b"\x04" + b"\x01" * 96),  # curve mismatch
    f"{TYPE} " + ssh_blob(TYPE.encode(), b"\x01" * 31),  # an ed25519 key is 32 bytes
    TYPE,
    "",
], ids=["garbage", "known_hosts with host", "type mismatch", "truncated", "not base64", "short type", "curve mismatch",
        "short ed25519", "type only", "empty"])
def test_anything_else_is_refused(pin: str) -> None:
    assert validate.host_key(pin) is not None
    with pytest.raises(StackConfigError) as err:
        stack_config.parse(with_pin(pin))
    assert [p[1:3] for p in err.value.problems] == [("hostKey", "is not an SSH public key")]


@pytest.mark.parametrize("make", [ed25519.Ed25519PrivateKey.generate, lambda: ec.generate_private_key(ec.SECP384R1()),
                                  lambda: rsa.generate_private_key(65537, 2048)], ids=["ed25519", "ecdsa", "rsa"])
def test_a_fingerprint_is_the_one_ssh_keygen_prints_with_or_without_the_comment(make: Any) -> None:
    line = openssh_public(make())
    printed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", "-"], input=f"{line} root@gpu-01\n",
                             capture_output=True, text=True, check=True).stdout.split()[1]
    assert printed.startswith("SHA256:")
    assert keys.fingerprint(line) == printed
    assert keys.fingerprint(f"{line} root@gpu-01 (a .pub line)") == printed
