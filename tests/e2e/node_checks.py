"""What the end-to-end tests read off a node to tell what a run did to it: the package's files (identity, mtime,
mode, owner, content), the agent's process, the certificate's serial in state and on the node, the steps the
engine took, and the temporary files a change may leave; and the stand-in engine some tests install."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from cryptography import x509

from tests.conftest import ssh

NODE_FILES = ("/usr/local/bin/llmgw", "/etc/systemd/system/llmgw-agent.service",
              "/usr/local/share/ca-certificates/llmgw-ca.crt", "/etc/ssl/certs/ca-certificates.crt")
"""Besides everything in /etc/llmgw: the binary, the unit, the CA as a trust anchor and the bundle it is in."""


IDENTITY_DIR = "/etc/llmgw"


def node_files(host: Any) -> dict[str, tuple[int, int, int, int, int, str]]:
    """path -> (inode, mtime ns, mode, uid, gid, sha256) of every file the package keeps on the node.

    Not the ctime: a chmod or chown to the mode and owner a file already has changes nothing on the node."""
    identity = sorted(f"{IDENTITY_DIR}/{e.name}" for e in os.scandir(host.root / IDENTITY_DIR.lstrip("/")))
    facts = {}
    for path in (*identity, *NODE_FILES):
        st, data = host.stat(path), host.read_file(path)
        assert st is not None and data is not None, f"{host.hostname}: {path} is missing"
        facts[path] = (st.st_ino, st.st_mtime_ns, st.st_mode, st.st_uid, st.st_gid, hashlib.sha256(data).hexdigest())
    return facts


def agent_process(host: Any, cluster: Any) -> tuple[str, str]:
    """(MainPID, start time) of the agent's service."""
    rc, out = ssh(host, cluster, "systemctl show -p MainPID -p ExecMainStartTimestampMonotonic --value llmgw-agent")
    assert rc == 0, out
    pid, started = out.split()
    assert pid != "0", f"{host.hostname}: the agent is not running"
    return pid, started


def serials(stack: Any, hosts: list[Any]) -> dict[str, Any]:
    """node -> (serial recorded in state, serial of the certificate on the node)."""
    recorded = {r["urn"].split("::")[-1]: r["outputs"]["serial"] for r in stack.export()["resources"]
                if r["type"].endswith("ClientCertificate")}
    on_node = {h.hostname: x509.load_pem_x509_certificate(h.read_file(f"{IDENTITY_DIR}/agent.pem")).serial_number
               for h in hosts}
    return {h.hostname: (recorded.get(h.hostname), on_node[h.hostname]) for h in hosts}


def steps_taken(run: Any) -> dict[str, list[str]]:
    """Type::name -> the steps the engine took for it other than "same" (update, create-replacement, ...)."""
    steps: dict[str, list[str]] = {}
    for event in run.events:
        meta = (event.get("resourcePreEvent") or {}).get("metadata")
        if meta and meta["op"] != "same":
            urn = meta["urn"]
            steps.setdefault(f"{urn.split('::')[-2].split(':')[-1]}::{urn.split('::')[-1]}", []).append(meta["op"])
    return steps


BINARY = "/usr/local/bin/llmgw"


CONFIG = "/etc/llmgw/agent.yaml"


UNIT = "/etc/systemd/system/llmgw-agent.service"


def leftovers(host: Any, cluster: Any) -> list[str]:
    """Temp files, kept copies and staging dirs of this package anywhere it writes, as the host sees them."""
    rc, out = ssh(host, cluster, "sudo find /etc/llmgw /usr/local/bin /etc/systemd/system /usr/local/share/ca-certificates "
                                 "/var/tmp /run -maxdepth 1 \\( -name '*.llmgw-*' -o -name 'llmgw-stage.*' \\) 2>/dev/null; true")
    return sorted(out.split())


def report(name: str, **facts: Any) -> None:
    """One line per scenario for the lead's table (shown with -s, and in the junit output)."""
    print(f"\nREPORT {name}: " + json.dumps(facts, default=str))


TEST_ENGINE = "#!/bin/sh\n# a stand-in inference engine: answers --version, serves until killed\n" \
              "case \"$1\" in --version) echo test-engine 1.0 ;; serve) sleep 100000 ;; *) exit 0 ;; esac\n"


def install_test_engine(host, cluster, path="/opt/engines/test-engine"):
    rc, out = ssh(host, cluster, f"sudo mkdir -p /opt/engines && printf '%s' '{TEST_ENGINE}' | sudo tee {path} >/dev/null "
                                 f"&& sudo chmod 755 {path}")
    assert rc == 0, out
    return path
