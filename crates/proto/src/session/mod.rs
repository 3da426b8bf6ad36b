//! The server side of one control connection, as a state machine.
//!
//! [`Session::handle`] takes a parsed command and answers with one [`Action`]: a reply to send,
//! or a piece of I/O for the caller to do (check a password, open a passive port, touch the
//! file system, run a transfer). The caller reports the outcome back through the matching
//! `*_done` method, which gives the reply. The session never touches sockets, files or clocks.
//!
//! Here: the dispatch, login, TLS, and what the caller reports back (`*_done`). Beside it:
//! `files.rs` (file, directory and transfer commands), `settings.rs` (TYPE, MODE, passive and
//! active data connections, REST, SBUF), `info.rs` (FEAT, OPTS, STAT, HELP), `vocabulary.rs`
//! (the actions and outcomes shared with the I/O driver).

use crate::command::Command;
use crate::listing;
use crate::path::{PathError, VPath};
use crate::ranges::RangeSet;
use crate::reply::Reply;
use std::net::{IpAddr, SocketAddr};

mod info;
use info::help;
mod files;
use files::Pending;
mod settings;
mod vocabulary;
#[cfg(test)]
use crate::markers::{parse_range_marker, perf_marker, range_marker};
pub use vocabulary::*;

/// How far RFC 4217's protection has gone on this session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Protection {
    /// The control connection is TLS.
    control: bool,
    /// PBSZ was given (PROT must follow it).
    pbsz: bool,
    /// PROT P: data connections are TLS too.
    data: bool,
    /// AUTH GSSAPI's security context.
    gsi: Gsi,
    /// DCAU A: data connections run GSI's handshake (with the delegated credential).
    dcau: bool,
}

/// How far a GSI login has gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Gsi {
    #[default]
    Off,
    /// After AUTH GSSAPI: ADAT tokens until the context is complete.
    Exchanging,
    /// Every command is protected from now on; `delegated`: the client gave a credential.
    Established { delegated: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Login {
    AwaitUser,
    AwaitPass { user: String },
    Checking { user: String },
    LoggedIn { user: String, perm: Perm },
}

/// Every MLSx fact braid can show; `*` marks those shown by default (all of them).
const FACTS: [&str; 6] = ["type", "size", "modify", "perm", "unique", "UNIX.mode"];

/// zlib's own default: MODE Z pays on slow links, where the level matters more than the CPU.
pub const DEFLATE_LEVEL: u8 = 6;

/// One control connection's protocol state.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    peer: IpAddr,
    login: Login,
    failed_logins: u32,
    cwd: VPath,
    ascii: bool,
    rest: u64,
    rename_from: Option<VPath>,
    endpoint: Option<DataEndpoint>,
    epsv_all: bool,
    facts: Vec<String>,
    pending: Option<FsOp>,
    /// MODE E is in effect.
    extended: bool,
    /// MODE Z is in effect: stream mode through zlib.
    deflate: bool,
    /// OPTS MODE Z LEVEL: the level of what this server deflates.
    deflate_level: u8,
    parallelism: u32,
    /// OPTS RETR Parallelism's largest count: as many as a sender that opens the connections
    /// and tunes their count may go to.
    most_parallel: u32,
    block_size: Option<u64>,
    /// OPTS RETR MaxRate: cap on the server's sending rate, bytes/s.
    max_rate: Option<u64>,
    /// OPTS RETR Congestion: the TCP congestion control of the data connections it sends on.
    congestion: Option<crate::retr_opts::CcName>,
    /// OPTS RETR Dscp: the DSCP of the data packets it sends.
    dscp: Option<u8>,
    /// OPTS RETR Background: it yields to other traffic on its own, adding at most this many
    /// milliseconds of queueing delay.
    background: Option<u32>,
    /// OPTS BRAID ELASTIC: the client is braid and handles elastic transfers.
    elastic: bool,
    /// OPTS BRAID COMPRESS: what the client wants; None until it asks.
    compress: Option<crate::compress::Policy>,
    /// OPTS STOR Eager=1: the client sends an upload's data on the open data connections
    /// without waiting for its STOR's answer; a refused upload's data is read and dropped.
    eager: bool,
    rest_ranges: Option<RangeSet>,
    expect: Option<Expected>,
    /// ALLO: the size the next upload will have.
    allocate: Option<u64>,
    buffer: Option<u64>,
    /// The pending passive request came as SPAS (multi-line reply).
    spas: bool,
    /// The last MODE E transfer left its data connections open, for transfers this way.
    cached: Option<Direction>,
    protection: Protection,
    /// OPTS BRAID PEER: data connections go to, or come from, another braid server.
    third_party: Option<ThirdParty>,
    /// OPTS BRAID NODE (a data node): the front end's order for the next transfer.
    node_order: Option<crate::stripes::NodeOrder>,
    /// BNDL: the files the next RBND sends or SBND stores, each at the size the client
    /// named (and, to store, with the time it named).
    bundle: Vec<(VPath, u64, Option<i64>)>,
    /// The bytes of the names in `bundle`, as sent.
    bundle_names: usize,
    /// A BNDL line was refused: every line behind it is too, and the RBND or SBND that ends
    /// them, so that no bundle is moved with some of its files missing (the client's layout
    /// of the bytes would not be the server's).
    bundle_refused: bool,
}

impl Session {
    /// A new session for a client at `peer` (the control connection's remote address).
    pub fn new(config: SessionConfig, peer: IpAddr) -> Session {
        Session {
            config,
            peer: canonical_ip(peer),
            login: Login::AwaitUser,
            failed_logins: 0,
            cwd: VPath::root(),
            ascii: false,
            rest: 0,
            rename_from: None,
            endpoint: None,
            epsv_all: false,
            facts: FACTS.iter().map(|f| f.to_ascii_lowercase()).collect(),
            pending: None,
            extended: false,
            deflate: false,
            deflate_level: DEFLATE_LEVEL,
            parallelism: 1,
            most_parallel: 1,
            block_size: None,
            max_rate: None,
            congestion: None,
            dscp: None,
            background: None,
            elastic: false,
            compress: None,
            eager: false,
            rest_ranges: None,
            expect: None,
            allocate: None,
            buffer: None,
            spas: false,
            cached: None,
            protection: Protection::default(),
            third_party: None,
            node_order: None,
            bundle: Vec::new(),
            bundle_names: 0,
            bundle_refused: false,
        }
    }

    /// The greeting sent when the connection opens. Its first word tells a braid client that
    /// it may pipeline ([`is_braid_greeting`]).
    pub fn greeting() -> Reply {
        Reply::new(220, format!("{GREETING_MARK} FTP server ready."))
    }

    /// The greeting of a one-shot session over ssh (`braid serve --stdio`): the usual one, and
    /// the SHA-256 of the certificate its TLS uses, which the client, reading it over ssh's
    /// authenticated channel, pins (see [`pinned_certificate`]); and the address its data
    /// connections listen on, which a client whose own connections cannot reach it asks ssh
    /// to connect to from the far side (see [`data_address`]).
    pub fn greeting_with_certificate(sha256: &[u8; 32], data: std::net::IpAddr) -> Reply {
        let hex: String = sha256.iter().map(|b| format!("{b:02x}")).collect();
        Reply::multi(
            220,
            vec![
                format!("{GREETING_MARK} FTP server ready."),
                format!("{CERTIFICATE_MARK} {hex}"),
                format!("{DATA_ADDRESS_MARK} {data}"),
                TLS_AHEAD_MARK.to_string(),
            ],
        )
    }

    pub fn user(&self) -> Option<&str> {
        match &self.login {
            Login::LoggedIn { user, .. } => Some(user),
            _ => None,
        }
    }

    pub fn cwd(&self) -> &VPath {
        &self.cwd
    }

    /// Starts the session somewhere other than the root: a one-shot session over ssh starts
    /// where ssh started it, the home directory, so relative paths mean what they mean to scp.
    pub fn start_in(&mut self, dir: VPath) {
        self.cwd = dir;
    }

    fn perm(&self) -> Option<Perm> {
        match self.login {
            Login::LoggedIn { perm, .. } => Some(perm),
            _ => None,
        }
    }

    /// Whether the caller should keep the data connections of the last transfer; once this
    /// is false it closes them.
    /// Whether an upload refused now has its data on the way regardless, to be read and
    /// dropped before the refusal is sent: the client sends eagerly (`OPTS STOR Eager=1`) and
    /// the open data connections carry uploads. Otherwise that data would be taken for the
    /// next file's.
    pub fn drains_refused_upload(&self) -> bool {
        self.eager && self.extended && self.cached == Some(Direction::FromClient)
    }

    pub fn keeps_data_connections(&self) -> bool {
        self.cached.is_some()
    }

    /// Answers one command.
    pub fn handle(&mut self, cmd: Command) -> Action {
        // A new data address or mode retires cached data connections (GridFTP closes them when
        // MODE changes; a new PASV or PORT says the client wants fresh ones).
        if matches!(
            cmd,
            Command::Pasv
                | Command::Epsv(_)
                | Command::Spas
                | Command::Spor(_)
                | Command::Mprt(_)
                | Command::Port(_)
                | Command::Eprt(_)
                | Command::Mode(_)
        ) {
            self.cached = None;
        }
        // RNFR must be followed directly by RNTO (RFC 959).
        let rename_from = self.rename_from.take();
        // REST applies to the next transfer command. RFC 3659 wants it right before that
        // command, but clients also send it before PASV/EPSV, so those keep it.
        let rest = match cmd {
            Command::Retr(_)
            | Command::Stor(_)
            | Command::Appe(_)
            | Command::RetrBundle
            | Command::StorBundle => std::mem::take(&mut self.rest),
            _ => 0,
        };
        let rest_ranges = match cmd {
            Command::Retr(_)
            | Command::Stor(_)
            | Command::Appe(_)
            | Command::RetrBundle
            | Command::StorBundle => self.rest_ranges.take(),
            _ => None,
        };
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));

        // Commands that work in any login state.
        match &cmd {
            Command::Quit => return Action::Close(Reply::new(221, "Goodbye.")),
            Command::Noop => return reply(200, "NOOP ok."),
            Command::Syst => return reply(215, "UNIX Type: L8"),
            Command::Feat => return Action::Reply(self.feat()),
            Command::Help(arg) => return Action::Reply(help(arg.as_deref())),
            Command::Opts(arg) => return Action::Reply(self.opts(arg)),
            Command::User(name) => return self.user_cmd(name),
            Command::Pass(pw) => return self.pass_cmd(pw),
            Command::Abor => return reply(225, "No transfer to abort."),
            Command::Auth(mechanism) if mechanism == "GSSAPI" => return self.auth_gssapi(),
            Command::Auth(mechanism) => return self.auth(mechanism),
            Command::Adat(token) => return self.adat(token),
            Command::Pbsz(_) => return self.pbsz(),
            Command::Prot(level) => return self.prot(*level),
            Command::Unknown { verb, .. } => {
                return Action::Reply(Reply::new(500, format!("Unknown command {verb}.")));
            }
            _ => {}
        }
        let Some(perm) = self.perm() else {
            return reply(530, "Please log in with USER and PASS first.");
        };
        let writable = perm == Perm::ReadWrite;
        match cmd {
            Command::Acct(_) => reply(202, "ACCT not needed."),
            Command::Dcau(mode) => self.dcau(&mode),
            Command::Rein => {
                let config = self.config.clone();
                // The control connection stays TLS (or GSI): only the login and settings start
                // over.
                let (control, gsi) = (self.protection.control, self.protection.gsi);
                *self = Session::new(config, self.peer);
                self.protection.control = control;
                self.protection.gsi = gsi;
                self.protection.dcau = gsi == Gsi::Established { delegated: true };
                reply(220, "Service ready for new user.")
            }
            Command::Stat(None) => Action::Reply(self.status()),
            Command::Site(arg) => {
                let verb = arg.split(' ').next().unwrap_or("").to_ascii_uppercase();
                match verb.as_str() {
                    "HELP" => reply(214, "No SITE commands are available."),
                    _ => Action::Reply(Reply::new(504, format!("SITE {verb} is not understood."))),
                }
            }
            cmd @ (Command::Type(_)
            | Command::Mode(_)
            | Command::Stru(_)
            | Command::Pasv
            | Command::Epsv(_)
            | Command::Spas
            | Command::Spor(_)
            | Command::Mult(_)
            | Command::Mprt(_)
            | Command::Port(_)
            | Command::Eprt(_)
            | Command::RestRanges(_)
            | Command::Rest(_)
            | Command::Allo(_)
            | Command::Sbuf(_)) => self.setting(cmd),
            cmd @ (Command::Pwd
            | Command::Cwd(_)
            | Command::Cdup
            | Command::Stat(Some(_))
            | Command::Cksm { .. }
            | Command::Scks { .. }
            | Command::Retr(_)
            | Command::Bundle(_)
            | Command::RetrBundle
            | Command::StorBundle
            | Command::Stor(_)
            | Command::Appe(_)
            | Command::List(_)
            | Command::Nlst(_)
            | Command::Mlsd(_)
            | Command::Mlsr(_)
            | Command::Mlst(_)
            | Command::Size(_)
            | Command::Mdtm(_)
            | Command::Mfmt(..)
            | Command::Dele(_)
            | Command::Mkd(_)
            | Command::Rmd(_)
            | Command::Rnfr(_)
            | Command::Rnto(_)) => self.file_command(
                cmd,
                Pending {
                    writable,
                    rest,
                    rest_ranges,
                    rename_from,
                },
            ),
            // Handled above, before the login check.
            Command::Quit
            | Command::Noop
            | Command::Syst
            | Command::Feat
            | Command::Help(_)
            | Command::Opts(_)
            | Command::User(_)
            | Command::Pass(_)
            | Command::Abor
            | Command::Auth(_)
            | Command::Adat(_)
            | Command::Pbsz(_)
            | Command::Prot(_)
            | Command::Unknown { .. } => reply(500, "Unexpected command."),
        }
    }

    fn list(&mut self, arg: Option<String>, style: ListStyle, writable: bool) -> Action {
        self.rest = 0;
        let arg = arg.map(|a| strip_list_flags(&a)).unwrap_or_default();
        match self.cwd.join(&arg) {
            Ok(p) => self.transfer(TransferKind::List(p, style), 0, None, writable),
            Err(e) => Action::Reply(path_error(e, &arg)),
        }
    }

    fn fs(&mut self, op: FsOp) -> Action {
        self.pending = Some(op.clone());
        Action::Fs(op)
    }

    fn transfer(
        &mut self,
        kind: TransferKind,
        offset: u64,
        rest_ranges: Option<RangeSet>,
        writable: bool,
    ) -> Action {
        let expect = self.expect.take();
        let allocate = self.allocate.take();
        let direction = kind.direction();
        if self.protection.control
            && !self.protection.data
            && self.config.private_data_required
            && !self.under_gsi()
        {
            return Action::Reply(Reply::new(
                522,
                "Data connections must be encrypted after AUTH TLS on this server: send PBSZ 0 and PROT P.",
            ));
        }
        let endpoint = match self.endpoint.take() {
            Some(e) => e,
            None if self.extended && self.cached == Some(direction) => DataEndpoint::Cached,
            None if self.cached.is_some() => {
                return Action::Reply(Reply::new(
                    425,
                    "The open data connections carry data the other way; send PASV or PORT first.",
                ));
            }
            None => return Action::Reply(Reply::new(425, "Use PORT, EPRT, PASV or EPSV first.")),
        };
        // The other server's connections are TLS bound to a control session, or nothing. A
        // stream-mode transfer (a listing) stays the client's own: only it may connect.
        let third_party = match (&self.third_party, &endpoint) {
            (Some(ThirdParty::Accept), DataEndpoint::Passive(_)) if self.extended => {
                Some(ThirdParty::Accept)
            }
            (Some(t @ ThirdParty::Connect(_)), DataEndpoint::Active(a))
                if canonical_ip(a.ip()) != self.peer =>
            {
                Some(t.clone())
            }
            _ => None,
        };
        let stripe = self.node_order.take();
        if let DataEndpoint::Striped(_) = endpoint {
            if !self.extended {
                return Action::Reply(Reply::new(
                    504,
                    "This server stripes over data nodes after SPAS, in MODE E only: send MODE E, or PASV/EPSV for one connection.",
                ));
            }
            if !matches!(kind, TransferKind::Retr(_) | TransferKind::Stor(_)) {
                return Action::Reply(Reply::new(
                    504,
                    "Only RETR and STOR are striped over data nodes; send PASV or EPSV first.",
                ));
            }
        }
        if matches!(kind, TransferKind::Bundle(_)) && !self.extended {
            return Action::Reply(Reply::new(
                504,
                "RBND moves its files in MODE E only: send MODE E, or RETR each file.",
            ));
        }
        if matches!(kind, TransferKind::StoreBundle(_)) && !self.extended {
            return Action::Reply(Reply::new(
                504,
                "SBND moves its files in MODE E only: send MODE E, or STOR each file.",
            ));
        }
        if stripe.is_some() && !(self.extended && matches!(endpoint, DataEndpoint::Passive(_))) {
            return Action::Reply(Reply::new(
                504,
                "A data node moves its stripe in MODE E over a passive listener: send MODE E and EPSV.",
            ));
        }
        if third_party.is_some() && !(self.extended && self.protection.data && self.elastic) {
            return Action::Reply(Reply::new(
                534,
                "Data connections with another server must be TLS bound to this session: send MODE E, OPTS BRAID ELASTIC and PROT P.",
            ));
        }
        let block = if self.extended {
            let upload = direction == Direction::FromClient;
            // Private MODE E connections must each prove they belong to this session, which
            // only a braid client knows to do: others would hang in the handshake.
            if self.protection.data && !self.elastic {
                return Action::Reply(Reply::new(
                    536,
                    "MODE E under PROT P needs a braid client (OPTS BRAID ELASTIC); send PROT C, or MODE S.",
                ));
            }
            if self.ascii && !matches!(kind, TransferKind::List(..)) {
                return Action::Reply(Reply::new(
                    504,
                    "MODE E moves binary data only; send TYPE I.",
                ));
            }
            if matches!(kind, TransferKind::Appe(_)) {
                return Action::Reply(Reply::new(
                    504,
                    "APPE is not available in MODE E; use REST ranges with STOR.",
                ));
            }
            // GFD.20: the sender opens the data connections, so an upload needs a passive
            // server. (A braid server also lets a passive sender take connections the client
            // opens, which is what a client behind NAT needs.)
            if upload
                && !matches!(
                    endpoint,
                    DataEndpoint::Passive(_) | DataEndpoint::Cached | DataEndpoint::Striped(_)
                )
            {
                return Action::Reply(Reply::new(
                    425,
                    "In MODE E the sender opens the data connections: use PASV or EPSV before STOR.",
                ));
            }
            let mut have = rest_ranges.unwrap_or_default();
            have.insert(0, offset);
            Some(BlockMode {
                parallelism: match &endpoint {
                    DataEndpoint::ActivePorts(p) => p.len() as u32,
                    _ => self.parallelism,
                },
                most: match &endpoint {
                    DataEndpoint::ActivePorts(p) => p.len() as u32,
                    _ => self.most_parallel.max(self.parallelism),
                },
                have,
                block_size: self.block_size,
                elastic: self.elastic,
                max_rate: self.max_rate,
                congestion: self.congestion,
                dscp: self.dscp,
                background: self.background,
                fixed: upload && self.eager && endpoint == DataEndpoint::Cached,
                compression: self.compression(upload, matches!(kind, TransferKind::List(..))),
            })
        } else {
            if rest_ranges.is_some() {
                return Action::Reply(Reply::new(504, "REST with ranges needs MODE E."));
            }
            None
        };
        Action::Transfer(Transfer {
            kind,
            offset: if block.is_some() { 0 } else { offset },
            ascii: self.ascii,
            endpoint,
            writable,
            facts: self.facts.clone(),
            expect: expect.filter(|_| direction == Direction::FromClient),
            allocate: allocate.filter(|_| direction == Direction::FromClient),
            deflate: (self.deflate && block.is_none()).then_some(self.deflate_level),
            third_party,
            stripe,
            block,
            buffer: self.buffer,
            private: self.protection.data,
            gsi: self.protection.dcau,
        })
    }

    /// What a MODE E transfer does about compressed blocks: nothing unless the client asked;
    /// as the receiver it accepts them; as the sender it does what the client and the server's
    /// setting together say, except that `auto` does not compress under PROT P: compressing
    /// data an attacker may partly choose next to data they may not, and letting them see the
    /// lengths, is how CRIME and BREACH read secrets through TLS. Only an explicit `on` does.
    /// A `listing` under `auto` is always compressed: text shrinks several times over at
    /// almost no cost, and it is too short for `auto` to find that out by measuring.
    fn compression(&self, upload: bool, listing: bool) -> Option<crate::compress::Policy> {
        use crate::compress::Policy;
        let client = self.compress?;
        if upload {
            return Some(Policy::Off);
        }
        Some(match client.with(self.config.compress) {
            Policy::Auto if self.protection.data => Policy::Off,
            Policy::Auto if listing => Policy::On,
            p => p,
        })
    }

    /// AUTH (RFC 4217): TLS on the control connection, before login.
    fn auth(&mut self, mechanism: &str) -> Action {
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));
        if !self.config.tls {
            return reply(
                502,
                "TLS is not configured on this server (braid serve needs --tls-cert and --tls-key).",
            );
        }
        if !matches!(mechanism, "TLS" | "TLS-C" | "SSL") {
            return Action::Reply(Reply::new(
                504,
                format!("AUTH {mechanism} is not supported; use AUTH TLS."),
            ));
        }
        if self.protection.control {
            return reply(503, "The control connection already uses TLS.");
        }
        if self.user().is_some() || self.login != Login::AwaitUser {
            return reply(503, "AUTH must come before USER.");
        }
        self.protection.control = true;
        Action::StartTls(Reply::new(234, format!("AUTH {mechanism} successful.")))
    }

    /// AUTH GSSAPI (RFC 2228): a GSI login, whose security context comes in ADAT tokens.
    fn auth_gssapi(&mut self) -> Action {
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));
        if !self.config.gsi {
            return reply(
                504,
                "GSI is not configured on this server (braid serve needs --gsi-cert, --gsi-key and --grid-mapfile); use AUTH TLS.",
            );
        }
        if self.protection.control || self.protection.gsi != Gsi::Off {
            return reply(503, "The control connection is already protected.");
        }
        if self.login != Login::AwaitUser {
            return reply(503, "AUTH must come before USER.");
        }
        self.protection.gsi = Gsi::Exchanging;
        reply(334, "Using authentication type GSSAPI; ADAT must follow.")
    }

    fn adat(&mut self, token: &str) -> Action {
        if self.protection.gsi != Gsi::Exchanging {
            return Action::Reply(Reply::new(503, "ADAT needs AUTH GSSAPI first."));
        }
        Action::Adat(token.to_string())
    }

    /// The outcome of [`Action::Adat`]. A failed handshake ends the connection: its TLS state
    /// is gone, and a guesser gets one try per connection.
    pub fn adat_done(&mut self, outcome: AdatOutcome) -> Action {
        match outcome {
            AdatOutcome::More(token) => Action::Reply(Reply::new(335, format!("ADAT={token}"))),
            AdatOutcome::Done { token, delegated } => {
                self.protection.gsi = Gsi::Established { delegated };
                self.protection.control = true;
                // GridFTP's default: data connections authenticated with the delegated
                // credential; without one there is nothing to authenticate them with.
                self.protection.dcau = delegated;
                Action::Reply(match token {
                    Some(t) => Reply::new(235, format!("ADAT={t}")),
                    None => Reply::new(235, "GSSAPI Authentication successful."),
                })
            }
            AdatOutcome::Failed(why) => {
                self.protection.gsi = Gsi::Off;
                Action::Close(Reply::new(
                    535,
                    format!("GSI authentication failed: {why}."),
                ))
            }
        }
    }

    /// Whether the session is a GSI one (its context established).
    fn under_gsi(&self) -> bool {
        matches!(self.protection.gsi, Gsi::Established { .. })
    }

    /// Data connections kept under the other setting are not reused: they were (or were not)
    /// authenticated when they joined.
    fn set_dcau(&mut self, on: bool) {
        if self.protection.dcau != on {
            self.cached = None;
        }
        self.protection.dcau = on;
    }

    /// DCAU (GridFTP): A authenticates data connections with the delegated credential, N
    /// leaves them as they are (the client's address only, as without GSI).
    fn dcau(&mut self, mode: &str) -> Action {
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));
        let word = mode.split_whitespace().next().unwrap_or("");
        match word.to_ascii_uppercase().as_str() {
            "N" => {
                self.set_dcau(false);
                reply(200, "DCAU N.")
            }
            "A" => match self.protection.gsi {
                Gsi::Established { delegated: true } => {
                    self.set_dcau(true);
                    reply(200, "DCAU A.")
                }
                Gsi::Established { delegated: false } => reply(
                    504,
                    "DCAU A needs a delegated credential: log in delegating one (globus-url-copy and braid do by default).",
                ),
                _ => reply(504, "DCAU A needs a GSI login (AUTH GSSAPI)."),
            },
            "S" => reply(504, "DCAU S is not supported; use A or N."),
            _ => reply(501, "Bad DCAU mode; use A or N."),
        }
    }

    /// PBSZ: always 0 for TLS; only after AUTH TLS.
    fn pbsz(&mut self) -> Action {
        if !self.protection.control {
            return Action::Reply(Reply::new(503, "PBSZ needs AUTH TLS first."));
        }
        self.protection.pbsz = true;
        Action::Reply(Reply::new(200, "PBSZ=0"))
    }

    /// PROT C (clear) or P (private) data connections; only after PBSZ.
    fn prot(&mut self, level: char) -> Action {
        if !self.protection.pbsz {
            return Action::Reply(Reply::new(503, "PROT needs PBSZ first."));
        }
        match level {
            'P' if self.under_gsi() => Action::Reply(Reply::new(
                536,
                "PROT P is not available under GSI here: data connections are authenticated (DCAU A) and in clear; use PROT C.",
            )),
            'C' | 'P' => {
                let private = level == 'P';
                // Open MODE E connections were set up the other way: they go.
                if private != self.protection.data {
                    self.cached = None;
                }
                self.protection.data = private;
                Action::Reply(Reply::new(200, format!("PROT {level} accepted.")))
            }
            _ => Action::Reply(Reply::new(
                536,
                format!("PROT {level} is not supported; use C or P."),
            )),
        }
    }

    /// PORT and EPRT: only to the control connection's peer, never to a privileged port
    /// (FTP bounce, RFC 2577).
    fn active(&mut self, addr: SocketAddr) -> Action {
        if self.epsv_all {
            return Action::Reply(Reply::new(503, "EPSV ALL is in effect; use EPSV."));
        }
        // Under DCAU A the other end must show the user's own credential, wherever it is.
        let to_peer = matches!(self.third_party, Some(ThirdParty::Connect(_)))
            || (self.protection.dcau && self.config.third_party);
        if canonical_ip(addr.ip()) != self.peer && !to_peer {
            return Action::Reply(Reply::new(
                504,
                format!(
                    "Refused: data connections go only to your own address {} (RFC 2577).",
                    self.peer
                ),
            ));
        }
        if addr.port() < 1024 {
            return Action::Reply(Reply::new(504, "Refused: port below 1024 (RFC 2577)."));
        }
        let ip = if to_peer { addr.ip() } else { self.peer };
        self.endpoint = Some(DataEndpoint::Active(SocketAddr::new(ip, addr.port())));
        Action::Reply(Reply::new(
            200,
            "PORT command successful. Consider using EPSV.",
        ))
    }

    fn user_cmd(&mut self, name: &str) -> Action {
        if let Login::LoggedIn { .. } = self.login {
            return Action::Reply(Reply::new(530, "Cannot change to another user."));
        }
        let anonymous = is_anonymous(name);
        if anonymous && self.config.anonymous.is_none() {
            self.login = Login::AwaitUser;
            return Action::Reply(Reply::new(
                530,
                "Anonymous login is disabled on this server.",
            ));
        }
        // A server that can encrypt passwords does not take them in clear (RFC 4217 §4).
        if !anonymous && self.config.tls && !self.protection.control {
            return Action::Reply(Reply::new(
                530,
                "This server takes passwords only over TLS: send AUTH TLS first (curl --ssl-reqd, lftp set ftp:ssl-force yes).",
            ));
        }
        self.login = Login::AwaitPass {
            user: name.to_string(),
        };
        if anonymous {
            Action::Reply(Reply::new(
                331,
                "Anonymous login ok, send your e-mail address as password.",
            ))
        } else if self.under_gsi() {
            // The credential has been checked; PASS is a formality, and the grid-mapfile says
            // whether the name may be this user's.
            Action::Reply(Reply::new(331, format!("Password required for {name}.")))
        } else {
            Action::Reply(Reply::new(331, "Please specify the password."))
        }
    }

    fn pass_cmd(&mut self, password: &str) -> Action {
        match &self.login {
            Login::LoggedIn { .. } => Action::Reply(Reply::new(230, "Already logged in.")),
            Login::AwaitPass { user } => {
                let user = user.clone();
                self.login = Login::Checking { user: user.clone() };
                Action::Login {
                    user,
                    password: password.to_string(),
                }
            }
            _ => Action::Reply(Reply::new(503, "Login with USER first.")),
        }
    }

    /// The outcome of [`Action::Login`]: `Some(perm)` if the credentials were good.
    pub fn login_done(&mut self, result: Option<Perm>) -> Action {
        let Login::Checking { user } = std::mem::replace(&mut self.login, Login::AwaitUser) else {
            return Action::Reply(Reply::new(503, "Login with USER first."));
        };
        match result {
            Some(perm) => {
                self.login = Login::LoggedIn { user, perm };
                Action::Reply(Reply::new(230, "Login successful."))
            }
            None => {
                self.failed_logins += 1;
                if self.failed_logins >= self.config.max_login_failures {
                    Action::Close(Reply::new(
                        421,
                        "Too many failed logins; closing connection.",
                    ))
                } else {
                    Action::Reply(Reply::new(530, "Login incorrect."))
                }
            }
        }
    }

    /// The outcome of a login that no password decided (GSI: the grid-mapfile): logged in as
    /// the account named, or refused for the reason given.
    pub fn login_done_as(&mut self, result: Result<(Perm, String), String>) -> Action {
        match result {
            Ok((perm, account)) => {
                self.login = Login::Checking { user: account };
                self.login_done(Some(perm))
            }
            Err(why) => match self.login_done(None) {
                Action::Reply(_) => {
                    Action::Reply(Reply::new(530, format!("Login incorrect: {why}.")))
                }
                other => other,
            },
        }
    }

    /// The outcome of [`Action::StripedPassive`]: each data node's listening address, in
    /// stripe order, or why none could be had.
    pub fn striped_passive_done(&mut self, result: Result<Vec<SocketAddr>, String>) -> Reply {
        self.spas = false;
        let addrs = match result {
            Ok(a) => a,
            Err(e) => {
                return Reply::new(
                    425,
                    format!("Cannot open striped passive connections: {e}."),
                );
            }
        };
        let v4: Vec<std::net::SocketAddrV4> = addrs
            .iter()
            .filter_map(|a| match a {
                SocketAddr::V4(v) => Some(*v),
                SocketAddr::V6(_) => None,
            })
            .collect();
        if v4.is_empty() || v4.len() != addrs.len() {
            return Reply::new(522, "SPAS is IPv4 only, and a data node listens on IPv6.");
        }
        self.endpoint = Some(DataEndpoint::Striped(addrs));
        crate::stripes::spas_reply(&v4)
    }

    /// The outcome of [`Action::Passive`]: the listener's address, or why it failed.
    pub fn passive_done(&mut self, extended: bool, result: Result<SocketAddr, String>) -> Reply {
        let spas = std::mem::take(&mut self.spas);
        match result {
            Ok(addr) => {
                self.endpoint = Some(DataEndpoint::Passive(addr));
                match (extended, addr) {
                    (false, SocketAddr::V4(v4)) if spas => Reply::multi(
                        229,
                        vec![
                            "Entering Striped Passive Mode".into(),
                            format!(" {}", crate::addr::format_host_port(v4)),
                            "End".into(),
                        ],
                    ),
                    (true, _) => Reply::new(
                        229,
                        format!("Entering Extended Passive Mode (|||{}|)", addr.port()),
                    ),
                    (false, SocketAddr::V4(v4)) => Reply::new(
                        227,
                        format!(
                            "Entering Passive Mode ({}).",
                            crate::addr::format_host_port(v4)
                        ),
                    ),
                    (false, SocketAddr::V6(_)) => {
                        self.endpoint = None;
                        Reply::new(522, "PASV is IPv4 only; use EPSV.")
                    }
                }
            }
            Err(e) => Reply::new(425, format!("Cannot open passive connection: {e}.")),
        }
    }

    /// The outcome of the pending [`Action::Fs`].
    pub fn fs_done(&mut self, result: Result<FsOutcome, FsError>) -> Reply {
        let Some(op) = self.pending.take() else {
            return Reply::new(503, "No file operation pending.");
        };
        let target = match &op {
            FsOp::ChangeDir(p)
            | FsOp::Size { path: p, .. }
            | FsOp::Mdtm(p)
            | FsOp::SetMtime(p, _)
            | FsOp::Mkd(p)
            | FsOp::Rmd(p)
            | FsOp::Dele(p)
            | FsOp::RenameFrom(p)
            | FsOp::Mlst(p)
            | FsOp::StatList(p)
            | FsOp::Checksum { path: p, .. } => p.clone(),
            FsOp::Rename { from, .. } => from.clone(),
        };
        let outcome = match result {
            Ok(o) => o,
            Err(e) => return e.reply(&target),
        };
        match (op, outcome) {
            (FsOp::ChangeDir(p), _) => {
                self.cwd = p;
                Reply::new(250, "Directory successfully changed.")
            }
            (FsOp::Size { .. }, FsOutcome::Size(n)) => Reply::new(213, n.to_string()),
            (FsOp::Mdtm(_), FsOutcome::Mtime(t)) => {
                Reply::new(213, crate::time::Civil::from_unix(t).mdtm())
            }
            (FsOp::SetMtime(p, t), _) => Reply::new(
                213,
                format!("Modify={}; {p}", crate::time::Civil::from_unix(t).mdtm()),
            ),
            (FsOp::Mkd(p), _) => Reply::new(257, format!("{} created.", p.quoted())),
            (FsOp::Rmd(_), _) => Reply::new(250, "Remove directory operation successful."),
            (FsOp::Dele(_), _) => Reply::new(250, "Delete operation successful."),
            (FsOp::RenameFrom(p), _) => {
                self.rename_from = Some(p);
                Reply::new(350, "Ready for RNTO.")
            }
            (FsOp::Rename { .. }, _) => Reply::new(250, "Rename successful."),
            (FsOp::Mlst(p), FsOutcome::Entry(e)) => {
                let mut facts = String::new();
                let writable = self.perm() == Some(Perm::ReadWrite);
                listing::write_facts(&mut facts, &e, None, writable, Some(&self.facts));
                Reply::multi(
                    250,
                    vec![
                        format!("Listing {p}"),
                        format!(" {facts} {p}"),
                        "End".to_string(),
                    ],
                )
            }
            (FsOp::Checksum { .. }, FsOutcome::Checksum(hex)) => Reply::new(213, hex),
            (FsOp::StatList(p), FsOutcome::Lines(lines)) => {
                let mut all = vec![format!("Status of {p}:")];
                all.extend(lines);
                all.push("End of status".to_string());
                Reply::multi(213, all)
            }
            (op, outcome) => Reply::new(
                451,
                format!("Internal error: unexpected outcome {outcome:?} for {op:?}."),
            ),
        }
    }

    /// The replies that end a transfer.
    pub fn transfer_done(&mut self, t: &Transfer, outcome: TransferOutcome) -> Vec<Reply> {
        self.cached = match outcome {
            TransferOutcome::Complete { kept: true, .. } if t.block.is_some() => {
                Some(t.direction())
            }
            _ => None,
        };
        match outcome {
            TransferOutcome::Complete {
                checksum: Some(sum),
                ..
            } => vec![Reply::new(226, crate::bundle::ended(&sum))],
            TransferOutcome::Complete { .. } => vec![Reply::new(226, "Transfer complete.")],
            TransferOutcome::Aborted => vec![
                Reply::new(426, "Connection closed; transfer aborted."),
                Reply::new(226, "ABOR successful."),
            ],
            TransferOutcome::NoConnection(e) => {
                vec![Reply::new(
                    425,
                    format!("Cannot open data connection: {e}."),
                )]
            }
            TransferOutcome::ConnectionLost(e) => {
                vec![Reply::new(
                    426,
                    format!("Data connection lost: {e}; transfer aborted."),
                )]
            }
            TransferOutcome::NotSecured(e) => {
                vec![Reply::new(522, format!("Data connection refused: {e}."))]
            }
            TransferOutcome::Local(e) => vec![t.refusal(&e)],
            TransferOutcome::Shutdown => vec![Reply::new(
                426,
                "Server is shutting down; transfer aborted.",
            )],
            // RFC 2228's "failed security check": a code of its own, so clients need not read
            // the text.
            TransferOutcome::ChecksumMismatch { expected, actual } => {
                let (what, kept) = match &t.kind {
                    TransferKind::StoreBundle(files) => (
                        format!("SBND of {} files", files.len()),
                        "none of them stored",
                    ),
                    _ => (t.path().to_string(), "kept as a partial upload"),
                };
                vec![Reply::new(
                    535,
                    format!(
                        "{what}: checksum mismatch: the client announced {expected}, the data received hashes to {actual}; {kept}."
                    ),
                )]
            }
        }
    }
}

/// `LIST -la dir` from clients such as lftp: drop leading `ls` flags.
fn strip_list_flags(arg: &str) -> String {
    let mut rest = arg.trim_start();
    while rest.starts_with('-') {
        match rest.find(' ') {
            Some(i) => rest = rest[i..].trim_start(),
            None => rest = "",
        }
    }
    rest.to_string()
}

fn path_error(e: PathError, arg: &str) -> Reply {
    let shown: String = arg.chars().filter(|c| !c.is_control()).take(200).collect();
    match e {
        PathError::Escapes => Reply::new(550, format!("{shown}: {e}.")),
        _ => Reply::new(553, format!("{shown}: {e}.")),
    }
}

fn family(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 1 } else { 2 }
}

/// The greeting's first word on a braid server, which reads pipelined commands in order and
/// answers each in turn, as RFC 959 allows but does not promise of every server.
const GREETING_MARK: &str = "braid";

/// Whether a 220 greeting comes from a braid server (its text starts with [`GREETING_MARK`]).
/// Nothing is lost if another server's banner happens to say so too and it does not take
/// pipelined commands: the replies still come back in order on one connection; only a server
/// that drops commands sent before their predecessor's reply would fail, and loudly.
pub fn is_braid_greeting(r: &Reply) -> bool {
    r.code == 220 && r.text().split_whitespace().next() == Some(GREETING_MARK)
}

/// What precedes a one-shot session's certificate digest in its greeting.
const CERTIFICATE_MARK: &str = "Certificate SHA-256";

/// The certificate digest a one-shot session's greeting names
/// ([`Session::greeting_with_certificate`]), if it names one.
pub fn pinned_certificate(r: &Reply) -> Option<[u8; 32]> {
    if !is_braid_greeting(r) {
        return None;
    }
    let hex = r
        .lines
        .iter()
        .find_map(|l| l.strip_prefix(CERTIFICATE_MARK))?
        .trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What a one-shot server's greeting says when it takes the ClientHello right behind AUTH
/// TLS, without the round trip for its 234 (the bytes after the command go to TLS; inside
/// ssh's channel no one can slip any in).
const TLS_AHEAD_MARK: &str = "TLS may follow AUTH at once";

/// Whether this greeting says TLS may follow AUTH TLS at once ([`TLS_AHEAD_MARK`]).
pub fn takes_tls_ahead(r: &Reply) -> bool {
    is_braid_greeting(r) && r.lines.iter().any(|l| l == TLS_AHEAD_MARK)
}

/// What precedes a one-shot session's data address in its greeting.
const DATA_ADDRESS_MARK: &str = "Data address";

/// The address a one-shot session's data connections listen on, as its greeting names it
/// ([`Session::greeting_with_certificate`]).
pub fn data_address(r: &Reply) -> Option<std::net::IpAddr> {
    if !is_braid_greeting(r) {
        return None;
    }
    r.lines
        .iter()
        .find_map(|l| l.strip_prefix(DATA_ADDRESS_MARK))?
        .trim()
        .parse()
        .ok()
}

/// Whether the server that sent this greeting reads pipelined commands in order, also while a
/// transfer runs: a braid server; the Globus GridFTP server ("... GridFTP Server 13.24
/// ... ready."), whose control library queues what arrives meanwhile, which
/// `globus-url-copy -pp` counts on; and vsftpd ("(vsFTPd 3.0.3)", its default banner), which
/// reads each command up to its line's end and leaves the rest in the socket (a login, FEAT,
/// TYPE, SIZE, EPSV, REST and RETR sent at once are answered in order, PASS after an
/// anonymous USER's 230 with "230 Already logged in."). A segmented download's sessions then
/// start in three round trips instead of eight: `bench/segmented.sh` over 150 ms, braid
/// `-n 8` 15.1-15.5 s instead of 15.8-16.3 s.
pub fn reads_pipelined(r: &Reply) -> bool {
    is_braid_greeting(r)
        || (r.code == 220 && (r.text().contains("GridFTP Server") || r.text().contains("(vsFTPd ")))
}

pub use crate::addr::canonical_ip;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{EpsvArg, Mode, TransferType};

    fn fresh(tls: bool) -> Session {
        Session::new(
            SessionConfig {
                anonymous: Some(Perm::ReadWrite),
                max_login_failures: 3,
                max_streams: 16,
                tls,
                private_data_required: false,
                compress: crate::compress::Policy::Auto,
                third_party: true,
                data_node: false,
                striped: false,
                gsi: false,
            },
            "127.0.0.1".parse().unwrap(),
        )
    }

    #[test]
    fn braid_globus_and_vsftpd_greetings_say_they_read_pipelined_commands_and_others_do_not() {
        let says = |code, text: &str| reads_pipelined(&Reply::new(code, text));
        assert!(says(220, "braid FTP server ready."));
        assert!(says(
            220,
            "vm GridFTP Server 13.24 (gcc64, 1653033972-1) [Grid Community Toolkit 6.2] ready."
        ));
        assert!(says(220, "(vsFTPd 3.0.3)"));
        assert!(!says(220, "ProFTPD Server (Debian) [127.0.0.1]"));
        assert!(!says(421, "GridFTP Server busy"));
    }

    #[test]
    fn a_server_that_requires_private_data_refuses_clear_transfers_after_auth_tls() {
        let mut s = fresh(true);
        s.config.private_data_required = true;
        // In clear (no AUTH), clear data is all there is: allowed.
        s.handle(Command::User("anonymous".into()));
        s.handle(Command::Pass("x".into()));
        s.login_done(Some(Perm::ReadWrite));
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert!(!transfer(s.handle(Command::Retr("a".into()))).private);

        let mut s = fresh(true);
        s.config.private_data_required = true;
        assert!(matches!(
            s.handle(Command::Auth("TLS".into())),
            Action::StartTls(_)
        ));
        s.handle(Command::User("anonymous".into()));
        s.handle(Command::Pass("x".into()));
        s.login_done(Some(Perm::ReadWrite));
        for prot in [None, Some('C')] {
            if let Some(level) = prot {
                s.handle(Command::Pbsz(0));
                assert_eq!(code(s.handle(Command::Prot(level))), 200);
            }
            s.handle(Command::Pasv);
            s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
            assert_eq!(code(s.handle(Command::Retr("a".into()))), 522);
            assert_eq!(code(s.handle(Command::Nlst(None))), 522);
        }
        assert_eq!(code(s.handle(Command::Prot('P'))), 200);
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert!(transfer(s.handle(Command::Retr("a".into()))).private);
    }

    #[test]
    fn tls_is_negotiated_in_rfc_4217_order_and_guards_passwords() {
        // Without a certificate AUTH says how to get one.
        assert_eq!(code(fresh(false).handle(Command::Auth("TLS".into()))), 502);
        let mut s = fresh(true);
        assert!(wire(&s.feat()).contains(" AUTH TLS\r\n"));
        // Passwords only under TLS; anonymous login may stay in clear.
        assert_eq!(code(s.handle(Command::User("alice".into()))), 530);
        assert_eq!(code(s.handle(Command::User("anonymous".into()))), 331);
        let mut s = fresh(true);
        assert_eq!(code(s.handle(Command::Pbsz(0))), 503);
        assert_eq!(code(s.handle(Command::Auth("GSSAPI".into()))), 504);
        match s.handle(Command::Auth("TLS".into())) {
            Action::StartTls(r) => assert_eq!(r.code, 234),
            other => panic!("expected StartTls, got {other:?}"),
        }
        assert_eq!(code(s.handle(Command::Auth("TLS".into()))), 503);
        assert_eq!(code(s.handle(Command::Prot('P'))), 503, "PROT before PBSZ");
        assert_eq!(code(s.handle(Command::Pbsz(0))), 200);
        assert_eq!(code(s.handle(Command::Prot('S'))), 536);
        assert_eq!(code(s.handle(Command::Prot('P'))), 200);
        assert_eq!(code(s.handle(Command::User("alice".into()))), 331);
        s.handle(Command::Pass("pw".into()));
        s.login_done(Some(Perm::ReadWrite));
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert!(transfer(s.handle(Command::Retr("a".into()))).private);
        // MODE E data connections are TLS too, each bound to this session (the I/O side
        // checks), which only a braid client can do.
        s.handle(Command::Mode(Mode::Extended));
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(code(s.handle(Command::Retr("a".into()))), 536);
        assert_eq!(code(s.handle(Command::Opts("BRAID ELASTIC".into()))), 200);
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert!(transfer(s.handle(Command::Retr("a".into()))).private);
        assert_eq!(code(s.handle(Command::Prot('C'))), 200);
        s.handle(Command::Pasv);
        s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert!(!transfer(s.handle(Command::Retr("a".into()))).private);
    }

    #[test]
    fn spas_on_a_front_end_lists_its_nodes_and_stripes_only_mode_e_files() {
        let mut s = logged_in();
        s.config.striped = true;
        assert!(wire(&s.feat()).contains(" BRAID-STRIPED\r\n"));
        // With TLS its nodes take private data too, and a client reads that from FEAT.
        s.config.tls = true;
        let feat = s.feat();
        assert!(wire(&feat).contains(" BRAID-STRIPED P\r\n"));
        assert!(crate::client::Features::parse(&feat).striped_private());
        s.config.tls = false;
        assert_eq!(s.handle(Command::Spas), Action::StripedPassive);
        let nodes: Vec<SocketAddr> = vec![
            "198.18.0.11:4000".parse().unwrap(),
            "198.18.0.12:4001".parse().unwrap(),
        ];
        let r = s.striped_passive_done(Ok(nodes.clone()));
        assert_eq!(
            wire(&r),
            "229-Entering Striped Passive Mode\r\n 198,18,0,11,15,160\r\n 198,18,0,12,15,161\r\n229 End\r\n"
        );
        // Stream mode, or a listing: not striped, and said why.
        assert_eq!(code(s.handle(Command::Retr("a".into()))), 504);
        s.handle(Command::Mode(Mode::Extended));
        s.handle(Command::Spas);
        s.striped_passive_done(Ok(nodes.clone()));
        assert_eq!(code(s.handle(Command::Nlst(None))), 504);
        for cmd in [Command::Retr("a".into()), Command::Stor("b".into())] {
            s.handle(Command::Spas);
            s.striped_passive_done(Ok(nodes.clone()));
            assert_eq!(
                transfer(s.handle(cmd)).endpoint,
                DataEndpoint::Striped(nodes.clone())
            );
        }
        // No node answered: no address, and the reason.
        s.handle(Command::Spas);
        let r = s.striped_passive_done(Err("no data node answered".into()));
        assert_eq!(r.code, 425);
        // PASV still moves data through this server.
        assert!(matches!(s.handle(Command::Pasv), Action::Passive { .. }));
    }

    /// A GSI login: AUTH GSSAPI only where configured, ADAT tokens until the caller's context
    /// is complete, then USER/PASS as the grid-mapfile maps; DCAU A (the default once a proxy
    /// was delegated) authenticates data connections, which may then go to another host; PROT P
    /// is refused, and braid's own extensions are not offered.
    #[test]
    fn a_gsi_login_goes_through_adat_and_dcau_a_lets_data_go_to_another_host() {
        let other: SocketAddr = "198.18.0.7:5000".parse().unwrap();
        assert_eq!(
            code(fresh(false).handle(Command::Auth("GSSAPI".into()))),
            504
        );
        let gsi = || {
            let mut s = fresh(false);
            s.config.gsi = true;
            s
        };
        let mut s = gsi();
        assert_eq!(code(s.handle(Command::Adat("AAAA".into()))), 503);
        assert_eq!(code(s.handle(Command::Auth("GSSAPI".into()))), 334);
        assert_eq!(code(s.handle(Command::Auth("GSSAPI".into()))), 503);
        assert_eq!(
            s.handle(Command::Adat("AAAA".into())),
            Action::Adat("AAAA".into())
        );
        match s.adat_done(AdatOutcome::More("BBBB".into())) {
            Action::Reply(r) => assert_eq!((r.code, r.text()), (335, "ADAT=BBBB".to_string())),
            other => panic!("{other:?}"),
        }
        s.handle(Command::Adat("CCCC".into()));
        let done = AdatOutcome::Done {
            token: None,
            delegated: true,
        };
        assert_eq!(code(s.adat_done(done)), 235);
        assert_eq!(
            code(s.handle(Command::Adat("DDDD".into()))),
            503,
            "a second context"
        );
        assert_eq!(
            code(s.handle(Command::User(":globus-mapping:".into()))),
            331
        );
        assert!(matches!(
            s.handle(Command::Pass("dummy".into())),
            Action::Login { .. }
        ));
        let refused = s.login_done_as(Err("/O=x/CN=y is not in the grid-mapfile".into()));
        match refused {
            Action::Reply(r) => {
                assert!(r.code == 530 && r.text().contains("grid-mapfile"), "{r:?}")
            }
            other => panic!("{other:?}"),
        }
        s.handle(Command::User(":globus-mapping:".into()));
        s.handle(Command::Pass("dummy".into()));
        assert_eq!(
            code(s.login_done_as(Ok((Perm::ReadWrite, "alice".into())))),
            230
        );
        assert_eq!(s.user(), Some("alice"));
        let feat = wire(&s.feat());
        assert!(feat.contains(" DCAU") && !feat.contains("BRAID"), "{feat}");
        assert_eq!(code(s.handle(Command::Pbsz(0))), 200);
        assert_eq!(code(s.handle(Command::Prot('P'))), 536);
        // DCAU A: a PORT to a third host, whose connection must show alice's credential.
        assert_eq!(code(s.handle(Command::Eprt(other))), 200);
        let t = transfer(s.handle(Command::Retr("f".into())));
        assert!(t.gsi && t.endpoint == DataEndpoint::Active(other), "{t:?}");
        // A striped front end's nodes take no GSI connections: SPAS is this server's own.
        s.config.striped = true;
        assert!(matches!(s.handle(Command::Spas), Action::Passive { .. }));
        // DCAU N: the bounce it always was.
        assert_eq!(code(s.handle(Command::Dcau("N".into()))), 200);
        assert_eq!(code(s.handle(Command::Eprt(other))), 504);
        assert_eq!(code(s.handle(Command::Dcau("S /O=x".into()))), 504);
        assert_eq!(code(s.handle(Command::Dcau("A".into()))), 200);
        assert_eq!(code(s.handle(Command::Eprt(other))), 200);
        // Without a delegated proxy there is nothing to authenticate data connections with.
        let mut plain = gsi();
        plain.handle(Command::Auth("GSSAPI".into()));
        plain.handle(Command::Adat("AAAA".into()));
        let done = AdatOutcome::Done {
            token: Some("EEEE".into()),
            delegated: false,
        };
        assert_eq!(code(plain.adat_done(done)), 235);
        plain.handle(Command::User("alice".into()));
        plain.handle(Command::Pass("x".into()));
        plain.login_done_as(Ok((Perm::ReadWrite, "alice".into())));
        assert_eq!(code(plain.handle(Command::Dcau("A".into()))), 504);
        assert_eq!(code(plain.handle(Command::Eprt(other))), 504);
        // A failed context ends the connection.
        let mut failed = gsi();
        failed.handle(Command::Auth("GSSAPI".into()));
        failed.handle(Command::Adat("AAAA".into()));
        assert!(matches!(
            failed.adat_done(AdatOutcome::Failed("UnknownIssuer".into())),
            Action::Close(r) if r.code == 535
        ));
    }

    #[test]
    fn only_a_logged_in_data_node_takes_an_order_and_only_for_a_passive_mode_e_transfer() {
        let order = "BRAID NODE Client=198.18.0.9;Stripe=1/4;Block=4194304";
        // Not a data node: refused.
        let mut s = logged_in();
        assert_eq!(code(s.handle(Command::Opts(order.into()))), 504);
        let mut node = fresh(false);
        node.config.data_node = true;
        assert_eq!(code(node.handle(Command::Opts(order.into()))), 530);
        node.handle(Command::User("anonymous".into()));
        node.handle(Command::Pass("x".into()));
        node.login_done(Some(Perm::ReadWrite));
        let bad = "BRAID NODE Client=198.18.0.9;Stripe=4/4;Block=4194304";
        assert_eq!(code(node.handle(Command::Opts(bad.into()))), 501);
        assert_eq!(code(node.handle(Command::Opts(order.into()))), 200);
        // In stream mode the order cannot be carried out.
        node.handle(Command::Pasv);
        node.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(code(node.handle(Command::Retr("a".into()))), 504);
        node.handle(Command::Mode(Mode::Extended));
        node.handle(Command::Opts(order.into()));
        node.handle(Command::Pasv);
        node.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        let t = transfer(node.handle(Command::Retr("a".into())));
        let stripe = t.stripe.expect("the order goes with the transfer");
        assert_eq!((stripe.stripe, stripe.stripes), (1, 4));
        assert_eq!(
            stripe.client,
            "198.18.0.9".parse::<std::net::IpAddr>().unwrap()
        );
        // For that transfer only.
        node.handle(Command::Pasv);
        node.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(
            transfer(node.handle(Command::Retr("a".into()))).stripe,
            None
        );
    }

    /// A TLS session of `user`, PROT P, MODE E and elastic: what a third party needs.
    fn tls_user(user: &str, third_party: bool) -> Session {
        let mut s = fresh(true);
        s.config.third_party = third_party;
        assert!(matches!(
            s.handle(Command::Auth("TLS".into())),
            Action::StartTls(_)
        ));
        s.handle(Command::Pbsz(0));
        s.handle(Command::Prot('P'));
        s.handle(Command::User(user.into()));
        s.handle(Command::Pass("pw".into()));
        s.login_done(Some(Perm::ReadWrite));
        s.handle(Command::Mode(Mode::Extended));
        s.handle(Command::Opts("BRAID ELASTIC".into()));
        s
    }

    #[test]
    fn only_a_user_logged_in_over_tls_may_send_to_another_server_and_only_bound() {
        let other: SocketAddr = "198.18.0.9:5000".parse().unwrap();
        let peer = format!("BRAID PEER={}:{}", "ab".repeat(32), "cd".repeat(32));
        // Without OPTS BRAID PEER, PORT to any host but the client's is the bounce it was.
        let mut s = tls_user("alice", true);
        assert_eq!(code(s.handle(Command::Eprt(other))), 504);
        assert!(wire(&s.feat()).contains(" BRAID-PEER\r\n"));
        // In clear, anonymously, not logged in, or where the admin said no: refused.
        let mut clear = logged_in();
        assert_eq!(code(clear.handle(Command::Opts(peer.clone()))), 534);
        let mut anon = tls_user("anonymous", true);
        assert_eq!(code(anon.handle(Command::Opts(peer.clone()))), 550);
        assert_eq!(code(anon.handle(Command::Eprt(other))), 504);
        let mut off = tls_user("alice", false);
        assert_eq!(code(off.handle(Command::Opts(peer.clone()))), 504);
        assert!(!wire(&off.feat()).contains("BRAID-PEER"));
        let mut early = fresh(true);
        early.handle(Command::Auth("TLS".into()));
        assert_eq!(code(early.handle(Command::Opts(peer.clone()))), 530);
        assert_eq!(
            code(s.handle(Command::Opts("BRAID PEER=12:34".into()))),
            501
        );
        // Told the other server's certificate and binding: PORT there, a RETR that connects
        // as a TLS client proving that binding, but never to a privileged port.
        assert_eq!(code(s.handle(Command::Opts(peer))), 200);
        assert_eq!(
            code(s.handle(Command::Eprt("198.18.0.9:80".parse().unwrap()))),
            504
        );
        assert_eq!(code(s.handle(Command::Eprt(other))), 200);
        let t = transfer(s.handle(Command::Retr("a".into())));
        assert_eq!(t.endpoint, DataEndpoint::Active(other));
        assert_eq!(
            t.third_party,
            Some(ThirdParty::Connect(Box::new(PeerProof {
                certificate: [0xab; 32],
                binding: [0xcd; 32]
            })))
        );
        // Only over TLS data connections: with PROT C the transfer is refused.
        s.handle(Command::Prot('C'));
        s.handle(Command::Eprt(other));
        assert_eq!(code(s.handle(Command::Retr("a".into()))), 534);
        // Nor in stream mode, where no connection proves anything.
        s.handle(Command::Prot('P'));
        s.handle(Command::Mode(Mode::Stream));
        s.handle(Command::Eprt(other));
        assert_eq!(code(s.handle(Command::Retr("a".into()))), 534);
        // The receiving side takes connections from anyone, each to prove its binding.
        let mut b = tls_user("bob", true);
        assert_eq!(code(b.handle(Command::Opts("BRAID PEER=*".into()))), 200);
        b.handle(Command::Epsv(EpsvArg::Default));
        b.passive_done(true, Ok("127.0.0.1:5000".parse().unwrap()));
        let t = transfer(b.handle(Command::Stor("a".into())));
        assert_eq!(t.third_party, Some(ThirdParty::Accept));
        assert!(t.private);
        // A listing in stream mode stays the client's: nobody else may connect for it.
        b.handle(Command::Mode(Mode::Stream));
        b.handle(Command::Epsv(EpsvArg::Default));
        b.passive_done(true, Ok("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(transfer(b.handle(Command::Mlsd(None))).third_party, None);
    }

    #[test]
    fn a_listing_in_mode_e_under_auto_is_compressed_except_over_tls() {
        use crate::compress::Policy;
        let compression = |s: &mut Session, cmd: Command| {
            passive(s);
            transfer(s.handle(cmd)).block.and_then(|b| b.compression)
        };
        let mut s = logged_in();
        s.handle(Command::Mode(Mode::Extended));
        assert_eq!(
            code(s.handle(Command::Opts("BRAID COMPRESS=auto".into()))),
            200
        );
        // Too short for auto to measure whether compressing pays; text always shrinks.
        let mlsr = Command::Mlsr(Some("tree".into()));
        assert_eq!(compression(&mut s, mlsr.clone()), Some(Policy::On));
        assert_eq!(compression(&mut s, Command::Mlsd(None)), Some(Policy::On));
        // A file is left to auto.
        let retr = Command::Retr("f".into());
        assert_eq!(compression(&mut s, retr), Some(Policy::Auto));
        // Under PROT P auto compresses nothing, listings included (CRIME, BREACH).
        let mut s = tls_user("alice", false);
        s.handle(Command::Opts("BRAID COMPRESS=auto".into()));
        assert_eq!(compression(&mut s, mlsr), Some(Policy::Off));
    }

    fn logged_in() -> Session {
        let mut s = fresh(false);
        s.handle(Command::User("anonymous".into()));
        s.handle(Command::Pass("x".into()));
        assert!(matches!(s.login_done(Some(Perm::ReadWrite)), Action::Reply(r) if r.code == 230));
        s
    }

    fn wire(r: &Reply) -> String {
        let mut out = Vec::new();
        r.encode(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn code(a: Action) -> u16 {
        match a {
            Action::Reply(r) | Action::Close(r) => r.code,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn passive(s: &mut Session) {
        assert_eq!(
            s.handle(Command::Epsv(EpsvArg::Default)),
            Action::Passive { extended: true }
        );
        s.passive_done(true, Ok("127.0.0.1:5000".parse().unwrap()));
    }

    #[test]
    fn a_one_shot_greeting_names_its_certificate_for_the_client_to_pin() {
        let digest: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        let data: std::net::IpAddr = "198.18.0.2".parse().unwrap();
        let greeting = Session::greeting_with_certificate(&digest, data);
        // Through the wire and the parser, as the client reads it.
        let mut parser = crate::reply::ReplyParser::new();
        parser.feed(&greeting.to_bytes());
        let read = parser.next_reply().unwrap().unwrap();
        assert!(is_braid_greeting(&read) && reads_pipelined(&read));
        assert_eq!(pinned_certificate(&read), Some(digest));
        assert_eq!(data_address(&read), Some(data));
        assert!(takes_tls_ahead(&read));
        assert_eq!(data_address(&Session::greeting()), None);
        assert!(!takes_tls_ahead(&Session::greeting()));
        // An ordinary greeting names none, nor does another server's that says the words.
        assert_eq!(pinned_certificate(&Session::greeting()), None);
        let other = Reply::multi(
            220,
            vec![
                "Welcome".into(),
                format!("{CERTIFICATE_MARK} {}", "ab".repeat(32)),
            ],
        );
        assert_eq!(pinned_certificate(&other), None);
    }

    #[test]
    fn a_session_started_elsewhere_resolves_relative_paths_there() {
        let mut s = logged_in();
        let home = VPath::root().join("home/ann").unwrap();
        s.start_in(home);
        let Action::Reply(r) = s.handle(Command::Pwd) else {
            panic!("PWD answers")
        };
        assert!(wire(&r).contains("\"/home/ann\""), "{}", wire(&r));
        passive(&mut s);
        let Action::Transfer(t) = s.handle(Command::Retr("data/f".into())) else {
            panic!("no transfer")
        };
        assert_eq!(t.path().relative(), "home/ann/data/f");
        passive(&mut s);
        let Action::Transfer(t) = s.handle(Command::Retr("/etc/f".into())) else {
            panic!("no transfer")
        };
        assert_eq!(t.path().relative(), "etc/f");
    }

    #[test]
    fn a_bundle_names_files_where_retr_would_and_goes_in_mode_e_only() {
        let named = |size, path: &str| crate::bundle::Named {
            size,
            path: path.into(),
            mtime: None,
        };
        let mut s = logged_in();
        s.start_in(VPath::root().join("home/ann").unwrap());
        assert_eq!(code(s.handle(Command::RetrBundle)), 503);
        let bndl = |s: &mut Session, files| s.handle(Command::Bundle(files));
        assert_eq!(
            code(bndl(&mut s, vec![named(3, "a"), named(0, "d/b")])),
            200
        );
        assert_eq!(code(bndl(&mut s, vec![named(9, "/etc/c")])), 200);
        passive(&mut s);
        // Stream mode: refused, and the bundle is gone with it.
        assert_eq!(code(s.handle(Command::RetrBundle)), 504);
        assert_eq!(code(s.handle(Command::Mode(Mode::Extended))), 200);
        passive(&mut s);
        assert_eq!(code(s.handle(Command::RetrBundle)), 503);
        bndl(
            &mut s,
            vec![named(3, "a"), named(0, "d/b"), named(9, "/etc/c")],
        );
        let Action::Transfer(t) = s.handle(Command::RetrBundle) else {
            panic!("no transfer")
        };
        let TransferKind::Bundle(files) = &t.kind else {
            panic!("not a bundle: {:?}", t.kind)
        };
        let got: Vec<(String, u64)> = files.iter().map(|(p, n)| (p.relative(), *n)).collect();
        assert_eq!(
            got,
            [("home/ann/a", 3), ("home/ann/d/b", 0), ("etc/c", 9)].map(|(p, n)| (p.to_string(), n))
        );
        assert_eq!(t.path().relative(), "home/ann/a");
        // A path that leaves the root empties the bundle: RBND behind it is refused too.
        bndl(&mut s, vec![named(1, "a")]);
        assert_eq!(
            code(bndl(&mut s, vec![named(1, "ok"), named(1, "x\0y")])) / 100,
            5
        );
        // Lines behind a refused one are refused too: the bundle would move without its files.
        assert_eq!(code(bndl(&mut s, vec![named(1, "later")])), 503);
        passive(&mut s);
        assert_eq!(code(s.handle(Command::RetrBundle)), 503);
        // Its end starts the next afresh.
        assert_eq!(code(bndl(&mut s, vec![named(1, "later")])), 200);
        passive(&mut s);
        assert_eq!(
            transfer(s.handle(Command::RetrBundle)).path().relative(),
            "home/ann/later"
        );
        // Names past the cap (a hostile client's thousands of long paths) are refused.
        let long = format!("{}/", "d".repeat(250)).repeat(15);
        let line: Vec<_> = (0..100).map(|i| named(1, &format!("{long}{i}"))).collect();
        let taken = (0..100)
            .take_while(|_| code(bndl(&mut s, line.clone())) == 200)
            .count();
        // 100 names of 3.8 kB a line: the cap (16 MiB) falls in the 45th.
        assert_eq!(taken, 44);
        passive(&mut s);
        assert_eq!(code(s.handle(Command::RetrBundle)), 503);
        // Its end names what was sent.
        passive(&mut s);
        bndl(&mut s, vec![named(1, "a")]);
        let t = transfer(s.handle(Command::RetrBundle));
        let done = TransferOutcome::Complete {
            bytes: 1,
            kept: true,
            checksum: Some("00ff".into()),
        };
        let replies = s.transfer_done(&t, done);
        assert_eq!(
            crate::bundle::sum_in(&replies[0].text()),
            Some("00ff".into())
        );
    }

    #[test]
    fn a_stored_bundle_keeps_its_times_goes_whole_in_mode_e_and_needs_write_access() {
        let named = |size, path: &str, mtime| crate::bundle::Named {
            size,
            path: path.into(),
            mtime,
        };
        let mut s = logged_in();
        assert_eq!(code(s.handle(Command::StorBundle)), 503);
        let files = vec![named(3, "a", Some(1_700_000_000)), named(0, "d/b", None)];
        let scks = || Command::Scks {
            alg: "XXH3".into(),
            value: None,
        };
        s.handle(scks());
        s.handle(Command::Bundle(files.clone()));
        passive(&mut s);
        assert_eq!(code(s.handle(Command::StorBundle)), 504);
        assert_eq!(code(s.handle(Command::Mode(Mode::Extended))), 200);
        // Without the checksum of the whole to come, refused.
        s.handle(Command::Bundle(files.clone()));
        passive(&mut s);
        assert_eq!(code(s.handle(Command::StorBundle)), 503);
        s.handle(scks());
        s.handle(Command::Bundle(files.clone()));
        // Whole files only: REST before SBND refuses it.
        s.handle(Command::Rest(5));
        passive(&mut s);
        assert_eq!(code(s.handle(Command::StorBundle)), 504);
        s.handle(Command::Bundle(files.clone()));
        passive(&mut s);
        let t = transfer(s.handle(Command::StorBundle));
        assert_eq!(t.expect, Some(Expected::Deferred));
        assert_eq!(t.direction(), Direction::FromClient);
        let TransferKind::StoreBundle(got) = &t.kind else {
            panic!("not a stored bundle: {:?}", t.kind)
        };
        let got: Vec<_> = got.iter().map(|(p, n, t)| (p.relative(), *n, *t)).collect();
        assert_eq!(
            got,
            [
                ("a".to_string(), 3, Some(1_700_000_000)),
                ("d/b".to_string(), 0, None)
            ]
        );
        // A checksum that differs stores none of them, and says so.
        let mismatch = TransferOutcome::ChecksumMismatch {
            expected: "01".into(),
            actual: "02".into(),
        };
        let r = &s.transfer_done(&t, mismatch)[0];
        assert_eq!(r.code, 535);
        assert!(r.text().starts_with("SBND of 2 files"), "{}", r.text());
        assert!(r.text().contains("none of them stored"), "{}", r.text());
        // More than the server holds open at once, refused before a byte moves.
        let many: Vec<_> = (0..=crate::bundle::STORE_MOST)
            .map(|i| named(1, &format!("f{i}"), None))
            .collect();
        s.handle(scks());
        s.handle(Command::Bundle(many));
        passive(&mut s);
        assert_eq!(code(s.handle(Command::StorBundle)), 504);
        // A read-only account stores nothing.
        let mut ro = fresh(false);
        ro.handle(Command::User("anonymous".into()));
        ro.handle(Command::Pass("x".into()));
        ro.login_done(Some(Perm::ReadOnly));
        ro.handle(Command::Mode(Mode::Extended));
        ro.handle(scks());
        ro.handle(Command::Bundle(files));
        passive(&mut ro);
        assert_eq!(code(ro.handle(Command::StorBundle)), 550);
    }

    #[test]
    fn mode_e_retr_carries_parallelism_and_restart_ranges() {
        let mut s = logged_in();
        assert_eq!(code(s.handle(Command::Mode(Mode::Extended))), 200);
        assert_eq!(
            code(s.handle(Command::Opts("RETR Parallelism=8,8,8;".into()))),
            200
        );
        assert_eq!(
            code(s.handle(Command::Opts("RETR Parallelism=x;".into()))),
            501
        );
        // Capped at the server's limit.
        assert_eq!(
            code(s.handle(Command::Opts("RETR Parallelism=99,1,99;".into()))),
            200
        );
        passive(&mut s);
        let ranges = RangeSet::parse("0-100,200-300").unwrap();
        assert_eq!(code(s.handle(Command::RestRanges(ranges.clone()))), 350);
        let Action::Transfer(t) = s.handle(Command::Retr("f".into())) else {
            panic!("no transfer")
        };
        let block = t.block.expect("MODE E transfer");
        assert_eq!((block.parallelism, block.most), (16, 16));
        assert_eq!(block.have, ranges);
        // REST applies to one transfer only; a largest count above the first is kept apart
        // (a sender that tunes may go up to it), and MULT fixes the count again.
        assert_eq!(
            code(s.handle(Command::Opts("RETR Parallelism=4,1,12;".into()))),
            200
        );
        passive(&mut s);
        let Action::Transfer(t) = s.handle(Command::Retr("f".into())) else {
            panic!("no transfer")
        };
        assert!(t.block.as_ref().is_some_and(|b| b.have.is_empty()));
        assert_eq!(t.block.map(|b| (b.parallelism, b.most)), Some((4, 12)));
        s.handle(Command::Mult(3));
        passive(&mut s);
        let Action::Transfer(t) = s.handle(Command::Retr("f".into())) else {
            panic!("no transfer")
        };
        assert_eq!(t.block.map(|b| (b.parallelism, b.most)), Some((3, 3)));
    }

    #[test]
    fn mode_e_upload_needs_a_passive_server_and_binary_type() {
        let mut s = logged_in();
        s.handle(Command::Mode(Mode::Extended));
        assert_eq!(
            code(s.handle(Command::Port("127.0.0.1:5000".parse().unwrap()))),
            200
        );
        assert_eq!(code(s.handle(Command::Stor("f".into()))), 425);
        s.handle(Command::Type(TransferType::Ascii));
        passive(&mut s);
        assert_eq!(code(s.handle(Command::Retr("f".into()))), 504);
        s.handle(Command::Type(TransferType::Image));
        passive(&mut s);
        assert_eq!(
            code(s.handle(Command::Scks {
                alg: "XXH3".into(),
                value: None
            })),
            200
        );
        let Action::Transfer(t) = s.handle(Command::Stor("f".into())) else {
            panic!("no transfer")
        };
        assert!(t.block.is_some());
        assert_eq!(t.expect, Some(Expected::Deferred));
        // Back in stream mode, ranges are refused.
        s.handle(Command::Mode(Mode::Stream));
        passive(&mut s);
        s.handle(Command::RestRanges(RangeSet::parse("0-5").unwrap()));
        assert_eq!(code(s.handle(Command::Retr("f".into()))), 504);
        // A stream-mode upload carries its SCKS too (a resumed one is checked whole).
        passive(&mut s);
        s.handle(Command::Scks {
            alg: "XXH3".into(),
            value: Some("ab".into()),
        });
        let Action::Transfer(t) = s.handle(Command::Stor("f".into())) else {
            panic!("no transfer")
        };
        assert!(t.block.is_none());
        assert_eq!(t.expect, Some(Expected::Value("ab".into())));
    }

    #[test]
    fn cksm_scks_and_xftp_commands() {
        let mut s = logged_in();
        assert_eq!(
            code(s.handle(Command::Cksm {
                alg: "SHA1".into(),
                offset: 0,
                length: None,
                path: "f".into()
            })),
            504
        );
        assert_eq!(
            code(s.handle(Command::Cksm {
                alg: "XXH3".into(),
                offset: 5,
                length: None,
                path: "f".into()
            })),
            504
        );
        assert!(matches!(
            s.handle(Command::Cksm {
                alg: "md5".into(),
                offset: 0,
                length: Some(10),
                path: "f".into()
            }),
            Action::Fs(FsOp::Checksum {
                alg: ChecksumAlg::Md5,
                length: Some(10),
                ..
            })
        ));
        assert_eq!(
            wire(&s.fs_done(Ok(FsOutcome::Checksum("abc".into())))),
            "213 abc\r\n"
        );
        assert_eq!(
            code(s.handle(Command::Scks {
                alg: "MD5".into(),
                value: Some("ab".into())
            })),
            504
        );
        assert_eq!(code(s.handle(Command::Mult(0))), 501);
        assert_eq!(code(s.handle(Command::Mult(4))), 200);
        assert_eq!(code(s.handle(Command::Mprt(vec![40000, 40001, 80]))), 504);
        assert_eq!(code(s.handle(Command::Mprt(vec![40000, 40001]))), 200);
        s.handle(Command::Mode(Mode::Extended));
        let Action::Transfer(t) = s.handle(Command::Retr("f".into())) else {
            panic!("no transfer")
        };
        assert_eq!(t.block.map(|b| b.parallelism), Some(2));
        assert!(matches!(t.endpoint, DataEndpoint::ActivePorts(p) if p.len() == 2));
        // SPAS answers in GridFTP's striped form.
        assert_eq!(s.handle(Command::Spas), Action::Passive { extended: false });
        let r = s.passive_done(false, Ok("127.0.0.1:5000".parse().unwrap()));
        assert_eq!(
            wire(&r),
            "229-Entering Striped Passive Mode\r\n 127,0,0,1,19,136\r\n229 End\r\n"
        );
    }

    #[test]
    fn markers_have_gridftp_form() {
        let ranges = RangeSet::parse("0-20000000,30000000-30000007").unwrap();
        let r = range_marker(&ranges);
        assert_eq!(
            wire(&r),
            "111 Range Marker 0-20000000,30000000-30000007\r\n"
        );
        assert_eq!(parse_range_marker(&r), Some(ranges));
        assert_eq!(
            parse_range_marker(&Reply::new(111, "Range Marker 5-x")),
            None
        );
        assert_eq!(
            parse_range_marker(&Reply::new(226, "Range Marker 0-5")),
            None
        );
        let p = wire(&perf_marker(1795340180.25, 20000000));
        assert!(
            p.starts_with("112-Perf Marker\r\n Timestamp:  1795340180.2"),
            "{p}"
        );
        assert!(
            p.contains(" Stripe Bytes Transferred: 20000000\r\n") && p.ends_with("112 End.\r\n"),
            "{p}"
        );
    }

    fn transfer(a: Action) -> Transfer {
        match a {
            Action::Transfer(t) => t,
            other => panic!("expected a transfer, got {other:?}"),
        }
    }

    #[test]
    fn mode_e_data_connections_are_cached_per_direction() {
        let mut s = logged_in();
        s.handle(Command::Mode(Mode::Extended));
        assert_eq!(
            code(s.handle(Command::Port("127.0.0.1:5000".parse().unwrap()))),
            200
        );
        let first = transfer(s.handle(Command::Retr("a".into())));
        assert_eq!(first.opening(Some(3)).code, 150);
        s.transfer_done(
            &first,
            TransferOutcome::Complete {
                bytes: 3,
                kept: true,
                checksum: None,
            },
        );
        assert!(s.keeps_data_connections());
        // No new PORT: the next download rides on the kept connections, announced by 125.
        let second = transfer(s.handle(Command::Retr("b".into())));
        assert_eq!(second.endpoint, DataEndpoint::Cached);
        let opening = second.opening(Some(7));
        assert_eq!(opening.code, 125);
        assert!(wire(&opening).contains("reusing existing data connection"));
        // Those connections carry data to the client; an upload needs its own.
        assert_eq!(code(s.handle(Command::Stor("c".into()))), 425);
        // A failed transfer leaves nothing cached.
        s.transfer_done(&second, TransferOutcome::ConnectionLost("reset".into()));
        assert!(!s.keeps_data_connections());
        assert_eq!(code(s.handle(Command::Retr("b".into()))), 425);
        // Uploads cache too, and a new PASV retires the cache.
        passive(&mut s);
        let up = transfer(s.handle(Command::Stor("c".into())));
        s.transfer_done(
            &up,
            TransferOutcome::Complete {
                bytes: 1,
                kept: true,
                checksum: None,
            },
        );
        assert_eq!(
            transfer(s.handle(Command::Stor("d".into()))).endpoint,
            DataEndpoint::Cached
        );
        passive(&mut s);
        assert!(!s.keeps_data_connections());
        // The sender closed its connections (CLOSE bit): nothing to reuse.
        let up = transfer(s.handle(Command::Stor("e".into())));
        s.transfer_done(
            &up,
            TransferOutcome::Complete {
                bytes: 1,
                kept: false,
                checksum: None,
            },
        );
        assert_eq!(code(s.handle(Command::Stor("f".into()))), 425);
        // Stream mode never caches.
        s.handle(Command::Mode(Mode::Stream));
        passive(&mut s);
        let plain = transfer(s.handle(Command::Retr("a".into())));
        s.transfer_done(
            &plain,
            TransferOutcome::Complete {
                bytes: 3,
                kept: true,
                checksum: None,
            },
        );
        assert!(!s.keeps_data_connections());
    }
}
