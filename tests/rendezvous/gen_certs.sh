#!/bin/sh
# Makes the certificates the TLS tests use, in directory $1:
#   ca.pem/ca.key            a test CA
#   server.pem/server.key    signed by it, for 127.0.0.1 and localhost
#   client.pem/client.key    signed by it (mTLS client), with no Common Name: etcd's JSON
#                            gateway refuses one that has a CN when auth is on
#   client-cn.pem/.key       the same with a Common Name (to see that refusal named)
#   other-ca.pem             an unrelated CA (the "wrong CA" test)
set -eu
d=$1
cd "$d"
command -v openssl >/dev/null || { echo "openssl is missing: apt-get install openssl" >&2; exit 1; }
days=2
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days $days -subj "/CN=newt test CA" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days $days -subj "/CN=newt other CA" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days $days -extfile server.ext 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/O=newt client" 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days $days -extfile client.ext 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout client-cn.key -out client-cn.csr -subj "/CN=newt-client" 2>/dev/null
openssl x509 -req -in client-cn.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client-cn.pem -days $days -extfile client.ext 2>/dev/null
