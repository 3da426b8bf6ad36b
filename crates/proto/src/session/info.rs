//! What the server says about itself and its settings: FEAT, OPTS, STAT and HELP.

use super::{FACTS, Session};
use crate::reply::Reply;
use crate::retr_opts::RetrOpts;

impl Session {
    pub(super) fn feat(&self) -> Reply {
        let mlst: String = FACTS
            .iter()
            .map(|f| {
                let on = self.facts.contains(&f.to_ascii_lowercase());
                format!("{f}{};", if on { "*" } else { "" })
            })
            .collect();
        let mut lines: Vec<String> = vec!["Features:".into()];
        if self.config.tls {
            lines.extend([" AUTH TLS".into(), " PBSZ".into(), " PROT".into()]);
        }
        lines.extend([
            " EPRT".into(),
            " EPSV".into(),
            " MDTM".into(),
            " MFMT".into(),
            " MLSR".into(),
            format!(" MLST {mlst}"),
            " PARALLEL".into(),
            " PASV".into(),
            " REST STREAM".into(),
            " SBUF".into(),
            format!(" CKSM {};MD5;ADLER32;", crate::checksum::NAME),
            // 1: MODE E RETR over PASV/EPSV (the client opens the connections) and SCKS *.
            // 2: OPTS BRAID ELASTIC (connections join and leave mid-transfer) and MaxRate.
            // 3: under PROT P, MODE E data connections are TLS too, each bound to the
            // control session (the client proves it first on each connection).
            // 4: SCKS with a value during an upload that did not defer its own (`SCKS *`) is
            // queued for a later STOR: uploads can be announced ahead, checksum and all; and
            // OPTS STOR Eager=1: their data may come before STOR's answer, on the open data
            // connections only (a refused file's data is read and dropped).
            " BRAID 4".into(),
            // BNDL and RBND: many small files as one MODE E transfer (`crate::bundle`);
            // 2: SBND stores them, each with the time BNDL named.
            " BRAID-BUNDLE 2".into(),
        ]);
        // OPTS BRAID COMPRESS=auto|on|off is taken: MODE E blocks may then be compressed
        // (zstd, descriptor bit 0x02; see `crate::compress`). Listed only when this server
        // takes them, so that a client may send them without waiting for the answer.
        if self.config.compress != crate::compress::Policy::Off {
            lines.push(" BRAID-COMPRESS zstd".into());
        }
        // OPTS BRAID PEER: third-party transfers between braid servers, over TLS only.
        if self.config.third_party && self.config.tls {
            lines.push(" BRAID-PEER".into());
        }
        // SPAS lists data nodes, which move the file in stripes; P: under PROT P too, over
        // TLS bound to the client's session with this front end.
        if self.config.striped {
            lines.push(
                if self.config.tls {
                    " BRAID-STRIPED P"
                } else {
                    " BRAID-STRIPED"
                }
                .into(),
            );
        }
        // MODE Z is listed only when the server is told to compress: clients that see it use
        // it for every transfer (lftp does by default), and a deflate stream, unlike braid's
        // blocks, cannot back off where the CPU, not the link, is the limit. Asked for
        // unlisted, it is still given (unless off).
        if self.config.compress == crate::compress::Policy::On {
            lines.push(" MODE Z".into());
        }
        if self.config.gsi {
            lines.push(" DCAU".into());
        }
        // Under GSI the data connections are authenticated by GSI's handshake, which braid's
        // own extensions (its client opening more connections mid-transfer, TLS bound to the
        // session) do not run: the session is a GridFTP one.
        if self.under_gsi() {
            lines.retain(|l| !l.starts_with(" BRAID"));
        }
        lines.extend([
            " SIZE".into(),
            " SPAS".into(),
            " SPOR".into(),
            " TVFS".into(),
            " UTF8".into(),
            "End".into(),
        ]);
        Reply::multi(211, lines)
    }

    pub(super) fn opts(&mut self, arg: &str) -> Reply {
        let (name, value) = match arg.split_once(' ') {
            Some((n, v)) => (n.to_ascii_uppercase(), v.trim()),
            None => (arg.to_ascii_uppercase(), ""),
        };
        match name.as_str() {
            "UTF8" if value.eq_ignore_ascii_case("ON") || value.is_empty() => {
                Reply::new(200, "Always in UTF8 mode.")
            }
            "UTF8" => Reply::new(504, "UTF8 cannot be turned off."),
            // draft-preston-ftpext-deflate: `OPTS MODE Z LEVEL n` (0-9).
            "MODE" => {
                let words: Vec<&str> = value.split_whitespace().collect();
                match words.as_slice() {
                    [z, level, n]
                        if z.eq_ignore_ascii_case("Z") && level.eq_ignore_ascii_case("LEVEL") =>
                    {
                        match n.parse::<u8>() {
                            Ok(n) if n <= 9 => {
                                self.deflate_level = n;
                                Reply::new(200, format!("MODE Z level set to {n}."))
                            }
                            _ => Reply::new(501, "MODE Z LEVEL takes 0 to 9."),
                        }
                    }
                    _ => Reply::new(501, "OPTS MODE takes Z LEVEL n."),
                }
            }
            "MLST" => {
                let wanted: Vec<String> = value
                    .split(';')
                    .map(|f| f.trim().to_ascii_lowercase())
                    .filter(|f| FACTS.iter().any(|k| k.eq_ignore_ascii_case(f)))
                    .collect();
                self.facts = wanted;
                let shown: String = FACTS
                    .iter()
                    .filter(|f| self.facts.contains(&f.to_ascii_lowercase()))
                    .map(|f| format!("{f};"))
                    .collect();
                Reply::new(200, format!("MLST OPTS {shown}"))
            }
            "RETR" => match RetrOpts::parse(value) {
                Ok(o) => {
                    if let Some((start, _, most)) = o.parallelism {
                        self.parallelism = start.clamp(1, self.config.max_streams);
                        self.most_parallel = most.clamp(self.parallelism, self.config.max_streams);
                    }
                    if o.block_size.is_some() {
                        self.block_size = o.block_size;
                    }
                    if let Some(r) = o.max_rate {
                        self.max_rate = (r > 0).then_some(r);
                    }
                    if o.congestion.is_some() {
                        self.congestion = o.congestion;
                    }
                    if o.dscp.is_some() {
                        self.dscp = o.dscp;
                    }
                    if let Some(ms) = o.background {
                        self.background = (ms > 0).then_some(ms);
                    }
                    Reply::new(200, "OPTS Command Successful.")
                }
                Err(e) => Reply::new(501, format!("OPTS RETR: {e}.")),
            },
            "STOR" => match value
                .trim()
                .trim_end_matches(';')
                .to_ascii_lowercase()
                .as_str()
            {
                "eager=1" => {
                    self.eager = true;
                    Reply::new(
                        200,
                        "Eager uploads: data may come before STOR's answer, on the open data connections only; a refused file's data is dropped.",
                    )
                }
                "eager=0" => {
                    self.eager = false;
                    Reply::new(200, "Uploads wait for STOR's answer.")
                }
                _ => Reply::new(501, "OPTS STOR takes Eager=1 or Eager=0."),
            },
            "BRAID" if value.len() > 9 && value[..9].eq_ignore_ascii_case("COMPRESS=") => {
                self.compress_opts(&value[9..])
            }
            "BRAID" if value.len() > 5 && value[..5].eq_ignore_ascii_case("PEER=") => {
                self.peer_opts(&value[5..])
            }
            "BRAID" if value.len() > 5 && value[..5].eq_ignore_ascii_case("NODE ") => {
                self.node_opts(&value[5..])
            }
            "BRAID" if value.eq_ignore_ascii_case("ELASTIC") => {
                self.elastic = true;
                Reply::new(
                    200,
                    "Elastic MODE E: data connections may join, leave and break mid-transfer.",
                )
            }
            _ => Reply::new(501, format!("OPTS {name} is not understood.")),
        }
    }

    /// `OPTS BRAID PEER=*` (data connections may come from another server) or
    /// `OPTS BRAID PEER=CERT:BINDING` (they go to the braid server whose certificate has SHA-256
    /// CERT, proving BINDING; both hex): a third-party transfer. Only for a user who logged in
    /// with a password over TLS, where each data connection must prove a binding; never for
    /// anonymous users, who could otherwise aim this server at anyone.
    fn peer_opts(&mut self, value: &str) -> Reply {
        if !self.config.third_party {
            return Reply::new(
                504,
                "This server takes no part in third-party transfers (braid serve --no-third-party).",
            );
        }
        if !self.protection.control {
            return Reply::new(
                534,
                "Third-party transfers need TLS: send AUTH TLS, log in, then OPTS BRAID PEER.",
            );
        }
        match self.user() {
            None => return Reply::new(530, "Log in first."),
            Some(u) if super::is_anonymous(u) => {
                return Reply::new(
                    550,
                    "Anonymous users cannot send to or take from another server.",
                );
            }
            Some(_) => {}
        }
        let value = value.trim();
        if value == "*" {
            self.third_party = Some(super::ThirdParty::Accept);
            return Reply::new(
                200,
                "Data connections may come from another server; each must prove this session's TLS binding.",
            );
        }
        match value
            .split_once(':')
            .and_then(|(c, b)| Some((crate::hex::decode(c)?, crate::hex::decode(b)?)))
        {
            Some((certificate, binding)) => {
                self.third_party = Some(super::ThirdParty::Connect(Box::new(super::PeerProof {
                    certificate,
                    binding,
                })));
                Reply::new(
                    200,
                    "Data connections may go to another braid server: TLS to the certificate named, bound to its session with you.",
                )
            }
            None => Reply::new(
                501,
                "OPTS BRAID PEER takes * or CERT:BINDING (the other server's certificate SHA-256 and its session's binding, 64 hex digits each).",
            ),
        }
    }

    /// `OPTS BRAID NODE ...` (see [`crate::stripes::NodeOrder`]): only a data node takes it,
    /// and only from its front end (the one account a data node has).
    fn node_opts(&mut self, value: &str) -> Reply {
        if !self.config.data_node {
            return Reply::new(
                504,
                "This server is not a data node (braid serve --data-node).",
            );
        }
        if self.user().is_none() {
            return Reply::new(530, "Log in first.");
        }
        match crate::stripes::NodeOrder::parse(value) {
            Ok(order) => {
                let r = Reply::new(
                    200,
                    format!(
                        "Stripe {}/{} for {}, next transfer.",
                        order.stripe, order.stripes, order.client
                    ),
                );
                self.node_order = Some(order);
                r
            }
            Err(e) => Reply::new(501, format!("OPTS BRAID NODE: {e}.")),
        }
    }

    /// `OPTS BRAID COMPRESS=auto|on|off`: compressed MODE E blocks for this session, unless
    /// the server's own setting is off.
    fn compress_opts(&mut self, value: &str) -> Reply {
        use crate::compress::Policy;
        let asked = match Policy::parse(value) {
            Ok(p) => p,
            Err(e) => return Reply::new(501, format!("OPTS BRAID COMPRESS: {e}.")),
        };
        if self.config.compress == Policy::Off {
            self.compress = None;
            return Reply::new(
                504,
                "This server compresses nothing (braid serve --compress off); blocks go as they are.",
            );
        }
        self.compress = Some(asked);
        Reply::new(
            200,
            format!(
                "Compressed blocks (zstd): {} for downloads; uploads may send them.",
                asked.with(self.config.compress).name()
            ),
        )
    }

    pub(super) fn status(&self) -> Reply {
        let user = self.user().unwrap_or("(not logged in)");
        Reply::multi(
            211,
            vec![
                "braid FTP server status:".into(),
                format!("    Connected to {}", self.peer),
                format!("    Logged in as {user}"),
                format!("    TYPE: {}", if self.ascii { "ASCII" } else { "BINARY" }),
                format!(
                    "    MODE: {}; STRU: File; parallelism {}",
                    if self.extended {
                        "Extended block"
                    } else {
                        "Stream"
                    },
                    self.parallelism
                ),
                "End of status".into(),
            ],
        )
    }
}

pub(super) fn help(arg: Option<&str>) -> Reply {
    if let Some(cmd) = arg {
        return Reply::new(
            214,
            format!(
                "Syntax: {} (see RFC 959, 2389, 2428, 3659).",
                cmd.to_ascii_uppercase()
            ),
        );
    }
    let mut lines = vec!["The following commands are recognized:".to_string()];
    for chunk in crate::command::KNOWN_VERBS.chunks(8) {
        lines.push(format!(" {}", chunk.join(" ")));
    }
    lines.push("Help OK.".into());
    Reply::multi(214, lines)
}
