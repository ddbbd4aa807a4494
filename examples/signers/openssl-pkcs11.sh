#!/bin/sh
# A signer for llmgw:signer {kind: command}: signs a node's certificate with a
# CA key held in a PKCS#11 token (an HSM, or SoftHSM2), through openssl's
# pkcs11 engine (Debian: libengine-pkcs11-openssl). The key never leaves the
# token; this script only ever sees the CSR and the certificate.
#
#   llmgw:signer:
#     kind: command
#     ca: /srv/llmgw/ca.pem
#     command: [/usr/local/bin/openssl-pkcs11.sh]
#
# Reads the CSR PEM on stdin; prints the certificate PEM on stdout.
#
# From the operator's environment (set where `pulumi up` runs; never on the
# command line):
#   LLMGW_PKCS11_KEY   the CA key's PKCS#11 URI, e.g.
#                      pkcs11:token=llmgw-ca;object=ca;type=private
#   LLMGW_PKCS11_PIN   the token's user PIN
#   LLMGW_CA_CERT      the CA certificate (ca.pem) of that key
#   SOFTHSM2_CONF      (SoftHSM2 only) its configuration file
# From llmgw (one request each):
#   LLMGW_SUBJECT, LLMGW_NOT_BEFORE_ASN1, LLMGW_NOT_AFTER_ASN1, LLMGW_SERIAL,
#   LLMGW_EXTENSIONS (an openssl extfile: CA:FALSE, digitalSignature, clientAuth)
set -eu
: "${LLMGW_PKCS11_KEY:?the CA key URI (LLMGW_PKCS11_KEY) is not set}"
: "${LLMGW_PKCS11_PIN:?the token PIN (LLMGW_PKCS11_PIN) is not set}"
: "${LLMGW_CA_CERT:?the CA certificate (LLMGW_CA_CERT) is not set}"
: "${LLMGW_SUBJECT:?} ${LLMGW_NOT_BEFORE_ASN1:?} ${LLMGW_NOT_AFTER_ASN1:?} ${LLMGW_SERIAL:?} ${LLMGW_EXTENSIONS:?}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077
cat > "$work/req.pem"
printf '%s\n' "$LLMGW_EXTENSIONS" > "$work/ext.cnf"
# openssl ca takes exact start and end dates (openssl x509 -req only whole days);
# its database is a throwaway: the serial comes from llmgw, the record is in Pulumi's state.
: > "$work/index.txt"
printf '%s\n' "$LLMGW_SERIAL" > "$work/serial"
cat > "$work/ca.cnf" <<CNF
[ca]
default_ca = llmgw
[llmgw]
database = $work/index.txt
serial = $work/serial
new_certs_dir = $work
default_md = sha256
policy = supplied
unique_subject = no
copy_extensions = none
[supplied]
commonName = supplied
CNF
openssl ca -batch -notext -config "$work/ca.cnf" \
  -engine pkcs11 -keyform engine -keyfile "$LLMGW_PKCS11_KEY" -passin env:LLMGW_PKCS11_PIN \
  -cert "$LLMGW_CA_CERT" -in "$work/req.pem" -out "$work/cert.pem" \
  -subj "$LLMGW_SUBJECT" -startdate "$LLMGW_NOT_BEFORE_ASN1" -enddate "$LLMGW_NOT_AFTER_ASN1" \
  -extfile "$work/ext.cnf" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
cat "$work/cert.pem"
