# shellcheck shell=sh
# How the scripts end when they fail in a way the operator must hear about.
# The one place these numbers are written: remote.py reads this file into the
# Exit enum, and puts it first in every program that runs on a node.
EXIT_RELEASE_FETCH=71   # the release binary or its checksums.txt could not be downloaded
EXIT_CHECKSUM=72        # the binary does not match the checksum it must have
EXIT_AGENT_START=73     # the new agent did not stay running; the previous one was restored
EXIT_WRITE=74           # a file could not be written (disk full, read-only); nothing was changed
EXIT_BUSY=75            # another change to the node held its lock for too long
EXIT_NO_KEYGEN=76       # the node has no openssl to make its own key pair
EXIT_KEY_MISSING=77     # the key pair made on the node for this certificate is not there
EXIT_VERSION=78         # a release binary reports another version than the tag asked for; nothing was installed
EXIT_UNSAFE_DIR=79      # a directory to install into is writable by a user other than root; nothing was changed
EXIT_NO_LOCK=80         # the node cannot lock (no flock, or /run writable by others); nothing was changed
EXIT_STALE=81           # the node no longer holds what the plan was made from; nothing was changed
# shellcheck disable=SC2034 # each script uses the codes it needs; Python reads them all
readonly EXIT_RELEASE_FETCH EXIT_CHECKSUM EXIT_AGENT_START EXIT_WRITE EXIT_BUSY EXIT_NO_KEYGEN EXIT_KEY_MISSING \
  EXIT_VERSION EXIT_UNSAFE_DIR EXIT_NO_LOCK EXIT_STALE
