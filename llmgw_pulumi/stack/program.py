"""The Pulumi program: stack config -> one Node component per configured node.

`__main__.py` calls ``run()``: `pulumi up` in the project directory runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from .. import child_env, operator_files, rollout, validate
from ..boundary import pulumi_errors
from ..certificates import signer
from ..config import node_list, stack_config
from ..config.agent_settings import BinarySource
from ..config.specs import Rollout
from ..errors import ConfigError, LlmgwError
from ..releases import approval
from . import fleet
from .call_stack import recorded_frames
from .node import Node, NodeArgs, engine_problems
from .per_run import PerRun

CONFIG_NAMESPACE = stack_config.NAMESPACE


def config_keys(namespace: str = CONFIG_NAMESPACE) -> list[str]:
    """Every key set in this stack's config under ``namespace`` (without it), known or not.

    ``pulumi.Config`` reads one key at a time and has no listing, so a
    misspelled key would go unseen. The whole config is in the SDK's runtime:
    ``get_config_env()`` (public: PULUMI_CONFIG, as the language host passes it)
    and ``CONFIG``, the map the language host, the Automation API or the test
    mocks set (``set_all_config``; not exported, hence both).
    """
    prefix = f"{namespace}:"
    return sorted(k[len(prefix):] for k in all_config_keys() if k.startswith(prefix))


def all_config_keys() -> set[str]:
    """Every key set in this stack's config, with its namespace (``llmgw:servers``, ``aws:region``): a misspelled
    namespace (``llmwg:agent``) is found among them (stack_config.misspelled_namespaces)."""
    return set(pulumi.runtime.get_config_env()) | set(runtime_config.CONFIG.get())


def _read_config() -> tuple[dict[str, Any], list[str], dict[str, pulumi.Output[str]]]:
    """(the llmgw:* values but secrets, the names of other secret keys, the secrets read: stack_config.SECRET_KEYS,
    the SSH key and its passphrase, the CA key and its passphrase). Each of them must be held as a secret: in plain
    text it would sit in the stack's config file (``plain_text_secret``)."""
    cfg = pulumi.Config(CONFIG_NAMESPACE)
    raw: dict[str, Any] = {}
    secret_names: list[str] = []
    for key in config_keys():
        if key in stack_config.SECRET_KEYS:
            if not pulumi.runtime.is_config_secret(cfg.full_key(key)):
                raise plain_text_secret(key)
            continue
        if pulumi.runtime.is_config_secret(cfg.full_key(key)):
            secret_names.append(key)  # never read: its value must not reach a message
            continue
        # Structured values are stored as JSON, plain strings as they are.
        try:
            value = cfg.get_object(key)
        except pulumi.ConfigTypeError:
            value = cfg.get(key)
        if value is not None:
            raw[key] = value
    secrets = {key: value for key in stack_config.SECRET_KEYS if (value := cfg.get_secret(key)) is not None}
    return raw, secret_names, secrets


def plain_text_secret(key: str) -> ConfigError:
    """The refusal of a setting of stack_config.SECRET_KEYS given in plain text (never quoting its value)."""
    return ConfigError("llmgw", key, "is set in plain text, in the stack's config file",
                       f"set it again as a secret: `pulumi config rm llmgw:{key}`, then `pulumi config set --secret "
                       f"llmgw:{key}` (a key file: `... < file`); its value was in the stack's file: treat it as exposed")


@functools.cache
def local_binary(path: str, run: bool = True) -> tuple[str, str, str]:
    """(absolute path, version, sha256) of a local llmgw build; the version is the last word of --version.

    With ``run`` false (a preview) the build is read and hashed but never executed: the pull request under review
    may have put it there. Its version is then empty, and AgentInstall's check takes the version recorded for the
    same sha256 (``providers.agent.carry_version``); `pulumi up` runs it to learn the version.
    """
    p = Path(os.path.expanduser(path)).resolve()
    if not p.is_file() or not os.access(p, os.X_OK):
        raise ConfigError("llmgw", "agent.binary", f"{p} is not an executable file", "build llmgw, or fix agent.binary")
    with open(p, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    if not run:
        return str(p), "", sha256
    try:
        out = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=30, check=True,
                             env=child_env.for_child()).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError("llmgw", "agent.binary", f"`{p} --version` failed: {exc}", "check that the build runs on this machine") from None
    words = out.split()
    if not words:
        raise ConfigError("llmgw", "agent.binary", f"`{p} --version` printed nothing", "check the build")
    return str(p), words[-1], sha256


def ssh_credentials(spec: stack_config.StackSpec, secrets: dict[str, pulumi.Output[str]]) -> dict[str, Any]:
    """The connection's key fields: the llmgw:sshPrivateKey secret or the key's path, and the key's passphrase.

    A path keeps the key out of state entirely: the providers read it at each
    operation. It must be readable for `pulumi up`; a preview may run without
    it (a reviewer's machine), with a warning. With neither, the providers log
    in with the keys of the ssh-agent at $SSH_AUTH_SOCK.

    A path under the home directory, written ``~/...``, is recorded as written
    (the providers expand it where they run): the same stack file then reads
    the same from every operator's machine and CI runner, whatever their home
    directory. Any other path is recorded absolute.
    """
    credentials: dict[str, Any] = {}
    if stack_config.PASSPHRASE_KEY in secrets:
        credentials["passphrase"] = secrets[stack_config.PASSPHRASE_KEY]
    if stack_config.SECRET_KEY in secrets:
        return {**credentials, "private_key": secrets[stack_config.SECRET_KEY]}
    if not spec.ssh_private_key_path:
        return credentials
    path = Path(os.path.expanduser(spec.ssh_private_key_path)).absolute()
    if not os.access(path, os.R_OK):
        reason = "it does not exist" if not path.exists() else "it is not readable by this user"
        if pulumi.runtime.is_dry_run():
            pulumi.log.warn(f"cannot read the SSH key {path} ({reason}): previewing without it; `pulumi up` needs it")
        else:
            raise ConfigError("llmgw", "ssh.privateKeyPath", f"cannot read {path}: {reason}",
                              "point it at the operator's SSH private key, or set the llmgw:sshPrivateKey secret")
    refuse_exposed("ssh.privateKeyPath", path, secret=True)
    written = spec.ssh_private_key_path
    return {**credentials, "private_key_path": written if written.startswith(validate.HOME_PREFIX) else str(path)}


def refuse_exposed(field: str, path: str | os.PathLike[str], secret: bool) -> None:
    """The SSH key file or the signer program, when another user can read (``secret``) or change it
    (operator_files.exposed): a ConfigError before any node is reached; a preview, as where the key cannot be
    read, only warns."""
    found = operator_files.exposed(path, secret=secret)
    if found is None:
        return
    problem, fix = found
    if pulumi.runtime.is_dry_run():
        pulumi.log.warn(f"llmgw: {field}: {problem}; `pulumi up` refuses it (fix: {fix})")
    else:
        raise ConfigError("llmgw", field, problem, fix)


def agent_inputs(source: BinarySource, dry_run: bool | None = None) -> BinarySource:
    """AgentInstall's binary (version, release_url, binary_path, binary_sha256, and for a release how it is
    verified: release_sha256, signing_key, release_ca, fetch) from the source the stack config gives.

    A release's digests are approved here (llmgw_pulumi.releases.approval.approve): from the pins, without any network;
    otherwise from its checksums.txt, fetched over https (and its signature checked) once per release and run
    of the program, i.e. once per `pulumi up`, before any resource is registered; never in a preview, which
    leaves them out (the diff does not compare them, so an unchanged version shows no change).
    """
    version, release_url, binary_path, binary_sha = source.version, source.release_url, None, None
    if dry_run is None:
        dry_run = pulumi.runtime.is_dry_run()
    if source.binary_path:
        binary_path, version, binary_sha = local_binary(source.binary_path, run=not dry_run)
        if validate.RELEASE_TAG.match(version):
            binary_path = binary_sha = None  # a release build: downloaded and verified like any release
            if not release_url:
                raise ConfigError("llmgw", "agent.releaseUrl", f"the local binary is release {version}, which nodes download",
                                  "give agent.releaseUrl")
    copied = BinarySource(version=version, release_url=release_url, binary_path=binary_path, binary_sha256=binary_sha)
    if binary_path is not None:
        return dataclasses.replace(copied, verification=approval.LOCAL_BUILD)
    if not version or release_url is None:
        return copied
    pins = tuple(sorted((arch, digest.lower()) for arch, digest in (source.release_sha256 or {}).items()))
    ca_file = os.path.abspath(os.path.expanduser(source.release_ca)) if source.release_ca else None
    signing_key = validate.normalise_host_key(source.signing_key) if source.signing_key else None
    how = approval.verification(True, signing_key, pins, source.allow_unverified_release)
    if how is None:  # a local build that is a release (the stack config's check knew no version for it)
        raise ConfigError("llmgw", "agent.signingKey", f"is missing: the local build {source.binary_path} is release "
                          f"{version}, which no signing key or agent.sha256 pin verifies",
                          "`pulumi config set --path llmgw:agent.signingKey 'ssh-ed25519 AAAA...'` (the release "
                          "signing key's public line), or pin its sha256 per architecture in agent.sha256; or, knowingly, "
                          "`pulumi config set --path llmgw:agent.allowUnverifiedRelease true`")
    approved = approval.Release(release_url.rstrip("/"), version, signing_key, pins, ca_file)
    digests = None
    if pins or not dry_run:
        digests = approval.approve(approved)
        if not dry_run:
            say_once(f"llmgw {version} from {approved.url}: the sha256 of {', '.join(sorted(digests))} approved "
                     f"{approved.how}")
    return dataclasses.replace(copied, release_sha256=digests, signing_key=signing_key, release_ca=ca_file,
                               fetch=source.fetch, allow_unverified_release=source.allow_unverified_release,
                               verification=how)


_said: PerRun[None] = PerRun()
"""The lines ``say_once`` has said in this run of the program: each run says its lines anew."""


def say_once(line: str) -> None:
    """Say ``line`` under the stack once per run, and print it once: as an ephemeral info diagnostic of the stack
    resource, sent once the engine has registered it.

    The CLI's non-interactive display prints a row again, with its last message, whenever the row's status
    changes, and lists every message but ephemeral ones under ``Diagnostics:``. Sent before the stack's row
    exists, an info line was printed 3 times (on arrival, when the stack began, and under Diagnostics). Sent once
    the stack's URN is known (its row already shown) and ephemeral, it is printed once, in the stack's row; the
    event log keeps it. A release that several nodes name is approved, and said, once."""
    _, first = _said.once(line, lambda: None)
    if first:
        pulumi.log.info(line, resource=pulumi.runtime.get_root_resource(), ephemeral=True)


def stack_rollout(spec: stack_config.StackSpec) -> Rollout | None:
    """llmgw:rollout with this stack's coordination directory; for `pulumi up` (not a preview), a new run started.

    The directory is the same at every run of the stack from this checkout, so
    the input never changes by itself (and it is never a reason to change a node).
    """
    if spec.rollout is None:
        return None
    directory = rollout.stack_dir(os.getcwd(), pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack())
    if not pulumi.runtime.is_dry_run():
        rollout.start_run(directory, spec.rollout.canaries)
    return dataclasses.replace(spec.rollout, directory=str(directory))


NEXT_STEPS_OUTPUT = "nextSteps"
"""The stack output telling the operator what to check (SPEC step 9); not a DNS label, so never a node id."""


def next_steps(node_ids: list[str]) -> dict[str, Any]:
    """What the operator should see in the cluster once `pulumi up` has onboarded ``node_ids`` (SPEC step 9).

    A mapping, not one sentence: the CLI cuts a string output at 150
    characters, and shows a list one item per line, so any number of nodes fits.
    """
    return {
        "expect": "within seconds, `llmgw ctl nodes` lists each of these node ids",
        "nodeIds": list(node_ids),
        "refused": "an agent whose node id differs from its certificate's CN, by design "
                   "(each certificate issued here has CN = its node id)",
    }


LANGUAGE_HOST_SHOWN_EXIT = 32
"""The exit code by which a program tells pulumi-language-python it already showed the operator an actionable
error (``pythonProcessExitedAfterShowingUserActionableMessage``), so the host adds none of its own."""


def exit_quietly_on_interrupt() -> None:
    """`__main__.py`, before ``run``: SIGINT ends the program at once, with LANGUAGE_HOST_SHOWN_EXIT and no traceback.

    The engine interrupts the program when a resource fails (and when the operator presses Ctrl-C); by default
    Python raises KeyboardInterrupt wherever the language host's event loop waits, and prints two tracebacks of
    the SDK's and asyncio's frames under the stack. What failed is already said, under its resource and at the
    end of the run (``providers._diagnostics.report_failed``); the program has nothing to add. Only a stack
    program's main thread installs it (a test or a program of the operator's own keeps Python's default)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LANGUAGE_HOST_SHOWN_EXIT)


def run() -> None:
    """`__main__.py`'s entry point: the stack config read, then the nodes registered from a shallow call stack.

    A configuration error (or a release refused before any node is reached) is the only error `pulumi up`
    shows: raised, a
    ConfigError (a pulumi.RunError at this boundary) is printed without a traceback, but the
    language host then adds "an unhandled error occurred: program exited with
    non-zero exit code: 1". Logged, then exiting with
    LANGUAGE_HOST_SHOWN_EXIT, the list of problems stands alone. Every
    ConfigError, and every release error of the operator's side, is raised by ``resolve()``, before any
    resource exists.

    The Python SDK records, in the state of every resource, the program's
    call stack at the resource's construction: every frame below the resource
    class's ``__init__`` (pulumi.runtime.resource._get_stack_trace), about 100
    bytes each. Run from `__main__.py`, that stack holds the language host's
    runpy frames, the SDK's stack runner and this module's frames: 16 frames
    per resource, over 40% of a node's state. ``register`` runs instead as an
    asyncio task of its own, started here and handed to ``pulumi.run`` (the
    SDK's documented asynchronous entry point, awaited once this module's code
    has run): a task starts on the event loop with only the loop's own frames
    below it, so each resource records about half as many frames. What is
    registered, and every URN, is the same as registering it here.
    """
    try:
        registration = resolve()
    except LlmgwError as exc:  # bad config, or a release that is not the operator's (llmgw_pulumi.releases.approval)
        pulumi.log.error(str(exc))
        raise SystemExit(LANGUAGE_HOST_SHOWN_EXIT) from None

    async def register_from_the_loop() -> None:
        with pulumi_errors():
            register(registration)

    registered = asyncio.ensure_future(register_from_the_loop())
    pulumi.run(lambda: registered)


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the program registers, every config value resolved and checked (``resolve()``)."""

    spec: stack_config.StackSpec
    agents: dict[str, BinarySource]
    """Per node id: AgentInstall's binary (see agent_inputs)."""
    credentials: dict[str, Any]
    """The connection's key fields (see ssh_credentials)."""
    pki_dir: str | None
    rollout: Rollout | None
    """llmgw:rollout with this stack's coordination directory (see stack_rollout), or None."""
    signer: dict[str, Any] | None = None
    """ClientCertificate's ``signer`` input (see signer_inputs); None: pkiDir."""
    ca_key: pulumi.Output[str] | None = None
    """Signer caKey: the llmgw:caKey secret."""
    ca_key_passphrase: pulumi.Output[str] | None = None
    """The llmgw:caKeyPassphrase secret (an encrypted ca-key.pem), or None."""


def resolve() -> Registration:
    """Read and check this stack's config. Bad config raises a ConfigError (StackConfigError for the
    stack config's own problems); nothing is registered."""
    raw, secret_names, secrets = _read_config()
    # node_list.parse: stack_config.parse with llmgw:inventory's rows, node ids checked across the project's stacks.
    spec = node_list.parse(raw, Path.cwd(), pulumi.get_stack(), has_secret_key=stack_config.SECRET_KEY in secrets,
                           secret_keys=secret_names, has_agent=bool(os.environ.get("SSH_AUTH_SOCK")),
                           has_ca_key=stack_config.CA_KEY in secrets,
                           other_keys=[k for k in all_config_keys() if not k.startswith(f"{CONFIG_NAMESPACE}:")])
    stack_agent = functools.cache(lambda: agent_inputs(spec.agent))  # once, and only when a node uses it
    agents = {n.node_id: agent_inputs(n.agent) if n.agent else stack_agent() for n in spec.nodes}
    pki_dir = os.path.abspath(os.path.expanduser(spec.pki_dir)) if spec.pki_dir else None
    if pki_dir is not None and (spec.signer is None or spec.signer.kind == signer.KIND_PKI_DIR):
        refuse_unreadable_pki_dir(pki_dir)
    return Registration(spec, agents, ssh_credentials(spec, secrets), pki_dir, stack_rollout(spec),
                signer_inputs(spec.signer), secrets.get(stack_config.CA_KEY) if _signs_with_ca_key(spec) else None,
                secrets.get(stack_config.CA_PASSPHRASE_KEY))


def refuse_unreadable_pki_dir(pki_dir: str) -> None:
    """llmgw:pkiDir (the default signer) when this user cannot read it or its ca.pem: for `pulumi up`, a ConfigError
    before any node is reached (every node's certificate is signed from it); a preview, which signs nothing (a
    reviewer's machine has no CA), only warns."""
    ca = Path(pki_dir) / "ca.pem"
    if not os.path.isdir(pki_dir) or not os.access(pki_dir, os.R_OK | os.X_OK):
        problem = f"cannot read {pki_dir}: " + ("it is not a directory" if not os.path.exists(pki_dir) or
                                                 not os.path.isdir(pki_dir) else "it is not readable by this user")
    elif not os.access(ca, os.R_OK):
        problem = f"cannot read {ca}: " + ("it does not exist" if not ca.exists() else "it is not readable by this user")
    else:
        return
    fix = ("point llmgw:pkiDir at the cluster CA's directory (ca.pem and ca-key.pem, as `llmgw ctl cert init-ca` "
           "makes them), readable by the user running pulumi; or choose another signer (llmgw:signer)")
    if pulumi.runtime.is_dry_run():
        pulumi.log.warn(f"llmgw: pkiDir: {problem}; previewing without it; `pulumi up` refuses it (fix: {fix})")
    else:
        raise ConfigError("llmgw", "pkiDir", problem, fix)


def _signs_with_ca_key(spec: stack_config.StackSpec) -> bool:
    return spec.signer is not None and spec.signer.kind == signer.KIND_CA_KEY


def signer_inputs(given: stack_config.SignerConfig | None) -> dict[str, Any] | None:
    """ClientCertificate's ``signer`` input: llmgw:signer with its CA certificate read (a path, or the PEM text).
    None for pkiDir, the default, as stacks made before llmgw:signer record it (absent)."""
    if given is None or given.kind == signer.KIND_PKI_DIR:
        return None
    ca = given.ca or ""
    if "-----BEGIN CERTIFICATE-----" not in ca:
        path = os.path.abspath(os.path.expanduser(ca))
        try:
            ca = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("llmgw", "signer.ca", f"cannot read {path} ({type(exc).__name__})",
                              "give the CA certificate's path on this machine, or its PEM text "
                              "(`pulumi config set llmgw:signer.ca -- \"$(cat ca.pem)\"` with --path)") from None
    inputs: dict[str, Any] = {"kind": given.kind, "ca_pem": ca}
    if given.command:
        inputs["command"] = list(given.command)
    if given.timeout_seconds is not None:
        inputs["timeout_seconds"] = given.timeout_seconds
    if given.max_parallel is not None:
        inputs["max_parallel"] = given.max_parallel
    problems = signer.problems(inputs)
    if problems:
        name, problem, fix = problems[0]
        raise ConfigError("llmgw", name, problem, fix)
    if given.command:
        refuse_exposed("signer.command", given.command[0], secret=False)
    return inputs


def main() -> dict[str, Node]:
    """Onboard the nodes of this stack's config. Bad config raises StackConfigError (a pulumi.RunError too)
    before any resource exists."""
    with pulumi_errors():
        return register(resolve())


def register(registration: Registration) -> dict[str, Node]:
    """One Node per configured node, and the stack outputs: nodes, nextSteps and fleet."""
    spec = registration.spec
    nodes: dict[str, Node] = {}
    # Canaries are registered first, so that the engine reaches their updates before the others'.
    canaries = registration.rollout.canaries if registration.rollout else ()
    # No node records a frame of the call stack: each would be the line below, the same for every node of the
    # fleet; a program of the operator's own records the line that made its Node.
    with recorded_frames(0):
        for n in sorted(spec.nodes, key=lambda n: n.node_id not in canaries):
            nodes[n.node_id] = Node(n.node_id, node_args(registration, n))  # in its shard's provider process (llmgw_pulumi.stack.shards)
    ids = [n.node_id for n in spec.nodes]
    pulumi.export(NODES_OUTPUT, pulumi.Output.all(*(node_output(nodes[i]) for i in ids)).apply(
        lambda known: fleet.nodes_lines(dict(zip(ids, known, strict=True)))))
    rows = [fleet_row(i, nodes[i]) for i in ids]
    pulumi.export(NEXT_STEPS_OUTPUT, next_steps(ids))
    pulumi.export(FLEET_OUTPUT, pulumi.Output.all(*rows).apply(
        lambda known: fleet.fleet_lines(known, dt.datetime.now(dt.UTC))))
    return nodes


def node_args(registration: Registration, n: stack_config.NodeConfig) -> NodeArgs:
    """One configured node's NodeArgs: its settings, the stack's credentials, signer, binary and rollout."""
    return NodeArgs(
        node_id=n.node_id,
        connection=dataclasses.replace(n.connection, **registration.credentials),
        pki_dir=registration.pki_dir,
        signer=registration.signer,
        ca_key=registration.ca_key,
        settings=n.settings,
        binary=registration.agents[n.node_id],
        validity_hours=registration.spec.validity_hours,
        renew_before_hours=registration.spec.renew_before_hours,
        fail_on_engine_problems=n.fail_on_engine_problems,
        hardware=n.hardware,
        fail_on_critical_problems=n.fail_on_critical_problems,
        key_origin=n.key_origin,
        rollout=registration.rollout,
        ca_key_passphrase=registration.ca_key_passphrase,
        registration=registration.spec.registration,
    )


FLEET_OUTPUT = "fleet"
"""The stack output for a person: node id -> one line (see llmgw_pulumi.stack.fleet)."""
NODES_OUTPUT = "nodes"
"""The stack output for programs: each node's outputs (``node_output``), one line of JSON per node
(``llmgw_pulumi.stack.fleet.read_nodes`` reads it)."""


def node_output(node: Node) -> pulumi.Output[dict[str, Any]]:
    """A node's entry in the ``nodes`` output: who it is, its certificate, its hardware and its problems."""
    check = node.engine_check
    inventory = check.inventory.apply(lambda inv: inv or {})
    return pulumi.Output.all(**{
        "hostname": node.identity.hostname,
        "agent_version": node.agent.version,
        "certificate_not_after": node.certificate.not_after,
        "certificate_adopted": node.certificate.adopted.apply(bool),
        "engine_problems": check.problems.apply(engine_problems),
        "problems": check.problems,
        "readiness": node.readiness,
        "gpus": inventory.apply(lambda inv: len(inv.get("gpus") or [])),
        "gpu_model": inventory.apply(lambda inv: fleet.gpu_model(inv.get("gpus") or [])),
        "driver": inventory.apply(lambda inv: inv.get("driver", "")),
        "cuda": inventory.apply(lambda inv: inv.get("cuda", "")),
        "hcas": inventory.apply(lambda inv: inv.get("hcas") or []),
    })


def fleet_row(node_id: str, node: Node) -> pulumi.Output[fleet.FleetRow]:
    """The node's line of the fleet table, once its resources' outputs are known. The agent version is the one
    AgentInstall installed (its state), not the one configured: a node whose update failed or was refused shows
    the version it still runs."""
    return pulumi.Output.all(node.identity.hostname, node.certificate.not_after, node.agent.version, node.identity.arch,
                             node.engine_check.inventory, node.engine_check.problems).apply(
        lambda v: fleet.FleetRow(node_id, v[0] or "", v[1] or "", v[2] or "", v[3] or "", (v[4] or {}).get("gpus") or [],
                                 v[5] or []))
