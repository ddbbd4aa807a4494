"""Security properties, each asserted on real hosts under the real engine.

- The node's private key is never readable by another user on the node, at
  any instant: an unprivileged user reads everything it can in the places
  the key passes through while the identity is installed and renewed, and
  afterwards no copy of any node key is left on the host but agent-key.pem.
- Every remote command takes its variable parts as quoted arguments.
- A release without a checksum line for the node's binary is refused.
- No private key ends up where it does not belong: the CA key never leaves
  the machine running Pulumi (not in state, not in output, not on the node);
  node keys and the SSH key are never in state or output in plaintext.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml

from lab.doubles.llmgw import build_llmgw
from lab.release_server import publish_release, release_name
from tests.conftest import TAMPERED_RELEASE, ssh, stack_config, wait_until
from tests.e2e.node_checks import BINARY, CONFIG, UNIT, leftovers, report

pytestmark = [pytest.mark.hosts, pytest.mark.engine]

KEY_PATH = "/etc/llmgw/agent-key.pem"
PENDING_KEY_PATH = "/etc/llmgw/agent-key.pending.pem"
# Renewal is due 3.6 s after issue: every `pulumi up` after the first renews the identity.
RENEW_EVERY_UP = {"validityHours": 1, "renewBeforeHours": 0.999}


def run_as(host: Any, cluster: Any, user: str, command: str, stdin: bytes = b"", timeout: float = 600) -> tuple[int, str]:
    """Run a command on a host as `user` over SSH, feeding `stdin`; no output deadline below `timeout`."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host.addr, username=user, key_filename=str(cluster.ssh_key_path), timeout=10,
                   allow_agent=False, look_for_keys=False)
    try:
        chan = client.get_transport().open_session()
        chan.settimeout(timeout)
        chan.exec_command(command)
        chan.sendall(stdin)
        chan.shutdown_write()
        out = b""
        while chunk := chan.recv(65536):
            out += chunk
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        return chan.recv_exit_status(), (out + err).decode(errors="replace")
    finally:
        client.close()


def pem_body_lines(pem: bytes | str) -> list[str]:
    """The base64 lines of a PEM (every one long enough to be unmistakable)."""
    text = pem.decode() if isinstance(pem, bytes) else pem
    return [line for line in text.splitlines() if line and not line.startswith("-----") and len(line) >= 16]


def files_under(root: Path) -> list[Path]:
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def holding(paths: list[Path], needles: list[str]) -> dict[str, list[int]]:
    """path -> indices of the needles found in it."""
    found: dict[str, list[int]] = {}
    encoded = [n.encode() for n in needles]
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        hits = [i for i, n in enumerate(encoded) if n in data]
        if hits:
            found[str(p)] = hits
    return found


# --------------------------------------------------------------------------- the node key, at every instant

# Runs on the node as an unprivileged user: reads every file it can under the
# given dirs, in a loop, until the stop file appears; reports what it got. The first dir (where the identity
# is written, through temporary files that live for milliseconds) is scanned tightly between full walks, so
# every temporary file there is tried while it exists. "tried": opened, or refused with EACCES.
WATCHER = r"""
import json, os, sys
stop = sys.argv[1]
roots = sys.argv[2:]
loops, seen, tried, denied, leaks = 0, set(), set(), set(), {}

def attempt(p):
    seen.add(p)
    try:
        with open(p, "rb") as f:
            data = f.read(1 << 20)
    except PermissionError:
        denied.add(p)
        tried.add(p)
        return
    except OSError:
        return
    tried.add(p)
    if b"PRIVATE KEY" in data:
        leaks[p] = data.decode(errors="replace")[:4096]

open(stop + ".started", "w").close()
while not os.path.exists(stop):
    loops += 1
    for _ in range(2000):
        try:
            names = os.listdir(roots[0])
        except OSError:
            names = []
        for name in names:
            if (".llmgw-new." in name or ".pending." in name) and os.path.join(roots[0], name) not in tried:
                attempt(os.path.join(roots[0], name))
    for root in roots:
        for dirpath, dirs, files in os.walk(root, onerror=lambda e: denied.add(e.filename)):
            for name in files:
                attempt(os.path.join(dirpath, name))
print(json.dumps({"loops": loops, "seen": sorted(seen), "tried": sorted(tried), "denied": sorted(denied),
                  "leaks": leaks}))
"""
WATCHED = ("/etc/llmgw", "/tmp", "/var/tmp", "/usr/local/share/ca-certificates", "/root")
STOP = "/tmp/llmgw-watch.stop"
DECOY = "/var/tmp/llmgw-decoy-key.pem"


class Watcher(threading.Thread):
    def __init__(self, host: Any, cluster: Any, user: str = "nosudo") -> None:
        super().__init__(daemon=True)
        self.host, self.cluster, self.user = host, cluster, user
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            rc, out = run_as(self.host, self.cluster, self.user, f"python3 - {STOP} {' '.join(WATCHED)}", WATCHER.encode())
            assert rc == 0, out
            self.result = json.loads(out.strip().splitlines()[-1])
        except BaseException as exc:
            self.error = exc

    def started(self) -> bool:
        return run_as(self.host, self.cluster, self.user, f"test -e {STOP}.started")[0] == 0

    def stop(self) -> dict[str, Any]:
        run_as(self.host, self.cluster, self.user, f"touch {STOP}")
        self.join(60)
        assert self.error is None, repr(self.error)
        assert self.result is not None
        return self.result


def test_the_node_key_is_never_readable_by_another_user(cluster, hosts, new_stack):
    t0 = time.monotonic()
    (h,) = hosts(1)
    stack = new_stack(stack_config(cluster, [h], certificate=RENEW_EVERY_UP))
    watcher = Watcher(h, cluster)
    watcher.start()
    deadline = time.monotonic() + 20
    while not watcher.started():
        assert time.monotonic() < deadline and watcher.is_alive(), watcher.error
        time.sleep(0.2)
    # Proof that the watcher sees a readable key when there is one: a decoy, briefly.
    # (Its text is assembled on the node: sudo logs command lines, and the journal is checked below.)
    rc, out = ssh(h, cluster, f"sudo sh -c 'umask 022; printf -- \"-----BEGIN %s KEY-----\\ndecoy\\n\" PRIVATE > {DECOY}'; "
                              f"sleep 1.5; sudo rm -f {DECOY}")
    assert rc == 0, out

    first = stack.up()                    # the identity is installed
    assert first.ok, first.output
    key1 = h.read_file(KEY_PATH)
    renewal = stack.up()                  # and renewed: a new key replaces it, the agent restarts
    assert renewal.ok, renewal.output
    key2 = h.read_file(KEY_PATH)
    result = watcher.stop()

    assert key1 and key2 and key1 != key2, "the identity was not renewed"
    # Issued again in place, for the machine whose host key is recorded.
    steps = "\n".join(line for line in renewal.output.splitlines() if "ClientCertificate node" in line)
    assert "updated" in steps and "inside its renewal window" in renewal.output, renewal.output
    assert list(result["leaks"]) == [DECOY], {p: v[:80] for p, v in result["leaks"].items()}
    assert KEY_PATH in result["denied"], "the watcher never tried the key file"
    # The key's files on their way (the certificate's and the CA's are public, and may be readable): the node
    # makes the pair in a temporary file next to the pending key, which NodeIdentity renames over the key.
    temps = [p for p in result["tried"] if p.startswith((KEY_PATH + ".llmgw-new.", PENDING_KEY_PATH))]
    assert temps, "the watcher tried no temporary file of the key: it cannot tell whether one was readable"
    assert [p for p in temps if p not in result["denied"]] == [], "a temporary file of the key was readable"

    # Afterwards: the only copy of any node key on the host is agent-key.pem, 0600 root, holding the new key.
    st = h.stat(KEY_PATH)
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, 0, 0)
    needles = pem_body_lines(key1) + pem_body_lines(key2) + ["BEGIN PRIVATE KEY", "BEGIN EC PRIVATE KEY"]
    found = holding(files_under(h.upper), needles)
    assert list(found) == [str(h.upper / KEY_PATH.lstrip("/"))], found
    assert not set(found[str(h.upper / KEY_PATH.lstrip("/"))]) & set(range(len(pem_body_lines(key1)))), \
        "the old key is still in agent-key.pem"
    assert journal_lines_naming_a_private_key(h, cluster) == [], "key material in the journal"
    report("security-node-key-unreadable", watcher_loops=result["loops"], temp_files_seen=len(temps),
           files_seen=len(result["seen"]), seconds=round(time.monotonic() - t0, 1))


def journal_lines_naming_a_private_key(host: Any, cluster: Any) -> list[str]:
    """The node's journal lines that say PRIVATE KEY. A probe line saying it too is logged first, and must be seen:
    the check reads the journal that the node's services write to. (The words are put together on the node, so
    that no command line holds them.)"""
    tag = f"llmgw-journal-probe-{secrets.token_hex(4)}"
    rc, out = ssh(host, cluster, f"printf '%s %s%s\\n' {tag} PRIV 'ATE KEY' | systemd-cat -t {tag}")
    assert rc == 0, out

    def journal() -> list[str]:
        rc, out = ssh(host, cluster, "sudo journalctl --no-pager -o cat")
        assert rc == 0, out
        return out.splitlines()

    assert wait_until(lambda: f"{tag} PRIVATE KEY" in journal(), 15), "the probe line never showed in the journal"
    return [line for line in journal() if "PRIVATE KEY" in line and tag not in line]


# --------------------------------------------------------------------------- quoting


def test_hostile_paths_stay_paths(cluster, hosts, new_stack):
    t0 = time.monotonic()
    (h,) = hosts(1)
    engines = {
        "llamacpp": {"bin": "/opt/x; touch /tmp/pwned1"},
        "vllm": {"bin": "/opt/$(touch /tmp/pwned2)/vllm"},
        "sglang": {"python": "/opt/`touch /tmp/pwned3`/it's \"quoted\"; touch /tmp/pwned4 #"},
    }
    nvidia = "/opt/n'; touch /tmp/pwned5; echo '/nvidia-smi"
    config = stack_config(cluster, [h], nodes=[{"id": h.hostname, "address": h.addr, "engines": engines,
                                                 "discovery": {"nvidiaSmi": nvidia}}])
    stack = new_stack(config)
    up = stack.up()
    assert up.ok, up.output

    problems = {p["engine"]: p for p in stack.outputs()[h.hostname]["engine_problems"]}
    assert {e: p["status"] for e, p in problems.items()} == {"llamacpp": "missing", "vllm": "missing", "sglang": "missing"}
    for name, conf in engines.items():
        path = next(iter(conf.values()))
        assert path in problems[name]["problem"], problems[name]
    # The same strings reached agent.yaml as data.
    doc = yaml.safe_load(h.read_file(CONFIG))
    assert doc["engines"] == engines and doc["discovery"] == {"nvidia_smi": nvidia}
    rc, out = ssh(h, cluster, "sudo find / -xdev -name 'pwned*' 2>/dev/null; sudo ls /tmp; true")
    assert "pwned" not in out, out
    report("security-quoting", engine_problems={e: p["status"] for e, p in problems.items()},
           seconds=round(time.monotonic() - t0, 1))


# --------------------------------------------------------------------------- checksums


def test_a_release_without_a_checksum_line_for_the_node_is_refused(cluster, hosts, new_stack):
    t0 = time.monotonic()
    tag = "v1.6.0"
    name = release_name(tag, "amd64")
    served = build_llmgw(tag)
    digest = hashlib.sha256(served).hexdigest()
    if not (cluster.release_root / tag).exists():
        publish_release(cluster.release_root, tag, {"arm64": b"an arm64 build"})
        (cluster.release_root / tag / name).write_bytes(served)
        # The served file's sha256 is there, but on lines for other names: a substring match would take it.
        with open(cluster.release_root / tag / "checksums.txt", "a") as f:
            f.write(f"{digest}  {name}.sig\n{digest}  old/{name}\n")
    (h,) = hosts(1)
    # The lines are added after any signing could be done: this release is taken only under the opt-out.
    up = new_stack(stack_config(cluster, [h], agent={"version": tag, "releaseUrl": cluster.release_url,
                                                     "allowUnverifiedRelease": True})).up()
    assert not up.ok
    assert f"checksums.txt of {tag} has no line for {name}" in up.output, up.output
    assert "ChecksumMismatchError" in up.output
    for path in (BINARY, CONFIG, UNIT):
        assert h.read_file(path) is None, f"{path} installed from a release without a checksum for it"
    assert leftovers(h, cluster) == []
    line = next(out_line.strip() for out_line in up.output.splitlines() if "has no line for" in out_line)
    report("security-missing-checksum-line", saw=line, seconds=round(time.monotonic() - t0, 1))


# --------------------------------------------------------------------------- keys stay where they belong


def test_no_private_key_ends_up_in_state_output_or_on_the_node(cluster, hosts, new_stack, tmp_path):
    t0 = time.monotonic()
    (h,) = hosts(1)
    config = stack_config(cluster, [h], certificate=RENEW_EVERY_UP,
                          nodes=[{"id": h.hostname, "address": h.addr, "engines": {"vllm": {"bin": "/opt/vllm/bin/vllm"}}}])
    stack = new_stack(config)
    assert stack.up().ok
    key1 = h.read_file(KEY_PATH)
    assert stack.preview().ok
    assert stack.refresh().ok
    assert stack.up().ok                                 # renews the identity
    key2 = h.read_file(KEY_PATH)
    stack.set_config({**config, "agent": {"version": TAMPERED_RELEASE, "releaseUrl": cluster.release_url,
                                          "signingKey": cluster.release_signing_key}})
    assert not stack.up().ok                             # an error path prints too
    assert key1 != key2

    ca_key = pem_body_lines((cluster.pki_dir / "ca-key.pem").read_bytes())
    node_keys = pem_body_lines(key1) + pem_body_lines(key2)
    ssh_key = pem_body_lines(cluster.ssh_key_path.read_bytes())
    assert ca_key and node_keys and ssh_key

    output = stack.all_output()
    shown = json.dumps(stack.export())                   # the Automation API exports with --show-secrets
    stored = subprocess.run([str(cluster.engine_bin / "pulumi"), "stack", "export", "--stack", stack.name],
                            cwd=stack.work_dir, env={**os.environ, **stack.env}, capture_output=True, text=True, check=True).stdout
    local_files = files_under(tmp_path)                  # the backend (state, history, backups), PULUMI_HOME, project

    def present(text: str, needles: list[str]) -> list[int]:
        return [i for i, n in enumerate(needles) if n in text]

    # The CA key: nowhere, not even in the decrypted state.
    assert present(output, ca_key) == [] and present(shown, ca_key) == [] and present(stored, ca_key) == []
    assert holding(local_files, ca_key) == {}
    assert holding(files_under(h.upper), ca_key) == {}, "the CA key reached the node"
    # Node keys and the SSH key: never in plaintext in output or in the state as stored.
    for what, needles in (("node key", node_keys), ("SSH key", ssh_key)):
        assert present(output, needles) == [], f"{what} in CLI output"
        assert present(stored, needles) == [], f"{what} in `pulumi stack export`"
        assert holding(local_files, needles) == {}, f"{what} in plaintext in local state files"
    assert holding(files_under(h.upper), ssh_key) == {}, "the operator's SSH key reached the node"
    # Not even decrypted: a node's key is made on the node, the SSH key is read from its file at each run.
    assert present(shown, node_keys) == [], "a node key is in the state (decrypted)"
    assert present(shown, ssh_key) == [], "the SSH key is in the state (decrypted)"
    assert journal_lines_naming_a_private_key(h, cluster) == [], "key material in the journal"
    report("security-keys-stay-put", runs=len(stack.runs), output_chars=len(output), state_files=len(local_files),
           seconds=round(time.monotonic() - t0, 1))
