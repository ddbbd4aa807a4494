# shellcheck shell=sh
# NodeIdentity's delete: remove the identity files, but only while the node
# still carries this resource's identity.
#
# remove-identity.sh DIRS ANCHOR CERT CERT_SHA [file PATH SHA | pending PATH | dir PATH]...
#   CERT, CERT_SHA  the certificate this resource installed. When the node's
#            certificate is another one, another resource (the same node under
#            a new id, a replacement) has installed its identity since, and
#            everything is left to it: the CA root and the trust anchor are
#            byte-identical for both, so only the certificate tells whose they are.
#   file     removed when it still holds SHA
#   pending  a key pair made on the node for a certificate never installed: removed
#   dir      removed when empty
begin_change "$1"
ANCHOR=$2 CERT=$3 CERT_SHA=$4
shift 4
anchor_before=$(sha256_of "$R$ANCHOR")
cert_now=$(sha256_of "$R$CERT")
if [ -n "$cert_now" ] && [ "$cert_now" != "$CERT_SHA" ]; then
  kv kept 'the node carries another identity now'
  exit 0
fi
dirs=''
while [ $# -gt 0 ]; do
  case $1 in
  file)
    if [ -e "$R$2" ]; then
      if [ "$(sha256_of "$R$2")" = "$3" ]; then rm -f "$R$2"; kv removed "$2"; else kv kept "$2"; fi
    fi
    shift 3 ;;
  pending) if [ -e "$R$2" ]; then rm -f "$R$2"; kv removed "$2"; fi; shift 2 ;;
  dir) dirs="$dirs$2
"; shift 2 ;;
  *) echo "remove-identity.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$anchor_before" != "$(sha256_of "$R$ANCHOR")" ]; then update_trust "$ANCHOR"; else kv trust unchanged; fi
printf '%s' "$dirs" | while IFS= read -r d; do rmdir "$R$d" 2>/dev/null || true; done
