"""The Node component from TypeScript and Go: examples/typescript-vm and examples/go-vm under the CLI, on lab VMs.

Each example is set up with the README's commands ("From TypeScript or Go"):
its dependencies (`npm ci` from the pinned lock; the Go modules from the
proxy, cached), `pulumi package add <this repository>`, which generates the
SDK (run by scripts/package-adds.sh, cached until one of its inputs changes;
each stack gets a copy), and the one setting, PULUMI_RUNTIME_VIRTUALENV. Each asserts what the
Python VM example asserts (tests/e2e/test_examples.py): the preview shows the
address unknown and the node's resources to create; one `up` boots and
onboards the node; a re-image re-onboards it in the same `up` without a
host-key refusal; `destroy` removes the node's files before the VM stops;
and each of the component's outputs is checked against the host.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cryptography import x509

import llmgw_pulumi
from lab.languages import VIRTUALENV, added_packages, dependencies, package_add
from tests.conftest import CACHE, RELEASE, ssh
from tests.e2e.vm_examples import (
    EXAMPLES,
    NODE_RESOURCES,
    assert_destroy_cleans_the_node_then_stops_the_vm,
    assert_the_old_machine_was_left_clean,
    host_keys,
    nspawn_running,
    preview_inputs,
    reimage_replaces_the_node,
    step_ops,
    vm_command_config,
    vm_index,
    vmctl,
)


@pytest.fixture(scope="session")
def language_deps() -> tuple[Path, Path]:
    return dependencies()


@pytest.fixture(scope="session")
def package_adds(language_deps: tuple[Path, Path]) -> dict[str, Path]:
    """Per language, what `pulumi package add <this repository>` left in the example's project (once a run)."""
    return added_packages()


def language_stack(new_stack: Any, lang: str, config: dict[str, Any], deps: tuple[Path, Path],
                   package_adds: dict[str, Path],
                   virtualenv: str | None = VIRTUALENV) -> Any:
    """A stack of examples/<lang>-vm set up with the README's commands, the language host on PATH."""
    stack = new_stack(config, project=EXAMPLES / f"{lang}-vm")
    if virtualenv is not None:
        stack.env["PULUMI_RUNTIME_VIRTUALENV"] = virtualenv
    stack.env["npm_config_cache"] = str(CACHE / "npm")
    stack.env["npm_config_prefer_offline"] = "true"
    stack.env["GOMODCACHE"] = str(CACHE / "go" / "mod")
    stack.env["GOCACHE"] = str(CACHE / "go" / "build")
    stack.env["GOFLAGS"] = "-mod=mod"
    package_add(stack, lang, package_adds)
    return stack


GO_PROGRAM = "bin/llmgw-go-vm"
"""Where the Go language host builds the Go example's program in the first run of
test_language_example_boots_onboards_reimages_and_destroys_in_order (``buildTarget``); the later runs run that
build as it is (``binary``), as a CI job with a build step does: the program does not change between them."""


def set_runtime_options(stack: Any, options: dict[str, str]) -> None:
    """Pulumi.yaml's ``runtime.options`` of the stack's project, as an operator would write them."""
    project = yaml.safe_load((stack.work_dir / "Pulumi.yaml").read_text())
    runtime = project["runtime"] if isinstance(project["runtime"], dict) else {"name": project["runtime"]}
    project["runtime"] = {**runtime, "options": options}
    (stack.work_dir / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))


def not_after_on(addr: str, cluster: Any) -> dt.datetime:
    rc, pem = ssh(SimpleNamespace(addr=addr), cluster, "cat /etc/llmgw/agent.pem")
    assert rc == 0, pem
    return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc


def check_outputs_against_the_host(stack: Any, addr: str, cluster: Any) -> dict[str, Any]:
    """Each output of the component, as the TypeScript or Go program exported it, is what is on the machine."""
    out = stack.outputs()
    assert out["address"] == addr
    assert out["hostname"] == ssh(SimpleNamespace(addr=addr), cluster, "hostname")[1].strip() == "vm-one"
    assert out["hostKey"] in host_keys(addr, cluster)
    assert dt.datetime.fromisoformat(out["certificateNotAfter"]) == not_after_on(addr, cluster)
    rc, version = ssh(SimpleNamespace(addr=addr), cluster, "/usr/local/bin/llmgw --version")
    assert rc == 0 and version.split()[-1] == out["agentVersion"] == RELEASE, version
    # Problems and inventory are EngineCheck's, which read them on the host: no GPUs on a lab VM, hence a problem.
    check = next(r["outputs"] for r in stack.export()["resources"] if r["type"].endswith(":EngineCheck"))
    assert out["inventory"] == check["inventory"] and out["inventory"].get("gpus", []) == []
    assert out["problems"] == check["problems"]
    rc, hcas = ssh(SimpleNamespace(addr=addr), cluster, "ls /sys/class/infiniband 2>/dev/null; true")
    assert sorted(out["inventory"].get("hcas") or []) == sorted(hcas.split())
    return out


@pytest.fixture
def vm(lab: Any) -> Iterator[tuple[int, str]]:
    index = vm_index()
    try:
        yield index, lab.addr(index)
    finally:
        vmctl(lab, "stop", index)


@pytest.mark.parametrize("lang", ["typescript", "go"])
def test_language_example_boots_onboards_reimages_and_destroys_in_order(lang, lab, cluster, new_stack, vm,
                                                                        language_deps, package_adds):
    index, addr = vm
    stack = language_stack(new_stack, lang, vm_command_config(lab, cluster, index, "debian-12-r1"), language_deps,
                           package_adds)
    program = stack.work_dir / GO_PROGRAM
    if lang == "go":
        set_runtime_options(stack, {"buildTarget": str(program)})

    # Preview: the program builds, the VM is not booted, its address unknown, the node's resources to create.
    preview = stack.preview(diff=True)
    assert preview.ok, preview.output
    if lang == "go":
        assert program.is_file(), f"the Go language host did not build {program}"
        set_runtime_options(stack, {"binary": str(program)})
    assert not nspawn_running(lab, index)
    node_ops = {k: v for k, v in step_ops(preview).items() if k.startswith("llmgw:") or "$llmgw:" in k}
    assert node_ops == {k: "create" for k in NODE_RESOURCES}, preview.output
    # The component's provider (this package, run by the Python language host) is the program's, like command's.
    assert step_ops(preview)[f"pulumi:providers:llmgw::default_{llmgw_pulumi.__version__.replace('.', '_')}"] == "create"
    assert step_ops(preview)["command:local:Command::vm"] == "create"
    assert preview_inputs(preview, "NodeIdentity")["connection"]["host"] == "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    assert re.search(r"^\s+address\s*: (output<string>|\[unknown\])$", preview.output, re.M), preview.output

    # One up boots the VM and onboards it.
    up = stack.up()
    assert up.ok, up.output
    assert "Traceback" not in up.output, up.output
    assert cluster.control_plane.wait_for({"gpu-vm1"}, timeout=15)
    out = check_outputs_against_the_host(stack, addr, cluster)
    first_keys = host_keys(addr, cluster)
    assert stack.preview(expect_no_changes=True).ok

    # Re-image: the VM is replaced (same address, new disk, new host keys), and the same up replaces the node's
    # resources with it: the component's replaceWith reached them.
    since = time.time()
    _, new_keys = reimage_replaces_the_node(stack, lab, cluster, index, first_keys)
    again = check_outputs_against_the_host(stack, addr, cluster)
    assert again["hostKey"] in new_keys and again["hostKey"] != out["hostKey"]
    assert cluster.control_plane.wait_for_event(
        lambda e: e.node_id == "gpu-vm1" and e.outcome == "accepted" and e.time > since, timeout=15)
    assert_the_old_machine_was_left_clean(lab, index, since)

    # Destroy: the node's files are gone while the VM still runs, then the VM stops.
    assert_destroy_cleans_the_node_then_stops_the_vm(stack, lab, index, addr)


BAD = {"servers": ["not a server"], "ssh": {"user": "deploy", "privateKeyPath": "/nonexistent/key", "wait": -1}}
"""Two bad values: what the stack config would refuse, with these fields and fixes."""


@pytest.mark.parametrize("lang", ["typescript", "go"])
def test_bad_values_from_a_language_get_the_stack_configs_error_list(lang, lab, cluster, new_stack, vm,
                                                                    language_deps, package_adds):
    index, addr = vm
    config = {**vm_command_config(lab, cluster, index, "debian-12-r1"), "servers": BAD["servers"],
              "ssh": BAD["ssh"]}
    stack = language_stack(new_stack, lang, config, language_deps, package_adds)
    preview = stack.preview()
    assert not preview.ok
    assert "Traceback" not in preview.output and 'File "' not in preview.output, preview.output
    assert "llmgw Node gpu-vm1 has 2 problems:" in preview.output, preview.output
    assert re.search(r"^ +node gpu-vm1: servers\[0\]: .*\n +fix: .*host:port", preview.output, re.M), preview.output
    assert re.search(r"^ +node gpu-vm1: ssh\.wait: -1 is out of range\n +fix: give 0 to 3600 seconds", preview.output, re.M), \
        preview.output
    assert not any(k.startswith("pulumi-python:dynamic") for k in step_ops(preview)), step_ops(preview)


def test_without_the_setting_the_dynamic_provider_python_is_named_with_its_fix(lab, cluster, new_stack, vm,
                                                                              language_deps, package_adds):
    index, addr = vm
    stack = language_stack(new_stack, "typescript", vm_command_config(lab, cluster, index, "debian-12-r1"),
                           language_deps, package_adds, virtualenv=None)
    stack.env.pop("PULUMI_RUNTIME_VIRTUALENV", None)
    stack.env["PULUMI_PYTHON_CMD"] = "/usr/bin/python3"  # a Python without this package (nor pulumi)
    preview = stack.preview()
    assert not preview.ok
    assert f"fix: export PULUMI_RUNTIME_VIRTUALENV={VIRTUALENV} (this package's virtualenv)" in preview.output, \
        preview.output
    assert "No module named" not in preview.output and "Traceback" not in preview.output, preview.output
    assert not nspawn_running(lab, index)
