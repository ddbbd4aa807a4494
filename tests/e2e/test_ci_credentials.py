"""The pull request's job of examples/ci, run for real with only what that job holds (docs/operations.md, "In CI").

The job gets read access to the state and nothing else: no passphrase, no SSH key, no ssh-agent, no CA key.
Here it runs as the workflow runs it (the base branch's examples/ci/preview.sh, in a checkout of the pull
request) in a mount namespace of its own, where the state backend is mounted read-only and the directory of
the operator's SSH key is empty: it must still write the summary and the policy pack's verdict, judged by the
base branch's rules, without a TCP connection to any node; and it can decrypt nothing the stack keeps secret.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import NEXT_RELEASE, RELEASE, REPO, stack_config

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

CI = REPO / "examples" / "ci"


def protected(stack: Any, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A job of the protected environment (`up`, the scheduled refresh): the stack's whole environment."""
    env = {**stack.env, "PATH": f"{REPO / '.venv' / 'bin'}:{stack.env['PATH']}"}
    return subprocess.run([str(CI / script), *args], cwd=stack.work_dir, env=env, capture_output=True, text=True)


def pull_request_job(stack: Any, cluster: Any, checkout: Path, *args: str,
                     command: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``command`` (default: the base branch's preview.sh with ``args``) in ``checkout`` as a pull request's job
    runs it: a fresh home, no passphrase, no agent socket, the state read-only, the operator's SSH key absent."""
    home = checkout.parent / "home"
    home.mkdir(exist_ok=True)
    keep = ("PATH", "PULUMI_HOME", "PULUMI_BACKEND_URL", "PULUMI_SKIP_UPDATE_CHECK",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "SSL_CERT_FILE", "LANG")
    env = {k: stack.env[k] for k in keep if k in stack.env}
    env.update({"HOME": str(home), "PATH": f"{REPO / '.venv' / 'bin'}:{env['PATH']}"})
    state = stack.env["PULUMI_BACKEND_URL"].removeprefix("file://")
    key_dir = Path(cluster.ssh_key_path).parent
    run = command or [str(CI / "preview.sh"), *args]
    script = ('set -e; mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; mount -t tmpfs none "$2"; '
              'shift 2; exec "$@"')
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "job", state,
                           str(key_dir), *run], cwd=checkout, env=env, capture_output=True, text=True, timeout=600)


def checkout_of(stack: Any, where: Path, config: dict[str, Any], policy: dict[str, Any] | None = None) -> Path:
    """A pull request's checkout: the project with the pull request's stack config (and its own policy file)."""
    shutil.copytree(stack.work_dir, where, symlinks=True, ignore=shutil.ignore_patterns("out", "review*"))
    path = where / "stacks" / f"Pulumi.{stack.name}.yaml"
    document = yaml.safe_load(path.read_text())
    document["config"] = {f"llmgw:{k}": v for k, v in config.items()}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    if policy is not None:
        (where / "stacks" / f"policy.{stack.name}.json").write_text(json.dumps(policy))
    return where


def test_a_pull_request_s_job_previews_with_read_access_to_the_state_alone(cluster, hosts, new_stack, tmp_path):
    fleet = hosts(3)
    config = stack_config(cluster, fleet, agent={"version": RELEASE, "releaseUrl": cluster.release_url,
                                                 "signingKey": cluster.release_signing_key})
    stack = new_stack(config)
    base = tmp_path / "base"
    base.mkdir()
    (base / "policy.json").write_text(json.dumps({"host-keys-pinned": {"enforcementLevel": "advisory"}}))
    first = protected(stack, "up.sh", stack.name, str(base / "policy.json"))
    assert first.returncode == 0, first.stdout + first.stderr
    assert cluster.control_plane.wait_for([h.hostname for h in fleet], timeout=30)

    # The pull request upgrades one node, and loosens the rules it would break: unsigned releases (the program
    # takes them only under the opt-out), and its own policy file disabling the rule. The base branch's rules
    # judge it.
    changed = json.loads(json.dumps(config))
    changed["nodes"][0]["agent"] = {"version": NEXT_RELEASE}
    changed["agent"].pop("signingKey")
    changed["agent"]["allowUnverifiedRelease"] = True
    checkout = checkout_of(stack, tmp_path / "pr", changed, {"release-verified": {"enforcementLevel": "disabled"}})
    opens = [h.passive_tcp_opens() for h in fleet]
    job = pull_request_job(stack, cluster, checkout, stack.name, "out", str(base / "policy.json"))
    assert [h.passive_tcp_opens() for h in fleet] == opens, "the pull request's job reached a node"

    assert job.returncode != 0, job.stdout + job.stderr  # a mandatory rule is violated
    summary = (checkout / "out" / "summary.md").read_text()
    print("\n" + summary)
    assert f"agent upgraded `{RELEASE}` → `{NEXT_RELEASE}`" in summary and fleet[0].hostname in summary
    assert "release-verified" in summary and "mandatory" in summary, summary
    assert "no mandatory rule is violated" not in summary

    # The same job on a change the rules allow: the summary and a passing verdict, still with no node reached.
    allowed = json.loads(json.dumps(config))
    allowed["nodes"][0]["agent"] = {"version": NEXT_RELEASE}
    shutil.rmtree(checkout)
    checkout = checkout_of(stack, tmp_path / "pr", allowed)
    job = pull_request_job(stack, cluster, checkout, stack.name, "out", str(base / "policy.json"))
    assert [h.passive_tcp_opens() for h in fleet] == opens, "the pull request's job reached a node"
    assert job.returncode == 0, job.stdout + job.stderr
    summary = (checkout / "out" / "summary.md").read_text()
    assert f"agent upgraded `{RELEASE}` → `{NEXT_RELEASE}`" in summary
    assert "**Policies: no mandatory rule is violated**" in summary, summary


def test_a_stack_that_keeps_a_secret_is_refused_by_the_pull_request_s_job_which_cannot_decrypt_it(
        cluster, hosts, new_stack, tmp_path):
    fleet = hosts(1)
    ca_pem = (Path(cluster.pki_dir) / "ca.pem").read_text()
    ca_key = (Path(cluster.pki_dir) / "ca-key.pem").read_text()
    config = stack_config(cluster, fleet, signer={"kind": "caKey", "ca": ca_pem})
    config.pop("pkiDir")
    stack = new_stack(config)
    stack.config_set("llmgw:caKey", ca_key, secret=True)
    assert stack.up().ok

    checkout = tmp_path / "pr"
    shutil.copytree(stack.work_dir, checkout, symlinks=True)
    job = pull_request_job(stack, cluster, checkout, stack.name, "out")
    assert job.returncode != 0
    assert "llmgw:caKey" in job.stderr and "holds a secret" in job.stderr, job.stderr
    # Nothing the job holds decrypts it: not the config file's salt, not the state's secrets manager.
    for command in (["pulumi", "config", "get", "llmgw:caKey", "--stack", stack.name],
                    ["pulumi", "stack", "export", "--show-secrets", "--stack", stack.name]):
        tried = pull_request_job(stack, cluster, checkout, command=[*command, "--non-interactive"])
        assert tried.returncode != 0, command
        assert "PRIVATE KEY" not in tried.stdout + tried.stderr
    body = ca_key.strip().splitlines()[1]
    assert body not in job.stdout + job.stderr
    assert all(body not in p.read_text(errors="replace") for p in (checkout / "out").iterdir() if p.is_file())
    assert os.access(cluster.ssh_key_path, os.R_OK)  # the key the job did not see is there outside its namespace
