#!/usr/bin/env bash
# Certificates for a Flower 1.42 deployment (SuperLink with TLS), and optional
# SuperNode authentication keys.
#
#   make_certs.sh [--out DIR] [--host NAME_OR_IP]... [--supernode-keys N] [--days N] [--force]
#
# Writes into DIR (default: ./certificates):
#   ca.crt ca.key            a private certificate authority (keep ca.key off the SuperNodes)
#   server.pem server.key    the SuperLink's certificate, signed by the CA, valid for
#                            localhost, 127.0.0.1, ::1 and every --host given
#   supernode-<i>, supernode-<i>.pub   (with --supernode-keys N, i = 0..N-1) ECDSA P-384
#                            key pairs in OpenSSH format for SuperNode authentication
#
# The SuperLink gets ca.crt, server.pem and server.key (--ssl-ca-certfile,
# --ssl-certfile, --ssl-keyfile); every SuperNode and the `flwr` CLI get ca.crt only
# (--root-certificates, and `root-certificates` in the SuperLink connection).
set -euo pipefail

out=certificates
days=365
nkeys=0
force=0
hosts=()

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --host) hosts+=("${2:?--host needs a name or an IP address}"); shift 2 ;;
    --supernode-keys) nkeys=${2:?--supernode-keys needs a number}; shift 2 ;;
    --days) days=${2:?--days needs a number}; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "make_certs.sh: unknown argument '$1'" >&2; usage 2 >&2 ;;
  esac
done
case "$nkeys" in ''|*[!0-9]*) echo "make_certs.sh: --supernode-keys must be a number" >&2; exit 2 ;; esac
case "$days" in ''|*[!0-9]*) echo "make_certs.sh: --days must be a number" >&2; exit 2 ;; esac
command -v openssl >/dev/null || { echo "make_certs.sh: openssl not found" >&2; exit 1; }

mkdir -p "$out"
if [ -e "$out/ca.key" ] && [ "$force" = 0 ]; then
  echo "make_certs.sh: $out/ca.key exists; pass --force to replace the CA and certificates" >&2
  exit 1
fi

# Subject alternative names: what SuperNodes and the CLI may call the SuperLink.
san="DNS:localhost,IP:127.0.0.1,IP:::1"
for h in "${hosts[@]+"${hosts[@]}"}"; do
  if [[ "$h" =~ ^[0-9]+(\.[0-9]+){3}$ || "$h" == *:* ]]; then
    san+=",IP:$h"
  else
    san+=",DNS:$h"
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
umask 077  # private keys readable by their owner only

# 1. The certificate authority (EC P-256: fast on small devices).
cat > "$tmp/ca.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = lips-flwr deployment CA
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EOF
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days "$days" -sha256 -config "$tmp/ca.cnf" \
  2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }

# 2. The SuperLink's key and certificate, signed by the CA.
cat > "$tmp/server.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = ${hosts[0]:-localhost}
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = $san
EOF
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/server.key" -out "$tmp/server.csr" -config "$tmp/server.cnf" \
  2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
openssl x509 -req -in "$tmp/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
  -CAcreateserial -CAserial "$tmp/ca.srl" -out "$out/server.pem" -days "$days" -sha256 \
  -extfile "$tmp/server.cnf" -extensions v3_server \
  2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
chmod 644 "$out/ca.crt" "$out/server.pem"
openssl verify -CAfile "$out/ca.crt" "$out/server.pem" >/dev/null

# 3. Optional SuperNode authentication keys (OpenSSH format, NIST P-384),
#    registered on the SuperLink with `flwr supernode register <key>.pub <connection>`.
for ((i = 0; i < nkeys; i++)); do
  key="$out/supernode-$i"
  rm -f "$key" "$key.pub"
  if command -v ssh-keygen >/dev/null; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "$key"
  else  # no OpenSSH client: the `cryptography` package that Flower depends on
    python3 - "$key" <<'EOF'
import sys
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec
key = ec.generate_private_key(ec.SECP384R1())
open(sys.argv[1], "wb").write(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.OpenSSH, s.NoEncryption()))
open(sys.argv[1] + ".pub", "wb").write(key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH) + b"\n")
EOF
  fi
  chmod 644 "$key.pub"
done

echo "make_certs.sh: wrote ca.crt ca.key server.pem server.key$([ "$nkeys" -gt 0 ] && echo " supernode-{0..$((nkeys - 1))}[.pub]") in $out"
echo "make_certs.sh: the SuperLink certificate is valid for $san"
