#!/usr/bin/env bash
# Writes throw-away certificates for the TLS tests into DIR, with the
# openssl CLI (OpenSSL 3.0, Debian 12):
#   ca.pem                   the job's CA
#   server.pem/.key          dp-ps, signed by ca, SAN localhost + 127.0.0.1
#   client.pem/.key          a worker, signed by ca
#   other_ca.pem             another CA
#   other_client.pem/.key    a worker signed by other_ca
#   expired_client.pem/.key  signed by ca, valid only on 2020-01-01
# Usage: tests/make_test_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"

newkey() {  # newkey NAME SUBJECT: NAME.key and NAME.csr
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
}
newca() {  # newca NAME SUBJECT
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.pem" -days 2 -subj "$2" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
sign() {  # sign NAME CA EXTENSIONS
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 2 -sha256 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}

newca ca "/CN=dp-test-ca"
newca other_ca "/CN=dp-test-other-ca"

newkey server "/CN=dp-ps"
sign server ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"

newkey client "/CN=dp-worker"
sign client ca "extendedKeyUsage=clientAuth"

newkey other_client "/CN=dp-worker"
sign other_client other_ca "extendedKeyUsage=clientAuth"

# `openssl x509` of OpenSSL 3.0 cannot set a validity in the past;
# `openssl ca` can, with a minimal configuration.
newkey expired_client "/CN=dp-worker"
cat > ca.cnf <<'CNF'
[ ca ]
default_ca = test_ca
[ test_ca ]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any_name
unique_subject = no
x509_extensions = client_ext
[ any_name ]
commonName = supplied
[ client_ext ]
extendedKeyUsage = clientAuth
CNF
: > index.txt
echo 01 > serial
openssl ca -batch -notext -config ca.cnf -cert ca.pem -keyfile ca.key \
  -in expired_client.csr -out expired_client.pem \
  -startdate 20200101000000Z -enddate 20200102000000Z 2>/dev/null
rm -f ./*.csr ./*.ext ca.cnf index.txt* serial* ./*.old 01.pem
