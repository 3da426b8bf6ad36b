#!/usr/bin/env bash
# braid over TLS against curl over FTPS, from the same `braid serve` in the same run, on
# loopback: `braid get --tls -n 4`, `-n 1` and curl, ROUNDS times in turn, 1 GiB (SIZE_MIB)
# from a cached file to /dev/null. Prints seconds per run. Needs curl and openssl.
#     bench/tls_vs_curl.sh [ROUNDS] [SIZE_MIB]
set -euo pipefail
rounds=${1:-3}
size=${2:-1024}
braid="$(cd "$(dirname "$0")/.." && pwd)/target/release/braid"
[ -x "$braid" ] || { echo "build first: cargo build --release" >&2; exit 2; }
dir=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir"
mkdir root
openssl req -x509 -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout key.pem \
    -out cert.pem -days 1 -subj /CN=localhost -addext subjectAltName=DNS:localhost 2>/dev/null
head -c "$((size << 20))" /dev/urandom > root/big.bin
"$braid" serve --root root --listen 127.0.0.1:0 --tls-cert cert.pem --tls-key key.pem \
    --anonymous > serve.log 2>&1 &
server=$!
for _ in $(seq 50); do grep -q ftp:// serve.log && break; sleep 0.1; done
port=$(head -1 serve.log | grep -o '127.0.0.1:[0-9]*' | cut -d: -f2)
url="ftp://localhost:$port/big.bin"
cat root/big.bin > /dev/null
time_of() { /usr/bin/time -f "%e" "$@" 2>&1 >/dev/null | tail -1; }
for r in $(seq "$rounds"); do
    echo "round $r: braid --tls -n 4 $(time_of "$braid" get -q -n 4 --tls-ca cert.pem "$url" /dev/null) s," \
        "curl FTPS $(time_of curl -s --ssl-reqd --cacert cert.pem "$url" -o /dev/null) s," \
        "braid --tls -n 1 $(time_of "$braid" get -q -n 1 --tls-ca cert.pem "$url" /dev/null) s"
done
