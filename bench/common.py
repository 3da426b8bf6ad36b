"""Helpers the benchmark scripts share: random files, certificates, the vsftpd configuration,
CPU time of processes."""

import os
import resource
import subprocess


def random_file(path, size):
    """Writes `size` random bytes to `path`, 64 MiB at a time."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n


def text_file(path, size):
    """Writes `size` bytes of `braid bench --data text` (seed 0) to `path`: web-server log
    lines from the same xorshift generator, so that zstd finds in them what it finds in the
    bench's file."""
    m = (1 << 64) - 1
    x = 0x9E3779B97F4A7C15
    paths = ["/index.html", "/api/v1/items", "/static/app.js", "/static/style.css",
             "/api/v1/users", "/images/logo.png", "/search", "/api/v1/orders"]
    codes = [200, 200, 200, 304, 404, 500]
    with open(path, "wb") as f:
        left = size
        while left:
            lines = []
            for _ in range(100_000):
                x ^= (x << 13) & m
                x ^= x >> 7
                x ^= (x << 17) & m
                r = x
                lines.append("10.%d.%d.%d - - [28/Nov/2026:%02d:%02d:%02d +0000] \"GET %s?id=%d HTTP/1.1\" %d %d %.3f\n" % (
                    r % 4, (r >> 8) % 256, (r >> 16) % 256, (r >> 24) % 24, (r >> 29) % 60,
                    (r >> 35) % 60, paths[(r >> 41) % 8], (r >> 44) % 100000, codes[(r >> 61) % 6],
                    (r >> 20) % 50000, ((r >> 50) % 2000) / 1000.0))
            chunk = "".join(lines).encode()[:left]
            f.write(chunk)
            left -= len(chunk)


def certificate(work, host):
    """A self-signed certificate (and key) for `host`, a name or an IPv4 address, in `work`:
    made once, with openssl, as admins make them."""
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    if not os.path.exists(cert):
        san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
        subprocess.run(
            ["openssl", "req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", key, "-out", cert, "-days", "1",
             "-subj", f"/CN={host}", "-addext", f"subjectAltName={san}"],
            check=True, capture_output=True)
    return cert, key


def vsftpd_conf(work, root, addr, port, writable=False):
    """A vsftpd configuration (in `work`) for an anonymous server of `root` on addr:port,
    uploads too when `writable`; returns its path. The same as braid's own
    (`vsftpd_conf` in src/bench/servers.rs), for the scripts. Run by its launching user,
    vsftpd does not chroot: paths in commands are relative to `root` or absolute here."""
    empty = os.path.join(work, "empty")
    os.makedirs(empty, exist_ok=True)
    conf = os.path.join(work, "vsftpd.conf")
    write = ("write_enable=YES\nanon_upload_enable=YES\nanon_mkdir_write_enable=YES\n"
             "anon_other_write_enable=YES\nanon_umask=022\n") if writable else ""
    with open(conf, "w") as f:
        f.write(f"listen=YES\nlisten_ipv6=NO\nlisten_address={addr}\nlisten_port={port}\n"
                f"background=NO\nanonymous_enable=YES\nlocal_enable=NO\nanon_root={root}\n"
                f"no_anon_password=YES\nseccomp_sandbox=NO\nrun_as_launching_user=YES\n{write}"
                f"max_clients=0\nmax_per_ip=0\n"
                f"pasv_enable=YES\npasv_address={addr}\nsecure_chroot_dir={empty}\nxferlog_enable=NO\n")
    return conf


def raise_fd_limit(clients):
    """Lifts the soft limit on open files for `clients` at once: each client process holds a
    few descriptors, the server a control and up to 4 data connections per session, plus a
    handle on each."""
    need = 16 * clients + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
        except (ValueError, OSError):
            pass


def proc_cpu(pid):
    """CPU seconds (user + system) a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


