"""Pulumi dynamic providers that onboard GPU inference nodes into an llmgw cluster.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

chained by the ``Node`` component. See SPEC.md for what must hold on a node
after `pulumi up`, and README.md for how to run it.

A program of your own builds nodes with
``Node(name, NodeArgs(..., connection=ConnectionArgs(...), settings=AgentSettings(servers=[...], ...)))``;
every error it may raise is importable from here.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version

from .agent_settings import AgentSettings, BinarySource, Discovery, Fabric
from .errors import (
    AgentStartError,
    AuthenticationError,
    AuthorityError,
    CertificatePolicyError,
    CertificateRequestError,
    ChecksumMismatchError,
    ConfigError,
    EngineWillNotRunError,
    HostKeyChangedError,
    LlmgwError,
    NodeBusyError,
    NodeDiskFullError,
    NodeKeyMissingError,
    NodeLockUnavailableError,
    NoKeygenError,
    ReleaseFetchError,
    ReleaseSignatureError,
    ReleaseVersionError,
    RemoteCommandError,
    RolloutStoppedError,
    SignedCertificateError,
    SignerError,
    StackConfigError,
    SudoUnavailableError,
    UnreachableError,
    UnsafeDirectoryError,
    WaitExpired,
)
from .node import ConnectionArgs, Node, NodeArgs, node_settings
from .providers.agent import AgentInstall, AgentInstallArgs
from .providers.certificate import ClientCertificate, ClientCertificateArgs
from .providers.engines import EngineCheck, EngineCheckArgs
from .providers.identity import NodeIdentity, NodeIdentityArgs
from .schema import SettingInfo

try:
    __version__: str = _dist_version("llmgw-pulumi")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    # the component, its resources and their Args
    "Node", "NodeArgs", "ConnectionArgs", "AgentSettings", "Discovery", "Fabric", "BinarySource",
    # every setting of a node, described (for schemas in other languages)
    "node_settings", "SettingInfo",
    "ClientCertificate", "ClientCertificateArgs", "NodeIdentity", "NodeIdentityArgs",
    "AgentInstall", "AgentInstallArgs", "EngineCheck", "EngineCheckArgs",
    # every error (errors.__all__, in the order of its hierarchy)
    "LlmgwError", "ConfigError", "StackConfigError", "AuthorityError", "CertificateRequestError",
    "CertificatePolicyError", "SignerError", "SignedCertificateError", "UnreachableError", "WaitExpired",
    "HostKeyChangedError", "AuthenticationError", "SudoUnavailableError", "ReleaseFetchError", "ChecksumMismatchError",
    "ReleaseSignatureError", "ReleaseVersionError", "UnsafeDirectoryError", "NodeDiskFullError", "NodeBusyError",
    "NodeLockUnavailableError", "NoKeygenError", "NodeKeyMissingError", "AgentStartError", "EngineWillNotRunError",
    "RolloutStoppedError", "RemoteCommandError",
    "__version__",
]
