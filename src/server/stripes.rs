//! The front end of a striped server (`braid serve --data-nodes`): each session's control
//! connections to the data nodes, made with braid's own client and the node key; SPAS
//! answered with every node's passive address; and each striped transfer run by ordering
//! every node to move its stripe (`OPTS BRAID NODE`), then waiting for all of them. The nodes
//! read and write the shared filesystem themselves; only commands pass through here.

use super::data::{DataError, Finished, Job};
use crate::client::control::Control;
use crate::client::url::Target;
use braid_proto::Command;
use braid_proto::command::Mode;
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::RetrOpts;
use braid_proto::stripes::NodeOrder;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The one account a data node has: its front end's.
pub const NODE_USER: &str = "braid-node";

/// How often what a node's range markers said (it sends them every 5 s or 32 MiB) joins the
/// order's.
const GATHER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Most data nodes one front end drives.
pub const MOST_NODES: usize = 64;

/// What a front end knows of its nodes.
pub struct FrontEnd {
    /// HOST:PORT of each node.
    pub nodes: Vec<String>,
    /// The secret the nodes take as the password of [`NODE_USER`].
    pub key: String,
    /// The shared root, the nodes' `--root` too: paths are given to them relative to it.
    pub root: PathBuf,
    /// With TLS: the nodes show the front end's own certificate, and its control connections
    /// to them accept that one alone; striped data under PROT P is then TLS too.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Without the key: a configuration may be logged.
impl std::fmt::Debug for FrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontEnd")
            .field("nodes", &self.nodes)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// One striped transfer, as the front end tells the nodes.
pub struct Order {
    /// RETR or STOR of the path as the nodes see it (relative to the shared root).
    pub command: Command,
    /// The client, whose data connections each node takes.
    pub client: IpAddr,
    /// What the client already holds (a download) or the file already holds (an upload).
    pub have: RangeSet,
    pub block: u64,
    pub elastic: bool,
    /// The client's cap on the whole transfer (bytes/s), shared evenly by the nodes.
    pub max_rate: Option<u64>,
    /// PROT P: the binding of the client's TLS session with the front end, which each of its
    /// data connections to a node proves (the node is the TLS server there).
    pub binding: Option<[u8; 32]>,
    /// An upload: what the nodes' range markers say is stored, gathered as they come, for
    /// the front end's own markers to the client (whose `--resume` after a crash needs them).
    pub stored: Arc<Mutex<RangeSet>>,
}

/// The client of a striped transfer: its address, and its TLS session's binding (if any).
pub(super) struct Client {
    pub ip: IpAddr,
    pub binding: Option<[u8; 32]>,
}

/// The nodes' order for transfer `t` of a session whose account's root is `account_root`
/// (`size`: a download's, from the file; `nodes`: how many the last SPAS listed).
pub(super) fn order(
    front: &FrontEnd,
    account_root: &std::path::Path,
    t: &braid_proto::session::Transfer,
    b: &braid_proto::session::BlockMode,
    size: Option<u64>,
    client: Client,
    nodes: u32,
) -> Result<Order, String> {
    let binding = match (t.private, client.binding) {
        (false, _) => None,
        (true, Some(b)) if front.tls.is_some() => Some(b),
        (true, _) => {
            return Err("private data needs TLS between the front end and its nodes".into());
        }
    };
    // The nodes serve the shared root; the account's root must lie within it.
    let within = account_root
        .strip_prefix(&front.root)
        .map_err(|_| "this account's root is outside the data nodes' shared root".to_string())?;
    let mut path = String::new();
    for part in within.components() {
        path.push('/');
        path.push_str(&part.as_os_str().to_string_lossy());
    }
    path.push_str(&t.path().to_string());
    let command = match &t.kind {
        braid_proto::session::TransferKind::Retr(_) => Command::Retr(path),
        braid_proto::session::TransferKind::Stor(_) => Command::Stor(path),
        _ => return Err("only RETR and STOR are striped".into()),
    };
    let size = size.or(t.allocate).unwrap_or(0);
    Ok(Order {
        command,
        client: client.ip,
        have: b.have.clone(),
        block: braid_proto::stripes::block_for(size, nodes),
        elastic: b.elastic,
        max_rate: b.max_rate,
        binding,
        stored: Arc::new(Mutex::new(b.have.clone())),
    })
}

/// Runs a striped transfer on a blocking thread: the nodes move it; an upload is then read
/// back whole for its checksum (the nodes wrote it, no byte passed here), which the session
/// compares with the client's before the file takes its name. A download's file is hashed
/// meanwhile, so that the client's CKSM after it finds the answer ready.
pub(super) fn run(
    links: Option<Arc<Mutex<Links>>>,
    order: &Order,
    job: Job,
    moving: &crate::engine::transfer::Transfer,
    progress: &AtomicU64,
    sums: &super::ChecksumCache,
) -> Result<Finished, DataError> {
    let links = links.ok_or_else(|| DataError::Net(std::io::Error::other("no SPAS before")))?;
    let stop = || moving.abort().is_aborted();
    let failed = std::thread::scope(|scope| {
        if let Job::Retr { file, .. } = &job {
            scope.spawn(move || {
                let hashed = file.metadata().and_then(|m| sums.xxh3(file, m.len()));
                if let Err(e) = hashed {
                    tracing::debug!("cannot hash the file being sent: {e}");
                }
            });
        }
        links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .run(order, &stop)
    });
    if !failed.is_empty() {
        return Err(DataError::Net(std::io::Error::other(
            braid_proto::stripes::failed_text(&failed),
        )));
    }
    let local = |e: std::io::Error| DataError::Local(crate::fsroot::io_to_fs(&e));
    match job {
        Job::Retr { file, .. } => {
            let size = file.metadata().map_err(local)?.len();
            let bytes = order.have.missing(size).len();
            progress.store(bytes, Ordering::Relaxed);
            Ok(Finished {
                stored: None,
                checksum: None,
                bytes,
                upload: None,
                received: None,
                kept: Default::default(),
            })
        }
        Job::Stor { upload, file, .. } => {
            let len = file.metadata().map_err(local)?.len();
            let sum = crate::sums::xxh3(&file, len).map_err(local)?;
            let bytes = len.saturating_sub(order.have.len());
            progress.store(bytes, Ordering::Relaxed);
            Ok(Finished {
                stored: None,
                checksum: None,
                bytes,
                upload: Some((upload, file)),
                received: Some((len, Some(sum))),
                kept: Default::default(),
            })
        }
        Job::List { .. } | Job::Bundle { .. } | Job::StoreBundle { .. } => Err(DataError::Local(
            braid_proto::session::FsError::Other("listings and bundles are not striped".into()),
        )),
    }
}

/// A session's control connections to its front end's nodes, opened at its first SPAS and
/// kept while they work; a node that fails is connected again at the next SPAS.
pub struct Links {
    front: Arc<FrontEnd>,
    links: Vec<Option<Link>>,
    /// The nodes the last SPAS listed, in stripe order.
    striped: Vec<usize>,
}

struct Link {
    control: Control,
    elastic: bool,
    /// PROT P is in effect on the node's session (its data connections are TLS).
    private: bool,
}

impl Links {
    /// How many nodes the last SPAS listed.
    pub fn stripes(&self) -> usize {
        self.striped.len()
    }

    pub fn new(front: Arc<FrontEnd>) -> Links {
        let links = front.nodes.iter().map(|_| None).collect();
        Links {
            front,
            links,
            striped: Vec::new(),
        }
    }

    /// SPAS: every node that answers listens for the client's data connections; the stripes
    /// are theirs, in order. Fails only if none answers.
    pub fn passive(&mut self) -> Result<Vec<SocketAddr>, String> {
        self.striped.clear();
        let front = self.front.clone();
        // All nodes at once: a first SPAS logs in to each, a few round trips apiece.
        let answers: Vec<Result<SocketAddr, String>> = crate::fanout::at_once(
            self.links.iter_mut().enumerate(),
            |(i, slot)| {
                if slot.is_none() {
                    *slot = Some(connect(&front, i)?);
                }
                let link = slot.as_mut().ok_or("not connected")?;
                link.control
                    .passive_addr()
                    .map(|a| a.target)
                    .map_err(|e| e.to_string())
            },
            || Err("the thread failed".into()),
        );
        let mut addrs = Vec::new();
        let mut why = Vec::new();
        for (i, got) in answers.into_iter().enumerate() {
            let name = &front.nodes[i];
            match got {
                Ok(addr) => {
                    self.striped.push(i);
                    addrs.push(addr);
                }
                Err(e) => {
                    tracing::warn!(node = %name, "data node left out: {e}");
                    self.links[i] = None;
                    why.push(format!("{name}: {e}"));
                }
            }
        }
        if addrs.is_empty() {
            return Err(format!("no data node answered ({})", why.join("; ")));
        }
        Ok(addrs)
    }

    /// The striped transfer: every node of the last SPAS moves its stripe, at once. Returns
    /// the stripes that failed, each with why; their nodes are dropped (connected again at
    /// the next SPAS). `stop`: the client aborted; the nodes' sessions are closed, which
    /// stops their transfers.
    pub fn run(&mut self, order: &Order, stop: &(dyn Fn() -> bool + Sync)) -> Vec<(usize, String)> {
        let stripes = self.striped.len() as u32;
        let mut failed = Vec::new();
        let mut running: Vec<(usize, usize, &mut Link)> = Vec::new();
        let mut by_node: Vec<Option<&mut Link>> =
            self.links.iter_mut().map(|l| l.as_mut()).collect();
        for (stripe, &node) in self.striped.iter().enumerate() {
            match by_node.get_mut(node).and_then(Option::take) {
                Some(link) => running.push((stripe, node, link)),
                None => failed.push((
                    stripe,
                    format!("data node {} is gone", self.front.nodes[node]),
                )),
            }
        }
        let outcomes: Vec<(usize, usize, Result<(), String>)> = std::thread::scope(|scope| {
            let threads: Vec<_> = running
                .into_iter()
                .map(|(stripe, node, link)| {
                    let told = NodeOrder {
                        client: order.client,
                        stripe: stripe as u32,
                        stripes,
                        block: order.block,
                        binding: order.binding,
                    };
                    scope.spawn(move || (stripe, node, link.move_stripe(order, &told, stop)))
                })
                .collect();
            threads.into_iter().filter_map(|t| t.join().ok()).collect()
        });
        for (stripe, node, outcome) in outcomes {
            if let Err(e) = outcome {
                let name = &self.front.nodes[node];
                tracing::warn!(node = %name, stripe, "data node failed: {e}");
                failed.push((stripe, format!("data node {name}: {e}")));
                self.links[node] = None;
            }
        }
        failed.sort();
        failed
    }
}

/// Node `i`'s control connection, logged in with the key, in MODE E.
fn connect(front: &FrontEnd, i: usize) -> Result<Link, String> {
    let name = &front.nodes[i];
    let (host, port) = name
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse().ok()?)))
        .ok_or_else(|| format!("{name} is not HOST:PORT"))?;
    let target = Target {
        gsi: false,
        host: host.to_string(),
        port,
        user: NODE_USER.into(),
        password: front.key.clone(),
        path: String::new(),
    };
    let mut control = Control::connect(&target).map_err(|e| e.to_string())?;
    // The key, and the bindings orders carry, go only over TLS when the front end has it.
    if let Some(tls) = &front.tls {
        control.start_tls(tls, host).map_err(|e| {
            format!("{e} (a data node of a front end with TLS needs the front end's --tls-cert and --tls-key)")
        })?;
    }
    control.start(&target, None).map_err(|e| e.to_string())?;
    control
        .expect(&Command::Mode(Mode::Extended), &[200])
        .map_err(|e| e.to_string())?;
    Ok(Link {
        control,
        elastic: false,
        private: front.tls.is_some(),
    })
}

impl Link {
    /// Tells the node its stripe and has it move it; Ok once it answered 226.
    fn move_stripe(
        &mut self,
        order: &Order,
        told: &NodeOrder,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), String> {
        let c = &mut self.control;
        let e = |e: crate::client::error::ClientError| e.to_string();
        // Private MODE E is braid's elastic MODE E; data in clear keeps the client's kind.
        let private = order.binding.is_some();
        if (order.elastic || private) && !self.elastic {
            c.expect(&Command::Opts("BRAID ELASTIC".into()), &[200])
                .map_err(e)?;
            self.elastic = true;
        }
        if private != self.private {
            let level = if private { 'P' } else { 'C' };
            c.expect(&Command::Prot(level), &[200]).map_err(e)?;
            self.private = private;
        }
        if let (Some(rate), Command::Retr(_)) = (order.max_rate, &order.command) {
            let opts = RetrOpts {
                max_rate: Some((rate / u64::from(told.stripes)).max(1)),
                ..RetrOpts::default()
            };
            c.expect(&Command::Opts(format!("RETR {}", opts.encode())), &[200])
                .map_err(e)?;
        }
        c.expect(
            &Command::Opts(format!("BRAID NODE {}", told.format())),
            &[200],
        )
        .map_err(e)?;
        c.restart_ranges(&order.have).map_err(e)?;
        c.reset_stored(order.have.clone());
        c.start_transfer(&order.command).map_err(e)?;
        loop {
            // Every second what the node's markers said it stored joins the order's.
            let since = std::time::Instant::now();
            let tick = || stop() || since.elapsed() >= GATHER_EVERY;
            let reply = c.final_reply_unless(tick).map_err(e)?;
            {
                let mut stored = order.stored.lock().unwrap_or_else(|p| p.into_inner());
                for (a, b) in c.stored().iter() {
                    stored.insert(a, b);
                }
            }
            match reply {
                Some(r) if r.code == 226 || r.code == 250 => return Ok(()),
                Some(r) => return Err(format!("{} {}", r.code, r.text())),
                None if stop() => return Err("stopped".into()),
                None => {}
            }
        }
    }
}
