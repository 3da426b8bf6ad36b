"""Helpers the benchmark scripts share: free ports, servers started and stopped (vsftpd,
globus-gridftp-server), random files, certificates, CPU time of processes."""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRAID = os.path.join(ROOT, "target", "release", "braid")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.args[0]} did not listen on {port}")


def random_file(path, size):
    """Writes `size` random bytes to `path`, 64 MiB at a time."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n


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


def program(name):
    for d in ("/usr/sbin", "/sbin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


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


def start_vsftpd(servers, work, root, writable=False):
    """An anonymous vsftpd serving `root` on a free loopback port (see `vsftpd_conf`);
    returns the port."""
    port = free_port()
    conf = vsftpd_conf(work, root, "127.0.0.1", port, writable)
    wait_port(port, servers.start([program("vsftpd"), conf]))
    return port


def gridftp_command(home, addr, port):
    """An anonymous globus-gridftp-server (as this user) with `home` as its home directory,
    on addr:port."""
    user = os.environ.get("USER", "root")
    return [program("globus-gridftp-server"), "-aa", "-anonymous-user", user, "-auth-level", "0",
            "-p", str(port), "-control-interface", addr, "-data-interface", addr,
            "-home-dir", home, "-allow-root", "-log-level", "ERROR"]


def start_gridftp(servers, home):
    """globus-gridftp-server on a free loopback port (see `gridftp_command`); returns the
    port."""
    port = free_port()
    wait_port(port, servers.start(gridftp_command(home, "127.0.0.1", port)))
    return port


class Servers:
    """Processes to stop at the end, each in its own process group."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # p.pid leads its own group (start_new_session)
            except ProcessLookupError:
                pass
            p.wait()


def proc_cpu(pid):
    """CPU seconds (user + system) a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


