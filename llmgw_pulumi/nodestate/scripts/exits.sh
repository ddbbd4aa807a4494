# shellcheck shell=sh
# How the scripts end when they fail in a way the operator must hear about.
# The one place these numbers are written: remote.py reads this file into the
# Exit enum, and puts it first in every program that runs on a node. Beside
# each code, the error the operator's side raises for it: what the code means
# and its fix are that class's, in llmgw_pulumi/errors.py.
EXIT_RELEASE_FETCH=71   # ReleaseFetchError
EXIT_CHECKSUM=72        # ChecksumMismatchError
EXIT_AGENT_START=73     # AgentStartError
EXIT_WRITE=74           # NodeDiskFullError
EXIT_BUSY=75            # NodeBusyError
EXIT_NO_KEYGEN=76       # NoKeygenError
EXIT_KEY_MISSING=77     # NodeKeyMissingError
EXIT_VERSION=78         # ReleaseVersionError
EXIT_UNSAFE_DIR=79      # UnsafeDirectoryError
EXIT_NO_LOCK=80         # NodeLockUnavailableError
EXIT_STALE=81           # NodeChangedError
# shellcheck disable=SC2034 # each script uses the codes it needs; Python reads them all
readonly EXIT_RELEASE_FETCH EXIT_CHECKSUM EXIT_AGENT_START EXIT_WRITE EXIT_BUSY EXIT_NO_KEYGEN EXIT_KEY_MISSING \
  EXIT_VERSION EXIT_UNSAFE_DIR EXIT_NO_LOCK EXIT_STALE
