//! Settings for the next transfers: type, mode, structure, where the data connections come
//! from (passive, active, XFTP's MULT/MPRT, GridFTP's SPAS/SPOR), restart points and buffer
//! sizes. Each answers at once; only PASV and its kin ask the caller for I/O.

use super::{DataEndpoint, Session, family};
use crate::command::{Command, EpsvArg, Mode, Structure, TransferType};
use crate::compress::Policy;
use crate::reply::Reply;
use crate::session::Action;
use std::net::SocketAddr;

impl Session {
    /// One setting command from a logged-in client.
    pub(super) fn setting(&mut self, cmd: Command) -> Action {
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));
        match cmd {
            Command::Type(t) => {
                self.ascii = t == TransferType::Ascii;
                match t {
                    TransferType::Ascii => reply(200, "Switching to ASCII mode."),
                    TransferType::Image => reply(200, "Switching to Binary mode."),
                }
            }
            Command::Mode(Mode::Stream) => {
                self.extended = false;
                self.deflate = false;
                reply(200, "Mode set to S.")
            }
            Command::Mode(Mode::Extended) => {
                self.extended = true;
                self.deflate = false;
                reply(200, "Mode set to E.")
            }
            Command::Mode(Mode::Deflate) if self.config.compress == Policy::Off => reply(
                504,
                "MODE Z is off on this server (braid serve --compress off); use MODE S.",
            ),
            Command::Mode(Mode::Deflate) => {
                self.extended = false;
                self.deflate = true;
                reply(200, "Mode set to Z.")
            }
            Command::Mode(_) => reply(504, "Only MODE S, MODE E and MODE Z are supported."),
            Command::Stru(Structure::File) => reply(200, "Structure set to F."),
            Command::Stru(_) => reply(504, "Only STRU F is supported."),
            Command::Pasv => {
                if self.epsv_all {
                    return reply(503, "EPSV ALL is in effect; use EPSV.");
                }
                if self.peer.is_ipv6() {
                    return reply(522, "PASV is IPv4 only; use EPSV (1,2).");
                }
                Action::Passive { extended: false }
            }
            Command::Epsv(EpsvArg::All) => {
                self.epsv_all = true;
                reply(200, "EPSV ALL ok.")
            }
            Command::Epsv(EpsvArg::Family(f)) if f != family(self.peer) => {
                Action::Reply(Reply::new(
                    522,
                    format!(
                        "Network protocol not supported, use ({}).",
                        family(self.peer)
                    ),
                ))
            }
            Command::Epsv(_) => Action::Passive { extended: true },
            // One stripe: SPAS is PASV with GridFTP's multi-line reply.
            Command::Spas => {
                if self.peer.is_ipv6() {
                    return reply(522, "SPAS is IPv4 only; use EPSV (1,2).");
                }
                self.spas = true;
                // The data nodes take only the client their front end names, by its address
                // and braid's TLS, not by GSI: under DCAU A the data goes through this server.
                if self.config.striped && !self.protection.dcau {
                    return Action::StripedPassive;
                }
                Action::Passive { extended: false }
            }
            Command::Spor(addrs) => match addrs.as_slice() {
                [one] => self.active(SocketAddr::V4(*one)),
                _ => reply(504, "This server has one stripe; give SPOR one address."),
            },
            Command::Mult(n) => {
                if n == 0 {
                    return reply(501, "MULT needs at least 1 connection.");
                }
                self.parallelism = n.min(self.config.max_streams);
                self.most_parallel = self.parallelism;
                Action::Reply(Reply::new(
                    200,
                    format!(
                        "MULT {} ok; send MODE E blocks on that many connections.",
                        self.parallelism
                    ),
                ))
            }
            Command::Mprt(ports) => {
                if ports.is_empty() || ports.len() > self.config.max_streams as usize {
                    return reply(
                        501,
                        "MPRT needs between 1 and the server's stream limit of ports.",
                    );
                }
                if ports.iter().any(|p| *p < 1024) {
                    return reply(504, "Refused: port below 1024 (RFC 2577).");
                }
                if self.epsv_all {
                    return reply(503, "EPSV ALL is in effect; use EPSV.");
                }
                self.parallelism = ports.len() as u32;
                self.most_parallel = self.parallelism;
                self.endpoint = Some(DataEndpoint::ActivePorts(
                    ports
                        .iter()
                        .map(|p| SocketAddr::new(self.peer, *p))
                        .collect(),
                ));
                reply(200, "MPRT command successful.")
            }
            Command::Port(a) => self.active(SocketAddr::V4(a)),
            Command::Eprt(a) => self.active(a),
            Command::RestRanges(ranges) => {
                self.rest = 0;
                self.rest_ranges = Some(ranges);
                reply(
                    350,
                    "Restart Marker OK. Send STORE or RETR to initiate transfer.",
                )
            }
            Command::Rest(n) => {
                self.rest_ranges = None;
                self.rest = n;
                Action::Reply(Reply::new(
                    350,
                    format!("Restarting at {n}. Send STOR or RETR to initiate transfer."),
                ))
            }
            // ALLO N [R M] (RFC 959): the next upload's size, which a server with quotas
            // checks before any data moves.
            Command::Allo(arg) => {
                self.allocate = arg.split_whitespace().next().and_then(|n| n.parse().ok());
                reply(200, "ALLO command successful.")
            }
            Command::Sbuf(n) => {
                // Past 1 GiB the kernel clamps anyway; zero means "let the kernel tune".
                self.buffer = (n > 0).then_some(n.min(1 << 30));
                reply(200, "SBUF Command Successful.")
            }
            _ => reply(500, "Not a setting."),
        }
    }
}
