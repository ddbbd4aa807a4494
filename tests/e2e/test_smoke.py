"""Smoke test: one node onboarded by `pulumi up` under the real engine, then a no-change preview, then destroy."""

import pytest

from tests.conftest import resource_count, ssh, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]


def test_up_preview_destroy_one_node(cluster, hosts, new_stack):
    (host,) = hosts(1)
    stack = new_stack(stack_config(cluster, [host]))

    up = stack.up()
    assert up.ok, up.output
    assert up.result.summary.resource_changes == {"create": resource_count([host.hostname])}, up.output
    assert stack.outputs()[host.hostname]["hostname"] == host.hostname
    assert host.stat("/etc/llmgw/agent-key.pem").st_mode & 0o777 == 0o600
    assert ssh(host, cluster, "systemctl is-active llmgw-agent")[1].strip() == "active"

    preview = stack.preview(expect_no_changes=True)
    assert preview.ok, preview.output

    down = stack.destroy()
    assert down.ok, down.output
    for path in ("/etc/llmgw/agent-key.pem", "/usr/local/bin/llmgw", "/etc/systemd/system/llmgw-agent.service"):
        assert host.read_file(path) is None, f"{path} left behind by destroy"
