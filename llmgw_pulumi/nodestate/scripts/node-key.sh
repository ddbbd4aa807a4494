# shellcheck shell=sh
# ClientCertificate's work on a node that makes its own key pair (keyOrigin
# node, the default): the private key is born on the node and never leaves it.
#
# node-key.sh read CERT KEY PENDING
#   Prints the node's certificate (a `text` line: public) and the public halves
#   of KEY and of PENDING (`key_spki`, `pending_spki`: base64 of their DER
#   SubjectPublicKeyInfo), so the operator can tell whether the node already
#   holds an identity to keep (one a script installed), or still holds the key
#   of its certificate, without anything secret crossing the network.
# node-key.sh make DIRS DIR DIR_MODE DIR_OWNER PENDING CN
#   Makes a new P-256 key pair at PENDING and prints its certificate signing
#   request (`csr`: base64 of the PEM). The key is written into a file mktemp
#   created 0600 for root under umask 077, next to PENDING, and renamed to
#   PENDING once complete: no other user can read it at any instant. The key in
#   use stays where it is until NodeIdentity installs the certificate signed
#   for the new one and renames PENDING over it in the same step.
case $1 in
read)
  report_text "$2"
  kv key_spki "$(spki_of_key "$R$3")"
  kv pending_spki "$(spki_of_key "$R$4")"
  ;;
make)
  begin_change "$2"
  DIR=$3 DIR_MODE=$4 DIR_OWNER=$5 PENDING=$6 CN=$7
  if ! command -v openssl >/dev/null 2>&1; then
    echo "the node has no openssl to make its key pair with; nothing was changed" >&2
    exit "$EXIT_NO_KEYGEN"
  fi
  ensure_dir "$DIR" "$DIR_MODE" "$DIR_OWNER"
  new_temp "$PENDING"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$t" >/dev/null 2>&1 || cannot_write "$PENDING"
  if ! csr=$(openssl req -new -key "$t" -subj "/CN=$CN" 2>/dev/null) || [ -z "$csr" ]; then
    echo "openssl could not make a certificate signing request (openssl req -new); nothing was changed" >&2
    exit 1
  fi
  stage_temp "$PENDING" 0600 root:root
  place
  kv csr "$(printf '%s\n' "$csr" | base64 -w0)"
  ;;
*)
  echo "node-key.sh: unknown action $1" >&2
  exit 2
  ;;
esac
