"""Pulumi dynamic providers that onboard GPU inference nodes into an llmgw cluster.

    ClientCertificate -> NodeIdentity -> AgentInstall -> EngineCheck

chained by the ``Node`` component. See SPEC.md for what must hold on a node
after `pulumi up`, and README.md for how to run it.

A program of your own builds nodes with
``Node(name, NodeArgs(..., connection=ConnectionArgs(...), settings=AgentSettings(servers=[...], ...)))``;
every error it may raise is importable from here.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from .errors import (
    AgentStartError,
    AuthenticationError,
    AuthorityError,
    ChecksumMismatchError,
    ConfigError,
    EngineWillNotRunError,
    HostKeyChangedError,
    LlmgwError,
    NodeBusyError,
    NodeDiskFullError,
    ReleaseFetchError,
    ReleaseSignatureError,
    ReleaseVersionError,
    RemoteCommandError,
    SudoUnavailableError,
    UnreachableError,
    UnsafeDirectoryError,
)
from .node import ConnectionArgs, Node, NodeArgs
from .providers.agent import AgentInstall, AgentInstallArgs
from .providers.certificate import ClientCertificate, ClientCertificateArgs
from .providers.engines import EngineCheck, EngineCheckArgs
from .providers.identity import NodeIdentity, NodeIdentityArgs
from .specs import AgentSettings, Discovery, Fabric
from .stack_config import StackConfigError

try:
    __version__: str = _dist_version("llmgw-pulumi")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AgentInstall", "AgentInstallArgs", "AgentSettings", "AgentStartError", "AuthenticationError", "AuthorityError",
    "ChecksumMismatchError", "ClientCertificate", "ClientCertificateArgs", "ConfigError", "ConnectionArgs",
    "Discovery", "EngineCheck", "EngineCheckArgs", "EngineWillNotRunError", "Fabric", "HostKeyChangedError",
    "LlmgwError", "Node",
    "NodeArgs", "NodeBusyError", "NodeDiskFullError", "NodeIdentity", "NodeIdentityArgs", "ReleaseFetchError",
    "ReleaseSignatureError", "ReleaseVersionError", "RemoteCommandError", "StackConfigError", "SudoUnavailableError",
    "UnreachableError", "UnsafeDirectoryError",
]
