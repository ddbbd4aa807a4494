"""Latency without netem: Toxiproxy in front of every lab host's sshd.

toxiproxy-server (built by scripts/bench-tools.sh) listens on loopback only,
its HTTP API as well as every proxy. Each lab host gets one proxy
(``127.0.0.1:<port>`` -> ``<host address>:22``); a latency toxic on each
direction of a proxy delays every chunk by the same time, so a 25 ms toxic
upstream and one downstream add 50 ms to each round trip of that host's SSH
connections. Only traffic the operator sends to a host's sshd goes through a
proxy: what the hosts open themselves (downloads from the release server, the
agent's stream to the control plane) goes over the bridge as before.

The payloads are built by pure functions (tested in tests/unit); the client
speaks the API with the standard library, to loopback only.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
API_PORT = 18474
"""Not toxiproxy's default 8474: another lab's benchmark may run one there."""
LATENCY_TOXICS = ("latency_upstream", "latency_downstream")


def proxy_payload(name: str, upstream_host: str, upstream_port: int = 22, listen_port: int = 0) -> dict[str, Any]:
    """POST /proxies: a proxy on loopback (port 0: the server picks one and answers with it) to upstream."""
    if not name or "/" in name:
        raise ValueError(f"proxy name {name!r}: give a non-empty name without '/'")
    return {"name": name, "listen": f"{LOOPBACK}:{listen_port}", "upstream": f"{upstream_host}:{upstream_port}",
            "enabled": True}


def latency_toxics(one_way_ms: int) -> list[dict[str, Any]]:
    """POST /proxies/<name>/toxics, twice: `one_way_ms` on each direction, so a round trip gains twice that."""
    if one_way_ms < 0:
        raise ValueError(f"latency {one_way_ms} ms: give 0 or more milliseconds")
    return [{"name": name, "type": "latency", "stream": name.rsplit("_", 1)[1], "toxicity": 1.0,
             "attributes": {"latency": one_way_ms, "jitter": 0}} for name in LATENCY_TOXICS]


def listen_port(answer: dict[str, Any]) -> int:
    """The port a created proxy listens on, from the server's answer ('127.0.0.1:40123')."""
    host, _, port = str(answer["listen"]).rpartition(":")
    if host != LOOPBACK:
        raise RuntimeError(f"proxy {answer.get('name')} listens on {answer['listen']}, not on loopback")
    return int(port)


@dataclass
class Toxiproxy:
    """A toxiproxy-server of our own on loopback, and its proxies by name."""

    binary: Path
    log: Path
    port: int = API_PORT
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 10.0) -> Toxiproxy:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "-host", LOOPBACK, "-port", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", "/version", parse=False)  # answers the bare version, e.g. 2.5.0
                return self
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"toxiproxy-server did not start on {self.url}; see {self.log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def request(self, method: str, path: str, payload: Any = None, parse: bool = True) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"toxiproxy {method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from None
        if not parse:
            return body.decode(errors="replace")
        return json.loads(body) if body.strip() else None

    def proxy(self, name: str, upstream_host: str, upstream_port: int = 22) -> int:
        """Create (or re-create) the proxy `name`; the loopback port it listens on."""
        existing = self.request("GET", "/proxies") or {}
        if name in existing:
            self.request("DELETE", f"/proxies/{name}")
        return listen_port(self.request("POST", "/proxies", proxy_payload(name, upstream_host, upstream_port)))

    def set_latency(self, name: str, one_way_ms: int) -> None:
        """Replace the proxy's latency toxics: none for 0 ms, else `one_way_ms` each way."""
        present = {t["name"] for t in self.request("GET", f"/proxies/{name}/toxics") or []}
        for toxic in LATENCY_TOXICS:
            if toxic in present:
                self.request("DELETE", f"/proxies/{name}/toxics/{toxic}")
        if one_way_ms:
            for payload in latency_toxics(one_way_ms):
                self.request("POST", f"/proxies/{name}/toxics", payload)
