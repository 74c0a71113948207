#!/usr/bin/env bash
# Make the secrets of a secured stack in DIR (default deploy/secrets): a random bearer token, a CA,
# and one certificate for every service, valid as server and client (mutual TLS) under the name
# specdec.internal plus the compose/Kubernetes service names. Then, for Kubernetes:
#   kubectl -n specdec create secret generic specdec-security --from-file=DIR
set -euo pipefail
dir="${1:-deploy/secrets}"
mkdir -p "$dir/ca" && cd "$dir"
umask 077
python3 -c "import secrets; print(secrets.token_urlsafe(32))" > token
openssl req -x509 -newkey rsa:3072 -nodes -keyout ca/ca.key -out ca.crt -days 365 -subj "/CN=specdec CA" 2>/dev/null
openssl req -newkey rsa:3072 -nodes -keyout tls.key -out tls.csr -subj "/CN=specdec.internal" 2>/dev/null
names="DNS:specdec.internal,DNS:localhost,IP:127.0.0.1,DNS:orchestrator,DNS:target,DNS:draft-1,DNS:draft-2"
names="$names,DNS:target.specdec.svc,DNS:orchestrator.specdec.svc"
printf "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$names" > ext.cnf
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca/ca.key -CAcreateserial -out tls.crt -days 365 -extfile ext.cnf 2>/dev/null
rm -f tls.csr ext.cnf ca.srl ca/ca.srl
echo "wrote token, ca.crt, tls.crt, tls.key in $dir (the CA key is in ca/: keep it out of the Secret)"
