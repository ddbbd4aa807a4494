"""What an operator types and reads: `pulumi config set`, and what `pulumi up` shows under each node's resources."""

import re
import shlex

import pytest
import yaml

from llmgw_pulumi.stack.shards import SHARDS_ENV
from tests.conftest import said, ssh, stack_config, up_when

pytestmark = [pytest.mark.hosts, pytest.mark.engine]


def diagnostics_section(output: str) -> dict[str, list[str]]:
    """The CLI's "Diagnostics:" section: resource heading -> the message lines printed under it."""
    found: dict[str, list[str]] = {}
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Diagnostics:"))
    heading = None
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break  # the next section (Outputs:, Resources:, ...)
        if re.match(r"^  \S", line):
            heading = line.strip().rstrip(":")
            found[heading] = []
        elif heading and line.strip():
            found[heading].append(line.strip())
    return found


def test_waits_and_warnings_are_shown_under_the_nodes_resources(cluster, hosts, new_stack):
    (h,) = hosts(1, start=False)
    node = h.hostname
    config = stack_config(cluster, [h], ssh={"user": "deploy", "privateKeyPath": str(cluster.ssh_key_path), "wait": 90},
                          nodes=[{"id": node, "address": h.addr, "engines": {"vllm": {"bin": "/opt/vllm/bin/vllm"}}}])
    up = up_when(new_stack(config), lambda events, _: said(events, "waiting up to 90s for ssh"), h.start)
    assert up.ok, up.output

    # The engine received each message with the URN of the resource it is about.
    by_urn: dict[str, list[str]] = {}
    debug_by_urn: dict[str, list[str]] = {}  # the SDK's own trace of registrations, and what an install does
    for d in up.diagnostics():
        (debug_by_urn if d.get("severity") == "debug" else by_urn).setdefault(d.get("urn", ""), []).append(d["message"])
    # The node is first reached by its ClientCertificate, which has it make its key pair.
    first = next(u for u in debug_by_urn if u.endswith(f"llmgw:ClientCertificate::{node}"))
    agent = next(u for u in debug_by_urn if u.endswith(f"llmgw:AgentInstall::{node}"))
    check = next(u for u in by_urn if u.endswith(f"llmgw:EngineCheck::{node}"))
    stack_urn = next(u for u in by_urn if "::pulumi:pulumi:Stack::" in u)
    assert any(f"{node}: waiting up to 90s for ssh to deploy@{h.addr}" in m for m in by_urn[stack_urn]), by_urn
    assert not any("waiting up to" in m for m in by_urn.get(first, [])), by_urn.get(first)
    answered = [d["message"] for d in up.diagnostics("debug") if d.get("urn", "").endswith(f"ClientCertificate::{node}")]
    assert any("answered after" in m for m in answered), answered  # a detail for --debug and the event log
    # Where the node gets the release from is a detail of its install: a debug diagnostic under its AgentInstall
    # (`--debug` shows it), not a line printed on every node's rows (the release is said once, under the stack).
    assert [m for m in debug_by_urn[agent] if "the node fetches llmgw v1.4.2" in m], debug_by_urn[agent]
    assert not [m for m in by_urn.get(agent, []) if "fetches llmgw" in m], by_urn.get(agent)
    assert any("vllm" in m and "/opt/vllm/bin/vllm" in m for m in by_urn[check]), by_urn[check]
    assert not [m for m in by_urn.get("", []) if node in m], "messages about the node that belong to no resource"

    # And the CLI prints them under the resource's heading, as the operator reads them.
    section = diagnostics_section(up.output)
    # The wait once, in the stack's row: ephemeral, so not again under Diagnostics; not in the node's row, which
    # the CLI prints again with its last message when the resource is created. When it answered: not printed.
    waits = [line for line in up.output.splitlines() if "waiting up to 90s for ssh" in line]
    assert len(waits) == 1 and "pulumi:pulumi:Stack " in waits[0], waits
    assert not any("waiting up to" in line for lines in section.values() for line in lines), section
    assert "answered after" not in up.output, up.output
    assert "fetches llmgw" not in up.output, up.output
    assert any(line.startswith("warning:") and "vllm" in line
               for line in section[f"pulumi-python:dynamic/llmgw:EngineCheck ({node})"])


def test_the_release_is_said_once_per_run_and_no_node_row_repeats_where_it_fetches_it(cluster, hosts, new_stack):
    fleet = hosts(3)
    stack = new_stack(stack_config(cluster, fleet))
    approval = f"llmgw v1.4.2 from {cluster.release_url}: the sha256 of amd64, arm64 approved from checksums.txt signed by SHA256:"
    up = stack.up()
    assert up.ok, up.output
    # The release and how its sha256 was approved: one line, in the stack's row (the CLI repeats a row's last
    # message whenever its status changes, and lists all but ephemeral messages again under Diagnostics).
    assert up.output.count(approval) == 1, up.output
    # Where each node gets it: no line per node (300 nodes would print 900); said once per node, in the event
    # log and with `--debug`, under its AgentInstall when its install begins.
    assert "fetches llmgw" not in up.output, up.output
    fetches = [d["urn"].split("::")[-1] for d in up.diagnostics("debug")
               if "AgentInstall::" in d.get("urn", "") and "the node fetches llmgw v1.4.2" in d["message"]]
    assert sorted(fetches) == sorted(h.hostname for h in fleet), fetches
    # A run that changes nothing says the approval once too, and fetches nothing.
    again = stack.up()
    assert again.ok, again.output
    assert again.output.count(approval) == 1 and "fetches llmgw" not in again.output, again.output
    assert not [d for d in again.diagnostics() if "fetches llmgw" in d["message"]]


def test_config_set_with_path_and_secret_as_an_operator_types_it(cluster, hosts, new_stack):
    (h,) = hosts(1)
    config = stack_config(cluster, [h])
    del config["ssh"]["privateKeyPath"]
    config["nodes"] = []
    stack = new_stack(config)
    # The SSH key as a secret from standard input, the node by path.
    stack.config_set("llmgw:sshPrivateKey", cluster.ssh_key_path.read_text(), secret=True)
    stack.config_set("llmgw:nodes[0].id", h.hostname, path=True)
    stack.config_set("llmgw:nodes[0].address", h.addr, path=True)
    stored = stack.config_path.read_text()
    assert "secure:" in stored and "PRIVATE KEY" not in stored

    up = stack.up()
    assert up.ok, up.output
    assert ssh(h, cluster, "systemctl is-active llmgw-agent")[1].strip() == "active"
    assert cluster.control_plane.wait_for({h.hostname}, timeout=15)

    # A refresh that finds drift records the node's side in the stored inputs: the SSH key in them stays a secret.
    assert ssh(h, cluster, "sudo chmod 0644 /etc/llmgw/agent-key.pem && "
                           "echo 'mgmt_addr: 192.0.2.9' | sudo tee -a /etc/llmgw/agent.yaml")[0] == 0
    refresh = stack.refresh()
    assert refresh.ok, refresh.output
    exported = stack.export_raw()
    assert "192.0.2.9" in exported  # the drift was recorded ...
    key_lines = [line for line in cluster.ssh_key_path.read_text().splitlines() if len(line) > 40]
    at_rest = "\n".join(p.read_text(errors="replace") for p in stack.state_files())
    assert key_lines and not [line for line in key_lines if line in exported or line in at_rest], \
        "the SSH key is in plaintext in state"  # ... and the key was not


def test_a_config_error_is_shown_once_with_its_fix_and_no_traceback(cluster, new_stack):
    # No node is reached: each error stops the program before it registers anything that connects.
    config = stack_config(cluster, [], nodes=[{"id": "gpu-x", "address": "127.0.0.1"}])
    stack = new_stack({**config, "sever": [cluster.control_plane.address]})
    refused = stack.up()
    assert not refused.ok
    # Read from the stack config: logged by the program, which then tells the language host it has shown it
    # (program.LANGUAGE_HOST_SHOWN_EXIT), so the host adds no error of its own.
    errors = [d["message"] for d in refused.diagnostics("error")]
    assert len(errors) == 1 and errors[0].startswith("stack config has 1 problem:"), errors
    assert "sever: is not a setting" in errors[0] and "fix: did you mean servers?" in errors[0], errors
    assert "Traceback" not in errors[0], errors

    # Met while the program registers the nodes (each Node picks its provider process from the environment):
    # the language host prints it as a pulumi.RunError, its message alone, never the program's frames.
    stack.set_config(config)
    stack.env[SHARDS_ENV] = "four"
    refused = stack.preview()
    assert not refused.ok
    errors = [d["message"] for d in refused.diagnostics("error")]
    shown = [m for m in errors if SHARDS_ENV in m]
    assert len(shown) == 1 and "fix: set the environment variable" in shown[0], errors
    assert not any("Traceback" in m or "unhandled exception" in m for m in errors), errors


PROBLEM = re.compile(r"^  (llmgw|node \S+): (\S+): (.*)\n    fix: (.*)$", re.MULTILINE)
"""One entry of the stack config's list of problems: where, field, problem, fix."""


def test_the_fix_of_a_wrong_type_is_a_command_that_fixes_it(cluster, new_stack):
    # No node is reached: the config errors stop the program before it registers anything.
    config = stack_config(cluster, [], nodes=[{"id": "gpu-x", "address": "127.0.0.1",
                                               "fabric": {"name": "ib-east", "hcas": ["mlx5_0"]}}])
    stack = new_stack(config)
    # As an operator types them: a plain string where a list belongs, at the top and nested, and a namespace typo.
    stack.config_set("llmgw:servers", cluster.control_plane.address)
    stack.config_set("llmgw:nodes[0].fabric.hcas", "mlx5_0", path=True)
    stack.config_set("llmwg:rollout", "fast")
    refused = stack.preview()
    assert not refused.ok
    (error,) = [d["message"] for d in refused.diagnostics("error")]
    found = {field: (where, problem, fix) for where, field, problem, fix in PROBLEM.findall(error)}
    assert set(found) == {"servers", "fabric.hcas", "llmwg:rollout"}, error  # every mistake, in one run
    assert found["servers"][1].startswith("is a string") and found["fabric.hcas"][0] == "node gpu-x", error
    assert "did you mean llmgw:rollout?" in found["llmwg:rollout"][2], error

    # Each command of the two fixes, run as printed, sets the value right.
    commands = [c for field in ("servers", "fabric.hcas") for c in re.findall(r"`(pulumi config [^`]*)`", found[field][2])]
    assert len(commands) == 3, commands  # servers: set; hcas: rm, then set
    for command in commands:
        stack.cli(*shlex.split(command)[1:], "--stack", stack.name)
    stack.cli("config", "rm", "llmwg:rollout", "--stack", stack.name)
    stored = yaml.safe_load(stack.config_path.read_text())["config"]
    assert stored["llmgw:servers"] == [cluster.control_plane.address]
    assert stored["llmgw:nodes"][0]["fabric"]["hcas"] == ["mlx5_0"]
    fixed = stack.preview()
    assert fixed.ok, fixed.output
