"""The benchmark's settings: where it works, the lab it boots, the release, the cgroups it counts CPU in,
and the names of its runs (docs/benchmark-method.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from lab import seed

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLMGW_CACHE", "/var/cache/llmgw-pulumi"))
#: The lab's name and subnet: LLMGW_BENCH_LAB=name:subnet (default b:10.254.0), so the bench can share a machine.
LAB_NAME, _, LAB_SUBNET = os.environ.get("LLMGW_BENCH_LAB", "b:10.254.0").partition(":")
WORK = CACHE / f"bench-{LAB_NAME}"
SEED_SCRIPT = seed.SEED_SCRIPT
RELEASE = "v1.4.2"
UPGRADE_RELEASE = "v1.4.3"  # what the daily upgrade (bench/daily.py) moves 1% of the agents to
RELEASE_PORT = 8443
SSH_USER = "deploy"
SSH_WAIT = 60
DELAY_MS = 25  # per direction: +50 ms round trip
TARGET_N = 30  # issue 12's targets are set at 30 nodes ...
SCALE_N = 100  # ... and at 100
STATE_LIMIT = 8192  # bytes of state per node without PEM bodies
OWN_CGROUP = Path(f"/sys/fs/cgroup/unified/llmgw-bench-{LAB_NAME}")
ENGINE_CGROUP = OWN_CGROUP / "engine"  # the wrapper `pulumi` moves itself here
PROGRAM_CGROUP = OWN_CGROUP / "program"  # the wrapper language host moves itself here; the program's python follows
PROVIDER_CGROUP = OWN_CGROUP / "provider"  # the wrapper dynamic-provider plugin moves itself here
#: Set for check_imports' preview only: the plugin wrappers then point PYTHONPYCACHEPREFIX at <it>/<kind>.
IMPORT_RECORD_VAR = "LLMGW_BENCH_IMPORT_RECORD"
HOSTS_CGROUP = Path(f"/sys/fs/cgroup/unified/lg{LAB_NAME}")
BOOT_TIMEOUT = 180.0
AGENT_TIMEOUT = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
DOC = REPO / "docs" / "benchmark.md"


#: Resource types whose operations reach a node over SSH (ClientCertificate is local).
REMOTE_TYPES = ("NodeIdentity", "AgentInstall", "EngineCheck")
#: PEM blocks inside the exported state's JSON text (newlines there are the two characters "\n").
PEM_RE = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?-----END [A-Z0-9 ]+-----")
#: The seed script's progress lines, in order, and the phase each one starts.
SCRIPT_PHASES = (
    ("onboarding ", "reach ssh"),
    ("  issuing a certificate", "issue certificate (local)"),
    ("  installing the certificate", "copy identity, update-ca-certificates"),
    ("  installing llmgw", "download + verify + install binary"),
    ("  writing the configuration", "hostname, copy config and unit"),
    ("  starting the agent", "install unit, daemon-reload, enable, restart"),
)

FLOOR = "floor: update-ca-certificates + start agent, 1 SSH connection per node"
"""What the hosts must spend anyway: issue 12's floor, all nodes in parallel."""
SIGNED_UP = "pulumi up, from scratch, fetch: operator, signer"
"""The signer runs (--signer-sizes): this, then the signer's name (SIGNERS)."""
SIGNERS = ("pkiDir", "HSM")
LANGUAGE_UP = "pulumi up, from scratch, program in"
"""The language runs (--language-sizes): this, then the program's language (LANGUAGES)."""
LANGUAGES = ("Python", "TypeScript")
PLOTTED = ("pulumi preview", "pulumi up, no-op", "pulumi up, from scratch", "pulumi refresh")
"""The runs whose figures are plotted against N (plain bridge, the package's default provider count)."""


UP, NOOP, PREVIEW, REFRESH = PLOTTED[2], PLOTTED[1], PLOTTED[0], PLOTTED[3]
RESUMED = "pulumi up, again after a failed one"
"""A scale run's `up` run again after its `up` from scratch failed (bench.scenarios.Bench.pulumi_runs)."""
RESUMES = 2
"""How many times a failed `up` is run again, as a CI job's retries would (the scale runs and the stacks at once)."""
SKIP_CHECKPOINTS_ENV = "PULUMI_SKIP_CHECKPOINTS"
"""The engine's setting that writes the state once, at the end of a run, instead of after every step."""
CHECKPOINTS_SKIPPED = ", checkpoints skipped"
"""Appended to the kind of a run made with SKIP_CHECKPOINTS_ENV (Harness.skip_checkpoints): no analysis of the
default engine's runs takes it for one of them."""
SEQ, PAR = "baseline script, sequential", "baseline script, parallel"
