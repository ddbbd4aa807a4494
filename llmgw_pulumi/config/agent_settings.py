"""What agent.yaml says (``AgentSettings``) and where the agent's binary comes from (``BinarySource``).

Each setting is declared once, here, with ``schema.setting``: its input name, its stack-config key, its
validator, its default, and its key in agent.yaml (``agent_yaml``). The provider's check, the stack-config
reader, agent.yaml's rendering (llmgw_pulumi.nodestate.desired) and ``describe`` all read these declarations; adding an
agent.yaml option is one declaration here (docs/operations.md, "Adding an agent.yaml option").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..releases.policy import (
    LOCAL_BUILD,
    OPT_OUT,
    OPT_OUT_SETTING,
    PIN,
    SIGNATURE,
    VERIFICATIONS,
    digests_problem,
    pins_problem,
    verification,
)
from .schema import FromProps, Problems, Schema, collect_fields, collect_one, is_unknown, key_shown, names, setting

ENGINE_KEYS: dict[str, str] = {"llamacpp": "bin", "vllm": "bin", "sglang": "python"}
"""Each engine the agent knows, and the key under which its executable is configured (SPEC step 6)."""

DEFAULT_IB_ROOT = "/sys/class/infiniband"



def _on_node(what: str) -> Callable[[Any], validate.Problem]:
    return lambda value: validate.abs_path(value, what, on_node=True)


SERVERS_EXAMPLE = ["cp1.example.net:7443"]
FABRIC_EXAMPLE = {"name": "ib-east", "hcas": ["mlx5_0"]}
ENGINES_EXAMPLE = {"vllm": {"bin": "/opt/vllm/bin/vllm"}}


def collect_servers(servers: Any, problems: Problems, where: str) -> None:
    """Control planes as host:port, in failover order, each once."""
    if is_unknown(servers) and not isinstance(servers, (list, tuple)):
        return
    if servers is not None and not isinstance(servers, (list, tuple)):
        problems.wrong_type(where, servers, "a list of host:port", SERVERS_EXAMPLE)
        return
    if not servers:
        problems.add(where, "is empty or missing", 'list the control planes as host:port, e.g. ["cp1.example.net:7443"]')
        return
    for i, s in enumerate(servers):
        problems.check(f"{where}[{i}]", s, validate.server)
    known = [s for s in servers if isinstance(s, str)]
    if len(set(known)) != len(known):
        problems.add(where, "lists a control plane twice", "list each control plane once, in failover order")


FABRIC_SCHEMA: Schema = {"name": None, "hcas": None}


def collect_fabric(fab: Any, problems: Problems, where: str) -> None:
    """One fabric: {name, hcas}."""
    if not isinstance(fab, Mapping):
        problems.wrong_type(where, fab, "a {name, hcas} mapping", FABRIC_EXAMPLE)
        return
    for key in fab:
        if key not in FABRIC_SCHEMA:
            problems.add(f"{where}.{key_shown(key)}", "is not a fabric setting", validate.did_you_mean(str(key), FABRIC_SCHEMA))
    if fab.get("name") in (None, ""):
        problems.add(f"{where}.name", "is missing: HCAs were given without a fabric",
                     "name the InfiniBand fabric these HCAs are cabled to; it cannot be discovered")
    else:
        problems.check(f"{where}.name", fab.get("name"), validate.fabric_name)
    hcas = fab.get("hcas")
    if not is_unknown(hcas):
        if hcas is not None and not isinstance(hcas, (list, tuple)):
            problems.wrong_type(f"{where}.hcas", hcas, "a list of HCA names", ["mlx5_0", "mlx5_1"])
        elif not hcas:
            problems.add(f"{where}.hcas", "is empty: a fabric without HCAs",
                         "list the node's HCAs on this fabric, e.g. [mlx5_0, mlx5_1]")
        else:
            for j, h in enumerate(hcas):
                problems.check(f"{where}.hcas[{j}]", h, validate.hca)


def collect_fabrics(fabrics: Any, problems: Problems, where: str) -> None:
    """A list of {name, hcas}, each fabric once."""
    if is_unknown(fabrics) and not isinstance(fabrics, (list, tuple)):
        return
    if not isinstance(fabrics, (list, tuple)):
        problems.wrong_type(where, fabrics, "a list of {name, hcas} mappings", [FABRIC_EXAMPLE])
        return
    seen: set[str] = set()
    for i, fab in enumerate(fabrics):
        collect_fabric(fab, problems, f"{where}[{i}]")
        name = fab.get("name") if isinstance(fab, Mapping) else None
        if isinstance(name, str):
            if name in seen:
                problems.add(f"{where}[{i}].name", f"fabric {name!r} is listed twice", "list each fabric once")
            seen.add(name)


def collect_engines(engines: Any, problems: Problems, where: str = "engines") -> None:
    if is_unknown(engines) and not isinstance(engines, Mapping):
        return
    if not isinstance(engines, Mapping):
        problems.wrong_type(where, engines, "a mapping of engine to {bin: PATH} (sglang: {python: PATH})",
                            ENGINES_EXAMPLE)
        return
    for name, conf in engines.items():
        if name not in ENGINE_KEYS:
            problems.add(f"{where}.{key_shown(name)}", "is not an engine the agent knows", f"use one of {', '.join(ENGINE_KEYS)}")
            continue
        key = ENGINE_KEYS[name]
        if not isinstance(conf, Mapping):
            problems.wrong_type(f"{where}.{name}", conf, f"a {{{key}: PATH}} mapping",
                                {key: conf if isinstance(conf, str) and conf else "/absolute/path"})
            continue
        if set(conf) - {key}:
            problems.add(f"{where}.{name}", f"must be {{{key}: PATH}}", f"write engines.{name}.{key}: /absolute/path")
            continue
        problems.check(f"{where}.{name}.{key}", conf.get(key), _on_node(f"{name} executable"))


def engine_map(engines: Mapping[str, Any]) -> dict[str, str]:
    """engine -> executable path from the inputs' {engine: {bin|python: PATH}}, in ENGINE_KEYS order."""
    return {name: engines[name][key] for name, key in ENGINE_KEYS.items() if name in engines and engines[name].get(key)}


def engines_input(engines: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The inputs' {engine: {bin|python: PATH}} from engine -> executable path."""
    return {name: {ENGINE_KEYS[name]: path} for name, path in engines.items()}


@dataclass(frozen=True)
class Fabric:
    """An InfiniBand fabric the node is cabled to, and its HCAs on it (never guessed: SPEC step 6)."""

    name: str
    """The fabric's name, as the control plane knows it."""
    hcas: Sequence[str]
    """The node's HCAs cabled to it (mlx5_0, ...)."""


def _fabrics(fabrics: Sequence[Mapping[str, Any]]) -> tuple[Fabric, ...]:
    return tuple(Fabric(f["name"], tuple(f["hcas"])) for f in fabrics)


@dataclass(frozen=True)
class Discovery:
    """Where the agent finds what it discovers; each written only when it differs from the agent's default."""

    nvidia_smi: str | None = setting("nvidiaSmi", _on_node("path of nvidia-smi"), default=None, agent_yaml="nvidia_smi",
                                     doc="nvidia-smi on the node, when it is not on the agent's PATH.")
    ib_root: str | None = setting("ibRoot", _on_node("InfiniBand sysfs directory"), default=None, agent_yaml="ib_root",
                                  agent_default=DEFAULT_IB_ROOT,
                                  doc=f"The node's InfiniBand sysfs directory (the agent's default: {DEFAULT_IB_ROOT}).")


def _servers_yaml(servers: Sequence[str]) -> dict[str, object]:
    """One control plane is agent.yaml's ``server``; several, in failover order, its ``servers``."""
    return {"server": servers[0]} if len(servers) == 1 else {"servers": list(servers)}


def _fabrics_yaml(fabrics: Sequence[Fabric]) -> dict[str, object]:
    return {"fabrics": [{"name": f.name, "hcas": list(f.hcas)} for f in fabrics]}


@dataclass(frozen=True)
class AgentSettings(FromProps):
    """What agent.yaml says beyond the TLS paths and the node id: only the overrides given (SPEC step 6).

    The one type for these settings: ``NodeArgs.settings`` and ``AgentInstallArgs.settings``
    take it (any value may be a pulumi Output there), the program builds it from stack
    config, and AgentInstall's provider renders agent.yaml from it (each setting under its
    ``agent_yaml`` key, in this order, the TLS paths and the node id after the control planes).
    In state each field is an input of AgentInstall under its own name.
    """

    servers: Sequence[str] = setting("servers", collect=collect_servers, convert=tuple, agent_yaml="servers",
                                     render=_servers_yaml,
                                     doc="Control planes as host:port; several in failover order (agent.yaml: "
                                         "server for one, servers for several).")
    mgmt_addr: str | None = setting("mgmtAddr", validate.address, default=None, agent_yaml="mgmt_addr",
                                    doc="The address the agent announces for management traffic.")
    mgmt_interface: str | None = setting("mgmtInterface", validate.interface, default=None,
                                         agent_yaml="mgmt_interface",
                                         doc="The network interface whose address the agent announces.")
    fabrics: Sequence[Fabric] = setting("fabrics", collect=collect_fabrics, schema=[FABRIC_SCHEMA], default=(),
                                        convert=_fabrics, agent_yaml="fabrics", render=_fabrics_yaml,
                                        doc="The InfiniBand fabrics the node is cabled to, each with its HCAs "
                                            "(never guessed); a node's stack config may say fabric for one.")
    discovery: Discovery = setting("discovery", nested=Discovery, default=Discovery(), agent_yaml="discovery",
                                   doc="Where the agent finds what it discovers.")
    engines: Mapping[str, str] = setting("engines", collect=collect_engines, convert=engine_map, to_input=engines_input,
                                         schema={e: {k: None} for e, k in ENGINE_KEYS.items()}, default_factory=dict,
                                         agent_yaml="engines", render=lambda engines: {"engines": engines_input(engines)},
                                         doc="engine -> its executable on the node (sglang: its python), each only "
                                             "when given.")

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems) -> None:
        collect_fields(AgentSettings, props, problems)


# --------------------------------------------------------------------------- the binary


FETCH_NODE, FETCH_OPERATOR = "node", "operator"


def _verification(value: object) -> validate.Problem:
    if value in VERIFICATIONS:
        return None
    return (f"{value!r} is not one of {', '.join(VERIFICATIONS)}",
            "leave it out: the Node component records how the release is verified")


UNVERIFIED_FIX = ("give agent.signingKey (the release signing key's public line, `ssh-ed25519 AAAA...`) or pin "
                  "agent.sha256 for this version ({{arch: sha256}}); or, knowingly, set agent.{opt_out}: true")


def _signing_key(value: object) -> validate.Problem:
    try:
        validate.normalise_host_key(value)  # type: ignore[arg-type]  # a non-str is refused like a bad key
    except (ValueError, TypeError):
        return ("is not an OpenSSH public key",
                "paste the public half of the release signing key, one line: 'ssh-ed25519 AAAAC3...' "
                "(`ssh-keygen -y -f KEY` prints it)")
    return None


def _fetch(value: object) -> validate.Problem:
    if value in (FETCH_NODE, FETCH_OPERATOR):
        return None
    return (f"{value!r} is not node or operator",
            "write node (each node downloads the release itself; the default) or operator (downloaded and "
            "verified here, pushed to the nodes over SSH: for nodes that cannot reach the release server)")


@dataclass(frozen=True)
class BinarySource(FromProps):
    """Where the agent binary (/usr/local/bin/llmgw on the node) comes from: a release, or a local build.

    A release tag is downloaded from ``release_url`` (by the node, or with
    ``fetch: operator`` by the operator's side, which pushes it) and must have
    the sha256 the operator's side approved for the node's architecture
    (``release_sha256``: pinned in stack config as ``sha256``, or read from the
    release's checksums.txt, signed by ``signing_key`` when given; see
    llmgw_pulumi.releases.approval), and report the tag as its ``--version``. Any other
    version is the local binary at ``binary_path``, copied as is (its sha256 is
    an input, so a rebuilt binary shows up in the preview). In stack config,
    ``binary`` is the local build whose ``--version`` gives the version.

    ``release_sha256``, ``signing_key``, ``release_ca`` and ``fetch`` say how a
    release is verified and carried: never a change to a node by themselves,
    and not compared by the diff (a preview, which fetches nothing, does not
    know the digests).
    """

    version: str = setting("version", validate.version,
                           doc="A release tag vX.Y.Z, or the version of the local build (in stack config, a local "
                               "build's --version gives it: empty until the program has read it, and in a preview, "
                               "which never runs the build).")
    release_url: str | None = setting("releaseUrl", validate.url, convert=lambda u: u.rstrip("/") or None, default=None,
                                      doc="The release server's base URL (https): <tag>/<file> is appended to it.")
    binary_path: str | None = setting("binary", lambda p: validate.abs_path(p, "local binary path"), default=None,
                                      doc="The local llmgw build to copy, for a version that is not a release tag.")
    binary_sha256: str | None = setting(None, lambda s: None if isinstance(s, str) and len(s) == 64 else (
        "is missing", "compute it from the local binary (the node component does)"), default=None,
        doc="The sha256 of the local build (the program computes it).")
    release_sha256: Mapping[str, str] | None = setting(
        "sha256", digests_problem, default=None, convert=lambda d: {a: h.lower() for a, h in d.items()},
        doc="arch -> the sha256 the release's binary must have: agent.sha256 (a pin), or as the operator's side "
            "read it.")
    signing_key: str | None = setting("signingKey", _signing_key, convert=validate.normalise_host_key, default=None,
                                      doc="The OpenSSH public key whose signature checksums.txt must carry "
                                          "(namespace llmgw-release).")
    release_ca: str | None = setting("releaseCa", lambda p: validate.abs_path(p, "CA bundle of the release server"),
                                     default=None, doc="A PEM bundle on the operator's machine: the only CA trusted "
                                                       "for the release server (None: the system's).")
    fetch: str | None = setting("fetch", _fetch, default=None,
                                doc="Who downloads a release: node (None: the default) or operator (pushed to the "
                                    "node over SSH).")
    allow_unverified_release: bool | None = setting(
        OPT_OUT_SETTING, validate.boolean, default=None,
        doc="true: install a release that neither agent.signingKey nor an agent.sha256 pin verifies, trusting "
            "checksums.txt as the release server sends it (a warning under each such node). Without it such a "
            "release is refused before any node is reached.")
    verification: str | None = setting(None, _verification, default=None,
                                       doc="How the binary is verified: signature, pin, opt-out or local build (the "
                                           "program records it; the release-verified policy rule judges it).")

    RELEASE_FIELDS = ("release_sha256", "signing_key", "release_ca", "fetch", "allow_unverified_release",
                      "verification")
    """How a release is verified and carried (see above)."""

    def verified_by(self) -> str | None:
        """How this source's binary is verified as configured (releases.policy.verification); None: a release
        nothing verifies. A local build whose --version is a release tag is not known here to be one."""
        return verification(not self.binary_path, self.signing_key, self.release_sha256,
                            self.allow_unverified_release)

    @property
    def is_release(self) -> bool:
        return bool(validate.RELEASE_TAG.match(self.version))

    @property
    def fetched_here(self) -> bool:
        return self.fetch == FETCH_OPERATOR

    @staticmethod
    def collect(props: Mapping[str, Any], problems: Problems, prefix: str = "") -> None:
        """A release tag with its URL, or another version with the local binary to copy.

        In stack config the binary is the local build, read later: there, it needs no version.
        """
        config = problems.in_stack_config
        key = names(BinarySource, problems.spelling)
        for name in (("signing_key", "fetch", "allow_unverified_release") +
                     (("release_sha256",) if not config else ()) + (() if config else ("release_ca", "verification"))):
            if props.get(key[name]) is not None:
                collect_one(BinarySource, name, props, problems, prefix)
        if config and props.get(key["release_sha256"]) is not None:  # per version, or for agent.version
            problems.check(prefix + key["release_sha256"], props.get(key["release_sha256"]), pins_problem)
        if config and props.get(key["release_ca"]) is not None:
            problems.check(prefix + key["release_ca"], props.get(key["release_ca"]), lambda v: None if isinstance(
                v, str) and v else ("is empty", "give the path of the release server's CA bundle (PEM) on this machine"))
        version, binary = props.get(key["version"]), props.get(key["binary_path"])
        if config and binary is not None and props.get(key["release_sha256"]) is not None:
            problems.add(prefix + key["release_sha256"], "pins a release, but a local build is given",
                         "remove sha256 (a local build is copied as it is), or give a release version instead of binary")
        if config and version is None and binary is not None:
            return
        if not config and version == "" and binary is not None and props.get(key["binary_sha256"]) is not None:
            # A local build a preview read and hashed but did not run (program.local_binary): its version is the
            # one recorded for the same sha256, or read by `pulumi up`.
            collect_one(BinarySource, "binary_path", props, problems, prefix)
            collect_one(BinarySource, "binary_sha256", props, problems, prefix)
            return
        problems.check(prefix + key["version"], version, validate.version)
        if is_unknown(version) or not isinstance(version, str) or validate.version(version):
            return
        if validate.RELEASE_TAG.match(version):
            collect_one(BinarySource, "release_url", props, problems, prefix)
            if not config:
                BinarySource._collect_verification(props, problems, prefix)
        elif binary is None:
            problems.add(prefix + key["binary_path"],
                         f"is missing: version {version} is not a release tag, so there is no release to fetch",
                         "give the local llmgw build to copy, or a release tag vX.Y.Z")
        elif not config:
            collect_one(BinarySource, "binary_path", props, problems)
            collect_one(BinarySource, "binary_sha256", props, problems)

    @staticmethod
    def _collect_verification(props: Mapping[str, Any], problems: Problems, prefix: str) -> None:
        """A release's ``verification`` record, when given, must be borne out by its inputs (a signing key for
        ``signature``, pins for ``pin``, the opt-out for ``opt-out``)."""
        given = {name: props.get(name) for name in ("signing_key", "release_sha256", "allow_unverified_release",
                                                     "verification")}
        if any(is_unknown(v) for v in given.values()):
            return
        record = given["verification"]
        needs = {SIGNATURE: "signing_key", PIN: "release_sha256", OPT_OUT: "allow_unverified_release"}
        if record == LOCAL_BUILD or record in needs and not given[needs[record]]:
            problems.add(prefix + "verification", f"says {record}, which this release's inputs do not bear out",
                         "leave it out: the Node component records how the release is verified")

    def unverified_release(self) -> tuple[str, str, str] | None:
        """(field, problem, fix) by input name when this is a release (its values known) that nothing verifies:
        no signing key, no release_sha256 pin, no opt-out. ``Node`` refuses it before any of its resources."""
        known = (self.version, self.binary_path, self.signing_key, self.release_sha256, self.allow_unverified_release)
        if any(is_unknown(v) or not isinstance(v, (str, Mapping, bool, type(None))) for v in known):
            return None  # an Output: its resource sees it once known
        if self.verification is not None or not self.is_release or self.verified_by() is not None:
            return None
        return ("signing_key", f"is missing, and no release_sha256 pin verifies release {self.version} either",
                UNVERIFIED_FIX.format(opt_out="allowUnverifiedRelease (BinarySource(..., allow_unverified_release=True))"))
