"""The operator's side of SSH authentication: host-key fingerprints, the operator's key, ssh-agent, login.

- Keys, in the order they are tried (OpenSSH's order for an explicit -i):
  1. the configured key, given inline (the llmgw:sshPrivateKey secret) or by
     path, decrypted with ``Connection.passphrase`` if it is protected;
  2. every key of the ssh-agent at ``$SSH_AUTH_SOCK``, in the agent's order.
  A refusal names every key tried, by fingerprint.
- Errors never quote a key or a passphrase.

llmgw_pulumi.ssh.transport connects, checks host keys and runs scripts; it logs in with ``login``.
"""

from __future__ import annotations

import base64
import io
import logging
import os

import paramiko

from ..config.specs import Connection
from ..errors import AuthenticationError, ConfigError, UnreachableError

log = logging.getLogger(__name__)


def fingerprint(host_key: str) -> str:
    """OpenSSH-style SHA256 fingerprint of 'type base64' public key text."""
    key_type, blob = host_key.split()[:2]
    return str(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)).fingerprint)


def same_key(expected: str, presented: str) -> bool:
    """Is ``presented`` ('type base64', as the server sent it) the key ``expected`` (pinned or recorded)?"""
    return expected.split()[:2] == presented.split()[:2]


KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
"""The key types an operator's SSH key may be, in the order paramiko is asked to load it."""


def load_private_key(conn: Connection, node: str) -> paramiko.PKey | None:
    """The configured SSH key (OpenSSH or traditional PEM; ed25519, ECDSA or RSA), loaded by paramiko; None if none is.

    Given inline (the llmgw:sshPrivateKey secret) or read now from its path on
    this machine; a protected key is decrypted with the configured passphrase.
    Errors never quote the key or the passphrase.
    """
    text = conn.private_key
    if not text and conn.private_key_path:
        try:
            with open(os.path.expanduser(conn.private_key_path)) as f:  # ~/...: this machine's user's home
                text = f.read()
        except OSError as exc:
            raise ConfigError(node, "connection.private_key_path", f"cannot read {conn.private_key_path}: {exc.strerror}",
                              "run Pulumi where the operator's SSH key is, or fix llmgw:ssh.privateKeyPath") from None
    if not text:
        return None
    field = "connection.private_key" if conn.private_key else "connection.private_key_path"
    for cls in KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text), password=conn.passphrase)
        except paramiko.PasswordRequiredException:  # asked only when no passphrase was given
            raise ConfigError(node, field, "is protected by a passphrase, and none is configured",
                              "set it as a secret: `pulumi config set --secret llmgw:sshKeyPassphrase`, "
                              "or load the key into ssh-agent") from None
        except (paramiko.SSHException, ValueError, TypeError):
            continue  # another type; or, for an encrypted key, a wrong passphrase
    if conn.passphrase is not None and _encrypted(text):
        raise ConfigError(node, field, "cannot be decrypted with the configured passphrase",
                          "fix the llmgw:sshKeyPassphrase secret")
    raise ConfigError(node, field, "cannot be parsed", "give an OpenSSH or PEM private key (ed25519, ECDSA or RSA)")


def _encrypted(text: str) -> bool:
    """Is this private key protected by a passphrase? (paramiko asks for one when loading it without.)"""
    for cls in KEY_CLASSES:
        try:
            cls.from_private_key(io.StringIO(text))
            return False
        except paramiko.PasswordRequiredException:
            return True
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    return False


def agent_keys() -> list[paramiko.AgentKey]:
    """The keys of the ssh-agent at $SSH_AUTH_SOCK (none when there is no agent)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    try:
        return list(paramiko.Agent().get_keys())
    except (paramiko.SSHException, OSError) as exc:
        log.warning("the ssh-agent at $SSH_AUTH_SOCK did not answer (%s); not using it", exc)
        return []


def login(transport: paramiko.Transport, user: str, host: str, conn: Connection, node: str) -> None:
    """Authenticate with the configured key, then with the agent's keys; name every key tried on refusal."""
    candidates: list[tuple[str, paramiko.PKey]] = []
    key = load_private_key(conn, node)
    if key is not None:
        candidates.append((f"key {conn.private_key_path or 'llmgw:sshPrivateKey'}", key))
    candidates += [("ssh-agent key", k) for k in agent_keys()]
    if not candidates:
        raise ConfigError(node, "connection.private_key_path", "no SSH key is configured and no ssh-agent has one",
                          "set llmgw:ssh.privateKeyPath (or the llmgw:sshPrivateKey secret), or add the key to ssh-agent")
    tried = []
    for label, candidate in candidates:
        try:
            transport.auth_publickey(user, candidate)
            return
        except paramiko.AuthenticationException:
            tried.append(f"{label} {candidate.fingerprint}")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise UnreachableError(node, f"the SSH connection to {user}@{host} broke during login: {exc}") from exc
    raise AuthenticationError(node, f"{user}@{host} refused every key tried: {', '.join(tried)}")
