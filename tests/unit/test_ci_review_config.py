"""python -m llmgw_pulumi.preview.ci review-config: the stack config a pull request's preview reads (examples/ci)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmgw_pulumi.preview import ci

SALT = "v1:ArfQ3k9KlII=:v1:3zs7oNexI9Lq5Mq7:Iserj2kan4FcYQjfmX/8Vk13IIfWww=="
PLAIN = {"llmgw:servers": ["cp1:7443"], "llmgw:nodes": [{"id": "gpu-01", "address": "10.0.0.1"}]}


def test_the_passphrase_s_salt_is_left_out_and_every_setting_kept():
    text = yaml.safe_dump({"config": PLAIN, "encryptionsalt": SALT})
    out = yaml.safe_load(ci.review_config(text, "stacks/Pulumi.prod.yaml"))
    assert out == {"config": PLAIN}


@pytest.mark.parametrize("secret, named", [
    ({"llmgw:caKey": {"secure": "v1:abc"}}, ["llmgw:caKey"]),
    ({"llmgw:ssh": {"user": "deploy", "passphrase": {"secure": "v1:abc"}}}, ["llmgw:ssh"]),
    ({"llmgw:keys": [{"secure": "v1:a"}], "llmgw:sshKeyPassphrase": {"secure": "v1:b"}}, ["llmgw:keys", "llmgw:sshKeyPassphrase"]),
])
def test_a_config_that_holds_a_secret_is_refused_naming_each_key(secret, named):
    text = yaml.safe_dump({"config": {**PLAIN, **secret}, "encryptionsalt": SALT})
    with pytest.raises(ci.ReviewConfigError) as err:
        ci.review_config(text, "stacks/Pulumi.prod.yaml")
    message = str(err.value)
    assert message.startswith("stacks/Pulumi.prod.yaml: " + ", ".join(named))
    assert "llmgw:servers" not in message and "v1:" not in message  # names the keys, never a ciphertext
    assert 'docs/operations.md, "In CI"' in message  # and where the fix is


def test_a_mapping_with_other_keys_beside_secure_is_plain_data():
    config = {**PLAIN, "llmgw:labels": {"secure": "no", "rack": "a"}}
    assert yaml.safe_load(ci.review_config(yaml.safe_dump({"config": config}), "f"))["config"] == config


@pytest.mark.parametrize("key", ["encryptedkey", "secretsprovider"])
def test_another_secrets_provider_is_refused(key):
    with pytest.raises(ci.ReviewConfigError, match=key):
        ci.review_config(yaml.safe_dump({"config": PLAIN, key: "awskms://alias/x"}), "f")


def test_the_config_file_is_found_where_the_project_keeps_it_and_written(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: llmgw\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": PLAIN, "encryptionsalt": SALT}))
    monkeypatch.chdir(tmp_path)
    assert ci.stack_config_file(tmp_path, "org/llmgw/prod") == tmp_path / "stacks" / "Pulumi.prod.yaml"
    assert ci.main(["review-config", "prod", str(tmp_path / "out.yaml")]) == 0
    assert "encryptionsalt" not in (tmp_path / "out.yaml").read_text()
    assert ci.main(["review-config", "staging", str(tmp_path / "out.yaml")]) == 2
    assert "cannot read the config of stack staging" in capsys.readouterr().err
