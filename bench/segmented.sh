#!/usr/bin/env bash
# Segmented downloads from a plain FTP server across an emulated link: vsftpd in the lab's
# `right` host serves one file; from `left`, in turn for ROUNDS rounds, `braid get -n 1`,
# `braid get -n N` (ranges on N sessions) and `lftp pget -n N` fetch it into files. Prints
# seconds per run and MB/s. Needs root, vsftpd and lftp.
#     sudo [BRAID_N=M] bench/segmented.sh [ROUNDS] [SIZE_MIB] [N] [LAB ARGS...]   (braid -n M, lftp -n N)
#     sudo bench/segmented.sh 2 256 8 --scenario lfn-500m --rate 200mbit --queue 3750000B
set -euo pipefail
rounds=${1:-2}
size=${2:-256}
n=${3:-8}
shift 3 || true
lab=("$@")
[ "${#lab[@]}" -gt 0 ] || lab=(--scenario lfn-500m --rate 200mbit --queue 3750000B)
here="$(cd "$(dirname "$0")/.." && pwd)"
braid="$here/target/release/braid"
[ -x "$braid" ] || { echo "build first: cargo build --release" >&2; exit 2; }
vsftpd=$(command -v vsftpd || echo /usr/sbin/vsftpd)
[ -x "$vsftpd" ] && command -v lftp >/dev/null || { echo "needs vsftpd and lftp" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
mkdir -p "$dir/root" "$dir/empty"
head -c "$((size << 20))" /dev/urandom > "$dir/root/f.bin"
# The scripts' one vsftpd configuration (bench/common.py, as src/bench/servers.rs for braid).
python3 -c "import sys; sys.path.insert(0, sys.argv[1]); from common import vsftpd_conf; vsftpd_conf(sys.argv[2], sys.argv[2] + '/root', '198.18.0.2', 2121)" \
  "$(dirname "$0")" "$dir"
cat > "$dir/client.sh" <<EOF
#!/bin/sh
url=ftp://198.18.0.2:2121/f.bin
t() { s=\$(date +%s.%N); "\$@" >/dev/null 2>&1 || echo "FAILED: \$*"; e=\$(date +%s.%N); awk "BEGIN { printf \\"%.2f\\", \$e - \$s }"; }
for r in \$(seq $rounds); do
  a=\$(t $braid get -q -n 1 "\$url" $dir/one.bin)
  rm -f $dir/one.bin
  b=\$(t $braid get -q -n ${BRAID_N:-$n} "\$url" $dir/got.bin)
  rm -f $dir/got.bin
  c=\$(t lftp -e "set net:max-retries 1; pget -n $n \$url -o $dir/lftp.bin; quit")
  rm -f $dir/lftp.bin
  echo "round \$r: braid -n 1 \$a s, braid -n ${BRAID_N:-$n} \$b s, lftp pget -n $n \$c s ($size MiB)"
done
EOF
chmod +x "$dir/client.sh"
"$braid" lab run --name "seg$$" "${lab[@]}" --timeout 1800 \
    --server "$vsftpd $dir/vsftpd.conf" --client "$dir/client.sh" 2>&1 |
    grep -E "^round|FAILED|error" || true
