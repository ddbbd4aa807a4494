"""A VM resource for composition tests: `TestVM` boots a lab host the way a cloud VM resource provisions one.

The real stacks put a node on a VM created by another resource (a cloud
provider's instance). pulumi-command's `local.Command` would stand in for it,
but its provider plugin is not obtainable on these machines, so this is a
Pulumi dynamic resource of the lab's own: its provider asks a small
"hypervisor" (a Unix-socket server in the test process that owns the Lab)
to boot or stop a host, and outputs the host's address, which is unknown
until the VM exists, exactly like a cloud VM's IP.

Protocol: one JSON line each way, e.g. {"op": "boot", "index": 7, "hostname": "vm7"}
-> {"address": "10.250.0.27"}; {"op": "stop", "index": 7} -> {}.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider


def _call(socket_path: str, request: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(json.dumps(request).encode() + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    if "error" in reply:
        raise RuntimeError(f"hypervisor: {reply['error']}")
    return reply


class TestVMProvider(ResourceProvider):
    serialize_as_secret_always = False

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in ("index", "hostname") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=changed)

    def create(self, props: dict[str, Any]) -> CreateResult:
        reply = _call(props["hypervisor"], {"op": "boot", "index": int(props["index"]), "hostname": props["hostname"]})
        return CreateResult(f"vm-{int(props['index'])}", {**props, "address": reply["address"]})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, props)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _call(props["hypervisor"], {"op": "stop", "index": int(props["index"])})


class TestVM(Resource, module="lab", name="TestVM"):
    address: pulumi.Output[str]

    def __init__(self, name: str, index: int, hostname: str, hypervisor: str,
                 opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TestVMProvider(), name,
                         {"index": index, "hostname": hostname, "hypervisor": hypervisor, "address": None}, opts)


@dataclass
class Hypervisor:
    """Serves boot/stop requests for hosts of one Lab on a Unix socket, in a thread."""

    lab: Any
    socket_path: Path

    def start(self) -> "Hypervisor":
        if self.socket_path.exists():
            self.socket_path.unlink()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                req = json.loads(conn.makefile("rb").readline())
                host = self.lab.prepare(req["index"], hostname=req.get("hostname"))
                if req["op"] == "boot":
                    host.start()
                    reply: dict[str, Any] = {"address": host.addr}
                elif req["op"] == "stop":
                    host.stop()
                    reply = {}
                else:
                    reply = {"error": f"unknown op {req['op']!r}"}
            except Exception as exc:  # reported to the caller, who fails the resource
                reply = {"error": str(exc)}
            conn.sendall(json.dumps(reply).encode() + b"\n")
