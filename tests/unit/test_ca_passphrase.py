"""The CA key's passphrase: read from stack config only as a secret, and handed to ClientCertificate as a secret input.

Under the SDK's mock monitor, as tests/unit/test_node.py: what the engine would be asked to register is
recorded, and the passphrase must arrive there wrapped as a secret and be listed among the secret outputs.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
from google.protobuf import json_format

from llmgw_pulumi.config import stack_config
from llmgw_pulumi.errors import ConfigError
from llmgw_pulumi.stack import program
from tests.unit import Mocks
from tests.unit.mock_monitor import RecordingMonitor

PASSPHRASE = "correct horse battery staple"
SECRET_SIG = "4dabf18193072939515e22adb298388d"
"""The key of Pulumi's secret wrapper in a registered resource's inputs (its value is a fixed signature)."""
STACK = {
    "llmgw:pkiDir": "/srv/llmgw/pki",
    "llmgw:servers": json.dumps(["cp1.example.net:7443"]),
    "llmgw:agent": json.dumps({"version": "v1.4.2", "releaseUrl": "https://releases.example.net/llmgw",
                                "sha256": {"amd64": "ab" * 32}}),
    "llmgw:sshPrivateKey": "the SSH key's text",
    "llmgw:nodes": json.dumps([{"id": "gpu-01", "address": "10.0.0.11"}]),
}


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    (tmp_path / "ca.pem").write_text("not read in these tests")
    monkeypatch.setitem(STACK, "llmgw:pkiDir", str(tmp_path))  # `up` reads its ca.pem before any node
    m = RecordingMonitor()
    pulumi.runtime.set_mocks(Mocks(), preview=False, monitor=m)
    yield m
    pulumi.runtime.set_all_config({}, [])


def certificate_request(monitor: Any) -> Any:
    (request,) = monitor.of_type("pulumi-python:dynamic/llmgw:ClientCertificate")
    return request


@pulumi.runtime.test
def test_the_passphrase_reaches_client_certificate_as_a_secret(monitor: Any) -> Any:
    pulumi.runtime.set_all_config({**STACK, "llmgw:caKeyPassphrase": PASSPHRASE},
                                  ["llmgw:sshPrivateKey", "llmgw:caKeyPassphrase"])
    nodes = program.main()

    def check(_: Any) -> None:
        request = certificate_request(monitor)
        given = json_format.MessageToDict(request.object)["ca_key_passphrase"]
        assert given == {SECRET_SIG: "1b47061264138c4ac30d75fd1eb44270", "value": PASSPHRASE}
        assert "ca_key_passphrase" in request.additionalSecretOutputs and "key_pem" in request.additionalSecretOutputs
        # No other resource of the node is given it.
        others = [r for r in monitor.requests if r is not request and "ca_key_passphrase" in json_format.MessageToDict(r.object)]
        assert others == []

    return nodes["gpu-01"].engine_check.urn.apply(check)


@pulumi.runtime.test
def test_without_a_passphrase_the_input_is_absent_as_before(monitor: Any) -> Any:
    # A stack written before the setting existed has no such input: absent compares equal to absent.
    pulumi.runtime.set_all_config(STACK, ["llmgw:sshPrivateKey"])
    nodes = program.main()

    def check(_: Any) -> None:
        assert "ca_key_passphrase" not in json_format.MessageToDict(certificate_request(monitor).object)

    return nodes["gpu-01"].engine_check.urn.apply(check)


PLAIN = {"caKeyPassphrase": PASSPHRASE, "sshKeyPassphrase": PASSPHRASE, "caKey": "the CA key's text",
         "sshPrivateKey": STACK["llmgw:sshPrivateKey"]}
"""A value for each of stack_config.SECRET_KEYS, as an operator might set it without --secret."""


def test_every_secret_setting_has_a_plain_text_case() -> None:
    assert set(PLAIN) == set(stack_config.SECRET_KEYS)


@pytest.mark.parametrize("key", PLAIN)
def test_a_secret_setting_in_plain_text_is_refused_unread(monitor: Any, key: str) -> None:
    secrets = [f"llmgw:{k}" for k in ("sshPrivateKey",) if k != key]
    config = {**STACK, f"llmgw:{key}": PLAIN[key]}
    if key == "caKey":
        config["llmgw:signer"] = json.dumps({"kind": "caKey", "ca": "-----BEGIN CERTIFICATE-----\nX\n"})
    pulumi.runtime.set_all_config(config, secrets)
    with pytest.raises(ConfigError) as err:
        program.resolve()
    assert err.value.field == key
    assert f"pulumi config set --secret llmgw:{key}" in err.value.fix
    assert PLAIN[key] not in str(err.value)
    assert monitor.requests == []


def test_the_same_settings_held_as_secrets_are_read(monitor: Any) -> None:
    """The positive control: each of them, set with --secret, is read and not refused."""
    pulumi.runtime.set_all_config({**STACK, "llmgw:caKeyPassphrase": PASSPHRASE, "llmgw:sshKeyPassphrase": PASSPHRASE},
                                  ["llmgw:sshPrivateKey", "llmgw:caKeyPassphrase", "llmgw:sshKeyPassphrase"])
    registration = program.resolve()
    assert {"private_key", "passphrase"} <= set(registration.credentials)
    assert registration.ca_key_passphrase is not None


@pulumi.runtime.test
def test_a_program_passing_plain_text_still_registers_a_secret(monitor: Any) -> Any:
    from llmgw_pulumi import Node
    from tests.unit.mock_monitor import node_args

    args = node_args("gpu-01")
    args.ca_key_passphrase = PASSPHRASE
    node = Node("gpu-01", args)

    def check(_: Any) -> None:
        given = json_format.MessageToDict(certificate_request(monitor).object)["ca_key_passphrase"]
        assert given == {SECRET_SIG: "1b47061264138c4ac30d75fd1eb44270", "value": PASSPHRASE}

    return node.engine_check.urn.apply(check)
