"""The package's errors: one root, one class per thing an operator must do differently.

Every error names the node it is about and ends with a one-line fix, because the
message is all an operator sees in `pulumi up` output. Library exceptions
(paramiko, socket, cryptography) are translated into these once, at the
boundary where they happen, and chained with ``raise ... from``.

Messages never contain key material: callers pass names, paths and
fingerprints, never PEM bodies.

A message may quote what a node printed (a script's stderr, an SSH server's
banner): every message and fix is made printable here (``text.printable``,
newlines kept), so no error can carry a control character to the terminal.

They are plain Python, so the modules that decide import no SDK to raise them; a ConfigError becomes
a ``pulumi.RunError`` where it reaches the SDK (``llmgw_pulumi.boundary``).

Fix texts name settings as the stack config spells them (``llmgw:ssh.wait``,
``hostKey``) and, where a program builds nodes itself, as the Args field
(``ConnectionArgs.wait``); tests/unit/test_fix_texts.py checks that each
exists.

The hierarchy (``__all__`` is this list; tests/unit/test_public_api.py keeps it and the tree true)::

    LlmgwError
    ├── ConfigError                 (a pulumi.RunError where the SDK sees it: no traceback)
    │   └── StackConfigError        every problem of the stack config at once
    ├── AuthorityError              the cluster CA
    ├── CertificateRequestError     the node's CSR
    ├── CertificatePolicyError      a certificate just signed here
    ├── SignerError                 the configured signer
    ├── SignedCertificateError      what the signer returned
    ├── UnreachableError            SSH to the node
    │   └── WaitExpired             ... within its wait (remembered by the pool)
    ├── HostKeyChangedError
    ├── AuthenticationError
    ├── SudoUnavailableError
    ├── ReleaseFetchError           the release, its verification
    ├── ChecksumMismatchError
    ├── ReleaseSignatureError
    ├── ReleaseVersionError
    ├── UnsafeDirectoryError        on the node
    ├── NodeDiskFullError
    ├── NodeBusyError
    ├── NodeLockUnavailableError
    ├── NodeChangedError            the node changed between its read and the change
    ├── NoKeygenError
    ├── NodeKeyMissingError
    ├── AgentStartError
    ├── AgentNotRegisteredError     the control plane does not list the node (llmgw:registration)
    ├── EngineWillNotRunError
    ├── NodeNotReadyError           the readiness verdict (failOnProblems)
    ├── RolloutStoppedError
    └── RemoteCommandError          anything else a node's command did
"""

from __future__ import annotations

from .text import printable

__all__ = [
    "LlmgwError", "ConfigError", "StackConfigError", "AuthorityError", "CertificateRequestError",
    "CertificatePolicyError", "SignerError", "SignedCertificateError", "UnreachableError", "WaitExpired",
    "HostKeyChangedError", "AuthenticationError", "SudoUnavailableError", "ReleaseFetchError", "ChecksumMismatchError",
    "ReleaseSignatureError", "ReleaseVersionError", "UnsafeDirectoryError", "NodeDiskFullError", "NodeBusyError",
    "NodeLockUnavailableError", "NodeChangedError", "NoKeygenError", "NodeKeyMissingError", "AgentStartError", "EngineWillNotRunError",
    "NodeNotReadyError", "RolloutStoppedError", "RemoteCommandError", "AgentNotRegisteredError",
]


class LlmgwError(Exception):
    """Root of the package's errors. A subclass declares only what differs: what it means (its docstring), its
    default ``fix`` and, where it carries more than a message, its fields."""

    fix = ""
    """Default fix, used when the raiser has nothing more specific to say."""

    def __init__(self, node: str, message: str, fix: str | None = None) -> None:
        self.node = printable(node)
        self.message = printable(message, keep="\n")
        self.fix = printable(fix if fix is not None else type(self).fix, keep="\n")
        text = f"{self.node}: {self.message}" if self.node else self.message
        if self.fix:
            text = f"{text}\n  fix: {self.fix}"
        super().__init__(text)

    def summary(self) -> str:
        """The error as one line of the end-of-run list of failed nodes (``failed_line``): the node, the first line
        of what happened and of its fix."""
        return failed_line(self.node, self.message, self.fix)


SUMMARY_WIDTH = 240
"""The most characters of a reason, and of a fix, in a failed node's line at the end of a run."""


def failed_line(node: str, reason: str, fix: str = "") -> str:
    """``"<node> failed: <reason's first line> (fix: <fix's first line>)"``, each part cut at SUMMARY_WIDTH: one line per
    failed node, so that the end of a failed run's output lists every node that failed, and why, on one screen."""
    def first(text: str) -> str:
        line = next((part.strip() for part in text.splitlines() if part.strip()), "")
        return line if len(line) <= SUMMARY_WIDTH else line[:SUMMARY_WIDTH - 3] + "..."

    line = f"{node or '?'} failed: {first(reason) or 'no reason given'}"
    return f"{line} (fix: {first(fix)})" if first(fix) else line


# --------------------------------------------------------------------------- the config


class ConfigError(LlmgwError):
    """A value in the stack config or in a resource's inputs is not acceptable.

    Where it reaches the Pulumi SDK (the program's ``run``, ``Node``, the
    providers' operations) it is raised as a ``pulumi.RunError`` too
    (``boundary.pulumi_errors``): the Python language host prints its message
    as an error and no traceback; there is nothing in the program's frames
    for an operator to fix.
    """

    def __init__(self, node: str, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(node, f"{field}: {problem}", fix)


class StackConfigError(ConfigError):
    """Every problem in the stack config at once, printed as a list (without a traceback, as any ConfigError)."""

    def __init__(self, problems: list[tuple[str, str, str, str]]) -> None:
        self.problems = problems
        self.field = "llmgw:*"
        LlmgwError.__init__(self, "", problems_text(problems), "")


def problems_text(problems: list[tuple[str, str, str, str]], what: str = "stack config") -> str:
    """'stack config has N problems:' (or ``what`` has) and one entry per (node, field, problem, fix), with its fix
    below."""
    head = f"{what} has {len(problems)} problem{'s' if len(problems) != 1 else ''}:"
    return "\n".join([head, *(f"  {node}: {name}: {problem}\n    fix: {fix}" for node, name, problem, fix in problems)])


# --------------------------------------------------------------------------- the CA, the certificate and the signer


class AuthorityError(LlmgwError):
    """The cluster CA is missing, unreadable, mismatched or expired."""

    fix = ("create one with 'llmgw ctl cert init-ca --dir <pki dir>', "
           "or point llmgw:pkiDir (NodeArgs.pki_dir) at the right directory")


class CertificateRequestError(LlmgwError):
    """The certificate signing request the node returned cannot be signed."""

    fix = ("check that the node's openssl works (`openssl req -help`); "
           "or give the node `keyOrigin: operator`")


class CertificatePolicyError(LlmgwError):
    """A certificate that was just signed does not meet the node certificate policy (``pki.check_node_certificate``)."""

    fix = ("this is a bug in the signer: "
           "report it with the problems above; nothing was installed")


class SignerError(LlmgwError):
    """The signer could not be run, failed, or answered with no certificate."""

    fix = ("check llmgw:signer (docs/operations.md, 'Signers'): "
           "run the signer by hand")


class SignedCertificateError(LlmgwError):
    """The certificate a signer returned is not the one asked for."""

    fix = ("do not use it: fix the signer's profile so that it issues what it is "
           "asked (docs/operations.md, 'Signers'); nothing was changed on the node")


# --------------------------------------------------------------------------- reaching the node over SSH


class UnreachableError(LlmgwError):
    """No SSH connection could be made before the wait deadline."""

    fix = ("check the address, that sshd runs and that nothing filters the SSH port; "
           "raise llmgw:ssh.wait (ConnectionArgs.wait) for slow boots")


class WaitExpired(UnreachableError):
    """The node did not answer SSH within its wait: remembered by the pool, so it is not waited for again at once."""


def host_key_fix(key_type: str | None = None, presented: str | None = None) -> str:
    """The fix of a changed host key: confirm the key on the machine itself, then declare the machine, never accept
    it blindly. ``key_type`` names the .pub file to read (ed25519 when not known); ``presented`` is the fingerprint
    the node showed (SHA256:...)."""
    kind = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(key_type or "ssh-ed25519", "ecdsa")
    shown = presented or "the fingerprint above"
    fix = (f"do not accept the new key on trust: another machine may be answering at this address. Confirm it on "
           f"the machine itself, on its console and not over this network: `ssh-keygen -lf "
           f"/etc/ssh/ssh_host_{kind}_key.pub` must print {shown}. If it does not, treat the machine as substituted. "
           f"If it does, pin the confirmed key as the node's hostKey (ConnectionArgs.host_key) and run `pulumi up`; "
           f"if the machine was also re-imaged (its /etc/llmgw is gone), onboard it afresh with the pin in place: "
           f"`pulumi up` with one `--replace <urn>` for each of the node's four resources (`pulumi stack "
           f"--show-urns`), or, for a VM of the program, by passing the VM to Node as replace_with")
    return fix


class HostKeyChangedError(LlmgwError):
    """The node presented a different SSH host key from the one recorded or pinned."""

    fix = host_key_fix()


class AuthenticationError(LlmgwError):
    """The node refused the SSH key."""

    fix = ("add the operator's public key to the user's ~/.ssh/authorized_keys on the node, "
           "or fix llmgw:ssh.user / llmgw:ssh.privateKeyPath (ConnectionArgs.user / private_key_path)")


class SudoUnavailableError(LlmgwError):
    """The SSH user is not root and cannot run `sudo -n`."""

    fix = ("give the SSH user passwordless sudo (e.g. '<user> ALL=(ALL) NOPASSWD:ALL' in /etc/sudoers.d/), "
           "or connect as root")


# --------------------------------------------------------------------------- the release


class ReleaseFetchError(LlmgwError):
    """The release binary or its checksums could not be downloaded (by the node, or here)."""

    fix = ("check agent.releaseUrl and that the node can reach it "
           "(and trusts its certificate), or set agent.fetch: operator")


class ChecksumMismatchError(LlmgwError):
    """A release binary does not match the sha256 the operator's side approved (or checksums.txt is malformed)."""

    fix = ("do not install it: the release or the path to it "
           "has been tampered with or corrupted; republish it")


class ReleaseSignatureError(LlmgwError):
    """The release's checksums.txt has no valid signature by the configured key; no node was touched."""

    fix = ("do not install it: checksums.txt was not signed by agent.signingKey; "
           "re-sign the release (`ssh-keygen -Y sign -n llmgw-release -f KEY checksums.txt`), or fix agent.signingKey")


class ReleaseVersionError(LlmgwError):
    """A release binary with the approved sha256 reports another version than the tag requested."""

    fix = ("do not install it: the release server serves another build under this tag; "
           "republish the release, or fix agent.version")


# --------------------------------------------------------------------------- on the node


class UnsafeDirectoryError(LlmgwError):
    """A directory this package installs files into (or one of its parents, or where a symlink on the way points) is
    writable by a user other than root."""

    fix = ("make the directory named above root's and writable by root only (`chown root:root DIR && chmod go-w DIR` "
           "on the node), check what is in it, then run `pulumi up` again")


class NodeDiskFullError(LlmgwError):
    """A file could not be written on the node; nothing was changed."""

    fix = ("free space on the node (`df -h /etc/llmgw /usr/local/bin /run`), "
           "then run `pulumi up` again")


class NodeBusyError(LlmgwError):
    """Another change by this package held the node's lock for too long."""

    fix = ("another `pulumi up` is changing this node: wait for it, "
           "or look for a stuck llmgw-pulumi script on the node")


class NodeLockUnavailableError(LlmgwError):
    """The node cannot take the lock that keeps two changes from overlapping; nothing was changed."""

    fix = ("install flock on the node (`apt-get install util-linux`), "
           "and keep /run owned by root and writable by root alone; then run `pulumi up` again")


class NodeChangedError(LlmgwError):
    """The node changed under a change twice running, each time after it was read; nothing was changed."""

    fix = ("something else is changing this node's files or agent: "
           "find it (another tool, a person), then run `pulumi up --refresh`")


class NoKeygenError(LlmgwError):
    """The node cannot make its own key pair: it has no openssl."""

    fix = ("install openssl on the node (`apt-get install openssl`), "
           "or give the node `keyOrigin: operator` to have its key made on the machine running Pulumi")


class NodeKeyMissingError(LlmgwError):
    """The private key made on the node for its certificate is not on the node any more."""

    fix = ("the key made on the node for this certificate is gone (/etc/llmgw was cleaned, or the node was re-imaged): "
           "run `pulumi up --refresh`, which sees the key gone and has a new pair made and signed on the machine "
           "whose host key is recorded (a re-imaged machine is refused until it is declared, see its host-key error)")


class AgentStartError(LlmgwError):
    """The agent did not stay running after it was (re)started."""

    fix = ("read the agent's journal on the node ('journalctl -u llmgw-agent'); "
           "the previous binary and config were restored")


class AgentNotRegisteredError(LlmgwError):
    """The agent runs, but the control plane did not list the node within llmgw:registration.timeoutSeconds."""

    fix = ("check the agent's log on the node (`journalctl -u llmgw-agent`): a control plane that refuses the node's "
           "certificate, or one it cannot reach, is named there; the control plane must accept the certificate "
           "(issued by the CA it trusts, its CN the node id), and llmgw:registration.command must ask the control "
           "plane the node uses (llmgw:servers); then run `pulumi up` again")


class EngineWillNotRunError(LlmgwError):
    """A configured inference engine cannot run on the node (raised only when failOnEngineProblems is set)."""

    fix = ("fix the engine installation on the node (see the hint for each engine), "
           "or correct its path in the config")


class NodeNotReadyError(LlmgwError):
    """The node is not ready: the readiness verdict found a critical problem of its GPUs, fabric, driver or
    engines (raised only when failOnProblems is set; llmgw_pulumi.health.readiness)."""

    fix = ("fix each critical problem as its fix says, then `pulumi up --refresh`; or take the node out of the "
           "stack until it is serviced")


class RolloutStoppedError(LlmgwError):
    """A node's update was not started: another node's update failed earlier in this rollout (llmgw:rollout)."""

    fix = ("fix the release or config that failed (its error is above), "
           "then run `pulumi up` again: nodes already updated stay updated")


class RemoteCommandError(LlmgwError):
    """A command on the node failed in a way none of the other errors describe."""

    fix = ("run the command by hand on "
           "the node to see why it fails")

    def __init__(self, node: str, message: str, fix: str | None = None, *, connection_broke: bool = False) -> None:
        super().__init__(node, message, fix)
        self.connection_broke = connection_broke
        """The SSH connection itself broke: what was running may not have finished."""
