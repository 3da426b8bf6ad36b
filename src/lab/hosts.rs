//! The lab's hosts: a network namespace each, holding a TUN device whose other end is the
//! relay. Set up with iproute2, and removed whatever happens (drop, Ctrl-C, error), together
//! with every process still running inside.

use anyhow::{Context, Result, bail};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tun_rs::SyncDevice;

/// The hosts of a lab that names none: two, joined by one link.
pub const PAIR: [&str; 2] = ["left", "right"];
/// The TUN device's name inside each host.
pub const DEVICE: &str = "braid0";
/// Most hosts a lab may have: each is a thread in the relay, on a machine with few cores.
pub const MAX_HOSTS: usize = 16;

/// The address of a lab's host number `index` (from 0): 198.18.0.0/15 is reserved for
/// benchmarking (RFC 2544).
pub fn address(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, index as u8 + 1)
}

/// A host name a lab can use: it becomes part of a namespace's name and of `/etc/hosts`.
pub fn check_host_name(host: &str) -> Result<()> {
    if host.is_empty()
        || host.len() > 15
        || !host.starts_with(|c: char| c.is_ascii_lowercase())
        || !host
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        bail!(
            "host name {host:?}: use up to 15 lowercase letters, digits and '-', starting with a letter"
        );
    }
    Ok(())
}

pub fn namespace(lab: &str, host: &str) -> String {
    format!("{lab}-{host}")
}

/// Where running labs note their owner's pid, so `braid lab clean` can tell crashed labs from
/// running ones.
fn records() -> PathBuf {
    PathBuf::from("/run/braid-lab")
}

/// Packets a host's TUN device holds for the relay to read (its `txqueuelen`).
const TUN_RING: u32 = 10_000;

/// The hosts of a running lab. Dropping it tears everything down.
pub struct Lab {
    pub name: String,
    /// Host names, in the order of their addresses.
    pub hosts: Vec<String>,
    pub devices: Vec<Arc<SyncDevice>>,
    created: Vec<String>,
}

impl Lab {
    pub fn up(name: &str, hosts: &[String], mtu: u16) -> Result<Lab> {
        preflight()?;
        if hosts.len() < 2 || hosts.len() > MAX_HOSTS {
            bail!("a lab has 2 to {MAX_HOSTS} hosts, not {}", hosts.len());
        }
        for (i, h) in hosts.iter().enumerate() {
            check_host_name(h)?;
            if hosts[..i].contains(h) {
                bail!("host {h} is named twice");
            }
        }
        if name.is_empty()
            || name.len() > 20
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            bail!("lab name {name:?}: use up to 20 letters, digits and '-'");
        }
        for host in hosts {
            let ns = namespace(name, host);
            if std::path::Path::new("/run/netns").join(&ns).exists() {
                bail!(
                    "network namespace {ns} exists already: another lab named {name} is running, \
                     or a crashed one was left behind (`braid lab clean` removes those); or pick \
                     another --name"
                );
            }
        }
        let mut lab = Lab {
            name: name.to_string(),
            hosts: hosts.to_vec(),
            devices: Vec::new(),
            created: Vec::new(),
        };
        std::fs::create_dir_all(records()).context("cannot create /run/braid-lab")?;
        let me = std::process::id();
        // "PID START HOST,HOST,...": whose lab it is, and what `clean` must remove.
        let record = format!("{me} {} {}", start_time(me).unwrap_or(0), hosts.join(","));
        std::fs::write(records().join(name), record)
            .context("cannot write the lab record in /run/braid-lab")?;
        for (index, host) in hosts.iter().enumerate() {
            let ns = namespace(name, host);
            ip(&["netns", "add", &ns])?;
            lab.created.push(ns.clone());
            names_in(&ns, hosts)?;
            // IPv6 autoconfiguration would send router solicitations and MLD reports over the
            // link: switch IPv6 off before the device exists.
            run(Command::new("ip").args([
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]))?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            lab.devices.push(Arc::new(tun_in(&ns, mtu)?));
            let addr = format!("{}/24", address(index));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", DEVICE])?;
            // The ring between the kernel and the relay: a TUN drops what arrives while it is
            // full, a loss outside the model, when the relay is held up on a busy machine. Its
            // default 500 packets are 15 ms at 400 Mbit/s; 10,000 ride out a 120 ms stall at
            // 1 Gbit/s, at the cost of delay (also outside the model, but not a loss) only
            // while the relay catches up.
            ip(&[
                "-n",
                &ns,
                "link",
                "set",
                DEVICE,
                "txqueuelen",
                &TUN_RING.to_string(),
            ])?;
            // A TUN comes up DOWN, and writing to a DOWN TUN fails with EIO.
            ip(&["-n", &ns, "link", "set", DEVICE, "up"])?;
        }
        Ok(lab)
    }

    /// Packets each host's TUN dropped before the relay read them (its TX ring was full):
    /// drops outside the model.
    pub fn device_drops(&self) -> Vec<u64> {
        self.hosts
            .iter()
            .map(|h| tx_dropped(&namespace(&self.name, h)).unwrap_or(0))
            .collect()
    }

    fn down(&mut self) {
        for ns in self.created.drain(..) {
            remove_namespace(&ns);
        }
        self.devices.clear();
        let _ = std::fs::remove_file(records().join(&self.name));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.down();
    }
}

/// Root, /dev/net/tun and iproute2, or a message saying which is missing.
fn preflight() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("braid lab creates network namespaces and TUN devices: run it as root");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        bail!("/dev/net/tun is missing: load the tun module (modprobe tun)");
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        bail!("braid lab needs iproute2's `ip` command (apt-get install iproute2)");
    }
    Ok(())
}

/// Creates the TUN device inside namespace `ns`: the device is looked up and created in the
/// namespace of the calling thread, so a short-lived thread moves there first. The file
/// descriptor stays tied to the device afterwards.
fn tun_in(ns: &str, mtu: u16) -> Result<SyncDevice> {
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || -> Result<SyncDevice> {
        let handle = std::fs::File::open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        rustix::thread::move_into_link_name_space(
            handle.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .context("cannot enter the lab's network namespace")?;
        let dev = tun_rs::DeviceBuilder::new()
            .name(DEVICE)
            .mtu(mtu)
            .packet_information(false)
            .build_sync()
            .context("cannot create the TUN device")?;
        dev.set_nonblocking(true)?;
        Ok(dev)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread creating the TUN device panicked"))?
}

fn tx_dropped(ns: &str) -> Option<u64> {
    let out = Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", DEVICE])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v.get(0)?
        .get("stats64")?
        .get("tx")?
        .get("dropped")?
        .as_u64()
}

/// `ip netns exec` shows a namespace `/etc/netns/NS/hosts` as its `/etc/hosts`: the
/// machine's entries plus the lab's hosts. Programs that look up the name of an address
/// they serve (globus-gridftp-server does) then find it here instead of asking a DNS server
/// the namespace cannot reach.
fn names_in(ns: &str, hosts: &[String]) -> Result<()> {
    let dir = PathBuf::from("/etc/netns").join(ns);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    for (i, h) in hosts.iter().enumerate() {
        text += &format!("{} {h}\n", address(i));
    }
    std::fs::write(dir.join("hosts"), text)
        .with_context(|| format!("cannot write {}/hosts", dir.display()))
}

/// Stops every process inside `ns` (TERM, then KILL after a second), then deletes it.
fn remove_namespace(ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut signal = rustix::process::Signal::TERM;
    loop {
        let pids = namespace_pids(ns);
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            signal = rustix::process::Signal::KILL;
        }
        for pid in pids {
            let _ = rustix::process::kill_process(pid, signal);
        }
        if Instant::now() > deadline + Duration::from_secs(2) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = ip(&["netns", "del", ns]) {
        eprintln!("braid lab: cannot remove network namespace {ns}: {e:#}");
    }
    let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns));
}

fn namespace_pids(ns: &str) -> Vec<rustix::process::Pid> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|&p| p > 1 && p != std::process::id() as i32)
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}

/// The fields of `/proc/PID/stat` from the third (state) on; None if there is no such
/// process. The command name before them may hold spaces and parentheses: they start after
/// the last ')'.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// When process `pid` started (clock ticks after boot, field 22 of `/proc/PID/stat`); None if
/// there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Removes labs whose owning process is gone. Returns the names removed and the names still
/// running.
pub fn clean() -> Result<(Vec<String>, Vec<String>)> {
    let (mut removed, mut running) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(records()) else {
        return Ok((removed, running));
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(record) = Record::read(&name) else {
            continue;
        };
        if record.alive() {
            running.push(name);
            continue;
        }
        for host in &record.hosts {
            let ns = namespace(&name, host);
            if std::path::Path::new("/run/netns").join(&ns).exists() {
                remove_namespace(&ns);
            }
        }
        let _ = std::fs::remove_file(entry.path());
        removed.push(name);
    }
    Ok((removed, running))
}

/// What `/run/braid-lab/NAME` says of a lab.
pub struct Record {
    owner: Option<u32>,
    started: Option<u64>,
    pub hosts: Vec<String>,
}

impl Record {
    /// "PID START HOST,HOST,...", the hosts left and right when the record names none. None:
    /// no lab of that name is running (or left behind).
    pub fn read(lab: &str) -> Option<Record> {
        let text = std::fs::read_to_string(records().join(lab)).ok()?;
        let mut fields = text.split_whitespace();
        let owner = fields.next().and_then(|p| p.parse::<u32>().ok());
        let started = fields
            .next()
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|&t| t > 0);
        let hosts = match fields.next() {
            Some(h) => h.split(',').map(str::to_string).collect(),
            None => PAIR.map(str::to_string).to_vec(),
        };
        Some(Record {
            owner,
            started,
            hosts,
        })
    }

    /// The owner is alive if that process still runs and started then (not a later process
    /// that reuses its PID), whatever its binary is called.
    fn alive(&self) -> bool {
        self.owner.is_some_and(|pid| {
            let now = start_time(pid);
            now.is_some() && (self.started.is_none() || now == self.started)
        })
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
