//! FTP commands: one type for both directions. The server parses them, the client encodes them.

use crate::addr::{self, AddrError};
use crate::ranges::RangeSet;
use std::net::{SocketAddr, SocketAddrV4};

/// Representation type (RFC 959 TYPE). Only the types braid serves are representable;
/// EBCDIC and local byte sizes other than 8 are refused at parse time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferType {
    /// `TYPE A`: text, lines end in CRLF on the wire.
    Ascii,
    /// `TYPE I` (or `L 8`): bytes as they are.
    Image,
}

/// Transfer mode (RFC 959 MODE, GridFTP MODE E).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Stream,
    Block,
    Compressed,
    Extended,
    /// Stream mode whose data is one zlib (deflate) stream per transfer
    /// (draft-preston-ftpext-deflate; lftp, ProFTPD's mod_deflate).
    Deflate,
}

/// File structure (RFC 959 STRU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    File,
    Record,
    Page,
}

/// The argument of EPSV (RFC 2428).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpsvArg {
    /// No argument: the server picks the control connection's family.
    Default,
    /// `EPSV 1` or `EPSV 2`.
    Family(u8),
    /// `EPSV ALL`: the client promises no more PORT, PASV or EPRT.
    All,
}

/// An FTP command. Paths and names are kept exactly as sent (after the single space that
/// separates them from the verb); resolving them is the session's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    User(String),
    Pass(String),
    Acct(String),
    Quit,
    Rein,
    Syst,
    Noop,
    Feat,
    Help(Option<String>),
    Stat(Option<String>),
    Opts(String),
    Site(String),
    Type(TransferType),
    Mode(Mode),
    Stru(Structure),
    Pwd,
    Cwd(String),
    Cdup,
    Pasv,
    Epsv(EpsvArg),
    Port(SocketAddrV4),
    Eprt(SocketAddr),
    Rest(u64),
    /// `REST a-b,c-d` (GridFTP): in MODE E, the ranges the receiver already holds.
    RestRanges(RangeSet),
    Allo(String),
    /// `AUTH TLS` (RFC 4217; `SSL` and `TLS-C` are old spellings), upper-cased.
    Auth(String),
    /// `PBSZ n`: protection buffer size, always 0 for TLS.
    Pbsz(u64),
    /// `PROT C|S|E|P`: clear or private data connections.
    Prot(char),
    /// `ADAT <base64>` (RFC 2228): a token of the security exchange AUTH GSSAPI began.
    Adat(String),
    /// `DCAU N|A|S subject` (GridFTP): how data connections are authenticated under GSI.
    Dcau(String),
    /// `CKSM alg offset length path` (GridFTP); length None is `-1`, to the end of the file.
    Cksm {
        alg: String,
        offset: u64,
        length: Option<u64>,
        path: String,
    },
    /// `SCKS alg value`: the checksum the next upload must have. braid also accepts `*` for
    /// "the value follows once the data is sent" (value None).
    Scks {
        alg: String,
        value: Option<String>,
    },
    /// `SBUF n`: TCP buffer size for data connections (GridFTP).
    Sbuf(u64),
    /// `MULT n` (XFTP): use n data connections.
    Mult(u32),
    /// `MPRT p1,...,pn` (XFTP): the client listens on these ports at its control address.
    Mprt(Vec<u16>),
    /// `SPAS` (GridFTP striped passive).
    Spas,
    /// `SPOR h1,h2,h3,h4,p1,p2 ...` (GridFTP striped port).
    Spor(Vec<SocketAddrV4>),
    Retr(String),
    /// `BNDL SIZE:PATH ...` (braid): adds files, each at the size the client expects, to the
    /// bundle the next RBND sends or SBND stores ([`crate::bundle`]).
    Bundle(Vec<crate::bundle::Named>),
    /// `RBND` (braid): sends the files BNDL named as one MODE E transfer.
    RetrBundle,
    /// `SBND` (braid): stores the files BNDL named, sent as one MODE E transfer.
    StorBundle,
    Stor(String),
    Appe(String),
    List(Option<String>),
    Nlst(Option<String>),
    Mlsd(Option<String>),
    /// `MLSR [dir]` (GridFTP): MLSD of the whole tree beneath `dir`, each entry named by its
    /// path relative to it.
    Mlsr(Option<String>),
    Mlst(Option<String>),
    Size(String),
    Mdtm(String),
    /// MFMT (draft-somers-ftp-mfxx): set a file's modification time, seconds since the epoch
    /// (UTC), and the path.
    Mfmt(i64, String),
    Dele(String),
    Mkd(String),
    Rmd(String),
    Rnfr(String),
    Rnto(String),
    Abor,
    /// A verb braid does not know. The server answers 502.
    Unknown {
        verb: String,
        arg: Option<String>,
    },
}

/// Why a command line could not be parsed, with the reply code the server should give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty command line")]
    Empty,
    #[error("command line is not valid UTF-8 (RFC 2640)")]
    NotUtf8,
    #[error("{0} needs an argument")]
    MissingArgument(&'static str),
    #[error("bad argument to {verb}: {reason}")]
    BadArgument { verb: &'static str, reason: String },
    #[error("{verb} {arg} is not implemented")]
    Unsupported { verb: &'static str, arg: String },
    #[error("network protocol not supported, use (1,2)")]
    UnsupportedFamily,
}

impl ParseError {
    /// The reply code RFC 959 and RFC 2428 assign to this failure.
    pub fn reply_code(&self) -> u16 {
        match self {
            ParseError::Empty => 500,
            ParseError::NotUtf8 => 501,
            ParseError::MissingArgument(_) | ParseError::BadArgument { .. } => 501,
            ParseError::Unsupported { .. } => 504,
            ParseError::UnsupportedFamily => 522,
        }
    }
}

impl Command {
    /// Parses one control line without its end of line. Never panics, whatever the bytes.
    pub fn parse(line: &[u8]) -> Result<Command, ParseError> {
        let line = std::str::from_utf8(line).map_err(|_| ParseError::NotUtf8)?;
        if line.trim().is_empty() {
            return Err(ParseError::Empty);
        }
        let (verb, arg) = match line.find(' ') {
            Some(i) => (&line[..i], Some(&line[i + 1..])),
            None => (line, None),
        };
        let verb_upper = verb.to_ascii_uppercase();
        // Arguments that are paths keep every byte; arguments that are keywords or numbers
        // tolerate surrounding blanks.
        let path = |name: &'static str| -> Result<String, ParseError> {
            match arg {
                Some(a) if !a.is_empty() => Ok(a.to_string()),
                _ => Err(ParseError::MissingArgument(name)),
            }
        };
        let opt_arg = || arg.filter(|a| !a.is_empty()).map(str::to_string);
        let word = arg.map(str::trim).unwrap_or("");
        Ok(match verb_upper.as_str() {
            "USER" => Command::User(path("USER")?),
            // An empty password is legal (RFC 959 allows PASS with any string).
            "PASS" => Command::Pass(arg.unwrap_or("").to_string()),
            "ACCT" => Command::Acct(path("ACCT")?),
            "QUIT" => Command::Quit,
            "REIN" => Command::Rein,
            "SYST" => Command::Syst,
            "NOOP" => Command::Noop,
            "FEAT" => Command::Feat,
            "HELP" => Command::Help(opt_arg()),
            "STAT" => Command::Stat(opt_arg()),
            "OPTS" => Command::Opts(path("OPTS")?),
            "SITE" => Command::Site(path("SITE")?),
            "TYPE" => Command::Type(parse_type(word)?),
            "MODE" => Command::Mode(match word.to_ascii_uppercase().as_str() {
                "S" => Mode::Stream,
                "B" => Mode::Block,
                "C" => Mode::Compressed,
                "E" => Mode::Extended,
                "Z" => Mode::Deflate,
                "" => return Err(ParseError::MissingArgument("MODE")),
                _ => return Err(bad("MODE", "expected S, B, C, E or Z")),
            }),
            "STRU" => Command::Stru(match word.to_ascii_uppercase().as_str() {
                "F" => Structure::File,
                "R" => Structure::Record,
                "P" => Structure::Page,
                "" => return Err(ParseError::MissingArgument("STRU")),
                _ => return Err(bad("STRU", "expected F, R or P")),
            }),
            "PWD" | "XPWD" => Command::Pwd,
            "CWD" | "XCWD" => Command::Cwd(path("CWD")?),
            "CDUP" | "XCUP" => Command::Cdup,
            "PASV" => Command::Pasv,
            "EPSV" => Command::Epsv(match word.to_ascii_uppercase().as_str() {
                "" => EpsvArg::Default,
                "ALL" => EpsvArg::All,
                "1" => EpsvArg::Family(1),
                "2" => EpsvArg::Family(2),
                _ => return Err(ParseError::UnsupportedFamily),
            }),
            "PORT" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("PORT"));
                }
                Command::Port(addr::parse_host_port(word).map_err(|e| bad("PORT", e))?)
            }
            "EPRT" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("EPRT"));
                }
                Command::Eprt(addr::parse_eprt(word).map_err(|e| match e {
                    AddrError::UnsupportedFamily(_) => ParseError::UnsupportedFamily,
                    e => bad("EPRT", e),
                })?)
            }
            "REST" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("REST"));
                }
                if word.contains(['-', ',']) {
                    let set = RangeSet::parse(word).map_err(|e| bad("REST", e))?;
                    if set.is_empty() {
                        return Err(bad("REST", "the range list covers no bytes"));
                    }
                    return Ok(Command::RestRanges(set));
                }
                if !word.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("REST", "expected a byte offset"));
                }
                Command::Rest(word.parse().map_err(|_| bad("REST", "offset too large"))?)
            }
            "ALLO" => Command::Allo(path("ALLO")?),
            "AUTH" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("AUTH"));
                }
                Command::Auth(word.to_ascii_uppercase())
            }
            "PBSZ" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("PBSZ"));
                }
                Command::Pbsz(word.parse().map_err(|_| bad("PBSZ", "expected a number"))?)
            }
            "ADAT" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("ADAT"));
                }
                Command::Adat(word.to_string())
            }
            "DCAU" => {
                if word.is_empty() {
                    return Err(ParseError::MissingArgument("DCAU"));
                }
                Command::Dcau(word.to_string())
            }
            "PROT" => match word.to_ascii_uppercase().as_str() {
                "" => return Err(ParseError::MissingArgument("PROT")),
                l @ ("C" | "S" | "E" | "P") => Command::Prot(l.chars().next().unwrap_or('C')),
                _ => return Err(bad("PROT", "expected C, S, E or P")),
            },
            "CKSM" => parse_cksm(arg.unwrap_or(""))?,
            "SCKS" => {
                let (alg, value) = word
                    .split_once(' ')
                    .ok_or(ParseError::MissingArgument("SCKS"))?;
                let value = value.trim();
                if value.is_empty()
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'*')
                {
                    return Err(bad("SCKS", "expected an algorithm and a hex value or *"));
                }
                Command::Scks {
                    alg: alg.to_ascii_uppercase(),
                    value: (value != "*").then(|| value.to_ascii_lowercase()),
                }
            }
            "SBUF" => Command::Sbuf(number("SBUF", word)?),
            "MULT" => Command::Mult(number("MULT", word)?),
            "MPRT" => Command::Mprt(
                word.split(',')
                    .map(|p| number("MPRT", p.trim()))
                    .collect::<Result<Vec<u16>, _>>()?,
            ),
            "SPAS" => Command::Spas,
            "SPOR" => Command::Spor(
                word.split_whitespace()
                    .map(|a| addr::parse_host_port(a).map_err(|e| bad("SPOR", e)))
                    .collect::<Result<Vec<_>, _>>()
                    .and_then(|v| {
                        if v.is_empty() {
                            Err(ParseError::MissingArgument("SPOR"))
                        } else {
                            Ok(v)
                        }
                    })?,
            ),
            "RETR" => Command::Retr(path("RETR")?),
            "BNDL" => {
                let files = crate::bundle::decode(word).map_err(|e| bad("BNDL", e))?;
                if files.is_empty() {
                    return Err(ParseError::MissingArgument("BNDL"));
                }
                Command::Bundle(files)
            }
            "RBND" => Command::RetrBundle,
            "SBND" => Command::StorBundle,
            "STOR" => Command::Stor(path("STOR")?),
            "APPE" => Command::Appe(path("APPE")?),
            "LIST" => Command::List(opt_arg()),
            "NLST" => Command::Nlst(opt_arg()),
            "MLSD" => Command::Mlsd(opt_arg()),
            "MLSR" => Command::Mlsr(opt_arg()),
            "MLST" => Command::Mlst(opt_arg()),
            "SIZE" => Command::Size(path("SIZE")?),
            "MDTM" => Command::Mdtm(path("MDTM")?),
            "MFMT" => {
                let (time, name) = path("MFMT")?
                    .split_once(' ')
                    .map(|(t, n)| (t.to_string(), n.to_string()))
                    .ok_or_else(|| bad("MFMT", "expected YYYYMMDDHHMMSS and a path"))?;
                let civil = crate::time::Civil::parse_mdtm(&time)
                    .ok_or_else(|| bad("MFMT", "expected a time as YYYYMMDDHHMMSS (UTC)"))?;
                if name.is_empty() {
                    return Err(ParseError::MissingArgument("MFMT"));
                }
                Command::Mfmt(civil.to_unix(), name)
            }
            "DELE" => Command::Dele(path("DELE")?),
            "MKD" | "XMKD" => Command::Mkd(path("MKD")?),
            "RMD" | "XRMD" => Command::Rmd(path("RMD")?),
            "RNFR" => Command::Rnfr(path("RNFR")?),
            "RNTO" => Command::Rnto(path("RNTO")?),
            "ABOR" => Command::Abor,
            _ => Command::Unknown {
                verb: verb_upper,
                arg: arg.map(str::to_string),
            },
        })
    }

    /// Appends the command line, CRLF included. Arguments must not contain CR or LF.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let line = self.to_line();
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// The command line without CRLF, as it appears in logs (with PASS masked by the caller).
    pub fn to_line(&self) -> String {
        let with = |verb: &str, arg: &str| format!("{verb} {arg}");
        let opt = |verb: &str, arg: &Option<String>| match arg {
            Some(a) => with(verb, a),
            None => verb.to_string(),
        };
        match self {
            Command::User(a) => with("USER", a),
            Command::Pass(a) => with("PASS", a),
            Command::Acct(a) => with("ACCT", a),
            Command::Quit => "QUIT".into(),
            Command::Rein => "REIN".into(),
            Command::Syst => "SYST".into(),
            Command::Noop => "NOOP".into(),
            Command::Feat => "FEAT".into(),
            Command::Help(a) => opt("HELP", a),
            Command::Stat(a) => opt("STAT", a),
            Command::Opts(a) => with("OPTS", a),
            Command::Site(a) => with("SITE", a),
            Command::Type(TransferType::Ascii) => "TYPE A".into(),
            Command::Type(TransferType::Image) => "TYPE I".into(),
            Command::Mode(m) => with(
                "MODE",
                match m {
                    Mode::Stream => "S",
                    Mode::Block => "B",
                    Mode::Compressed => "C",
                    Mode::Extended => "E",
                    Mode::Deflate => "Z",
                },
            ),
            Command::Stru(s) => with(
                "STRU",
                match s {
                    Structure::File => "F",
                    Structure::Record => "R",
                    Structure::Page => "P",
                },
            ),
            Command::Pwd => "PWD".into(),
            Command::Cwd(a) => with("CWD", a),
            Command::Cdup => "CDUP".into(),
            Command::Pasv => "PASV".into(),
            Command::Epsv(EpsvArg::Default) => "EPSV".into(),
            Command::Epsv(EpsvArg::All) => "EPSV ALL".into(),
            Command::Epsv(EpsvArg::Family(f)) => format!("EPSV {f}"),
            Command::Port(a) => with("PORT", &addr::format_host_port(*a)),
            Command::Eprt(a) => with("EPRT", &addr::format_eprt(*a)),
            Command::Rest(n) => format!("REST {n}"),
            Command::RestRanges(r) => format!("REST {r}"),
            Command::Cksm {
                alg,
                offset,
                length,
                path,
            } => match length {
                Some(l) => format!("CKSM {alg} {offset} {l} {path}"),
                None => format!("CKSM {alg} {offset} -1 {path}"),
            },
            Command::Scks { alg, value } => {
                format!("SCKS {alg} {}", value.as_deref().unwrap_or("*"))
            }
            Command::Sbuf(n) => format!("SBUF {n}"),
            Command::Mult(n) => format!("MULT {n}"),
            Command::Mprt(ports) => format!(
                "MPRT {}",
                ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Command::Spas => "SPAS".into(),
            Command::Spor(addrs) => format!(
                "SPOR {}",
                addrs
                    .iter()
                    .map(|a| addr::format_host_port(*a))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Command::Allo(a) => with("ALLO", a),
            Command::Auth(a) => with("AUTH", a),
            Command::Pbsz(n) => format!("PBSZ {n}"),
            Command::Prot(l) => format!("PROT {l}"),
            Command::Adat(t) => with("ADAT", t),
            Command::Dcau(d) => with("DCAU", d),
            Command::Retr(a) => with("RETR", a),
            Command::Bundle(files) => format!("BNDL {}", crate::bundle::encode(files)),
            Command::RetrBundle => "RBND".into(),
            Command::StorBundle => "SBND".into(),
            Command::Stor(a) => with("STOR", a),
            Command::Appe(a) => with("APPE", a),
            Command::List(a) => opt("LIST", a),
            Command::Nlst(a) => opt("NLST", a),
            Command::Mlsd(a) => opt("MLSD", a),
            Command::Mlsr(a) => opt("MLSR", a),
            Command::Mlst(a) => opt("MLST", a),
            Command::Size(a) => with("SIZE", a),
            Command::Mdtm(a) => with("MDTM", a),
            Command::Mfmt(t, a) => format!("MFMT {} {a}", crate::time::Civil::from_unix(*t).mdtm()),
            Command::Dele(a) => with("DELE", a),
            Command::Mkd(a) => with("MKD", a),
            Command::Rmd(a) => with("RMD", a),
            Command::Rnfr(a) => with("RNFR", a),
            Command::Rnto(a) => with("RNTO", a),
            Command::Abor => "ABOR".into(),
            Command::Unknown { verb, arg } => opt(verb, arg),
        }
    }

    /// The verb, for logs and for replies that name the command.
    pub fn verb(&self) -> &str {
        match self {
            Command::Unknown { verb, .. } => verb,
            _ => {
                let line = self.to_line();
                let end = line.find(' ').unwrap_or(line.len());
                KNOWN_VERBS
                    .iter()
                    .find(|v| **v == &line[..end])
                    .copied()
                    .unwrap_or("?")
            }
        }
    }
}

/// Every verb the parser knows (aliases such as XPWD included), for HELP and for tests.
pub const KNOWN_VERBS: &[&str] = &[
    "ABOR", "ACCT", "ADAT", "ALLO", "APPE", "AUTH", "BNDL", "CDUP", "CKSM", "CWD", "DCAU", "DELE",
    "EPRT", "EPSV", "FEAT", "HELP", "LIST", "MDTM", "MFMT", "MKD", "MLSD", "MLSR", "MLST", "MODE",
    "MPRT", "MULT", "NLST", "NOOP", "OPTS", "PASS", "PASV", "PBSZ", "PORT", "PROT", "PWD", "SBUF",
    "SCKS", "SPAS", "SPOR", "QUIT", "RBND", "REIN", "REST", "RETR", "RMD", "RNFR", "RNTO", "SITE",
    "SIZE", "STAT", "STOR", "STRU", "SYST", "TYPE", "USER", "XCUP", "XCWD", "XMKD", "XPWD", "XRMD",
];

fn bad(verb: &'static str, reason: impl ToString) -> ParseError {
    ParseError::BadArgument {
        verb,
        reason: reason.to_string(),
    }
}

/// A decimal number argument.
fn number<T: std::str::FromStr>(verb: &'static str, word: &str) -> Result<T, ParseError> {
    if word.is_empty() {
        return Err(ParseError::MissingArgument(verb));
    }
    if !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::BadArgument {
            verb,
            reason: format!(
                "expected a number, got {:?}",
                word.chars().take(40).collect::<String>()
            ),
        });
    }
    word.parse().map_err(|_| ParseError::BadArgument {
        verb,
        reason: "number too large".into(),
    })
}

/// `CKSM alg offset length path`: the path is the rest of the line, spaces and all.
fn parse_cksm(arg: &str) -> Result<Command, ParseError> {
    let mut parts = arg.splitn(4, ' ');
    let (Some(alg), Some(offset), Some(length), Some(path)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::MissingArgument("CKSM"));
    };
    if alg.is_empty() || path.is_empty() {
        return Err(ParseError::MissingArgument("CKSM"));
    }
    Ok(Command::Cksm {
        alg: alg.to_ascii_uppercase(),
        offset: number("CKSM", offset)?,
        length: if length == "-1" {
            None
        } else {
            Some(number("CKSM", length)?)
        },
        path: path.to_string(),
    })
}

fn parse_type(word: &str) -> Result<TransferType, ParseError> {
    let up = word.to_ascii_uppercase();
    let mut parts = up.split_whitespace();
    let code = parts.next().ok_or(ParseError::MissingArgument("TYPE"))?;
    let param = parts.next();
    match (code, param) {
        // Format control N (non-print) is the only one braid does; T and C are refused.
        ("A", None | Some("N")) => Ok(TransferType::Ascii),
        ("I", None) => Ok(TransferType::Image),
        ("L", Some("8")) => Ok(TransferType::Image),
        ("A" | "E" | "L", _) => Err(ParseError::Unsupported {
            verb: "TYPE",
            arg: word.to_string(),
        }),
        _ => Err(bad("TYPE", "expected A, I or L 8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_examples() {
        assert_eq!(
            Command::parse(b"retr my file.txt"),
            Ok(Command::Retr("my file.txt".into()))
        );
        assert_eq!(
            Command::parse(b"TYPE L 8"),
            Ok(Command::Type(TransferType::Image))
        );
        assert_eq!(
            Command::parse(b"TYPE E").unwrap_err().reply_code(),
            504,
            "EBCDIC is refused as not implemented"
        );
        assert_eq!(Command::parse(b"RETR").unwrap_err().reply_code(), 501);
        assert_eq!(
            Command::parse(b"EPRT |7|x|1|").unwrap_err().reply_code(),
            522
        );
        assert_eq!(
            Command::parse(b"PORT 1,2,3,4,5,999")
                .unwrap_err()
                .reply_code(),
            501
        );
        assert_eq!(Command::parse(b"REST -5").unwrap_err().reply_code(), 501);
        assert_eq!(
            Command::parse(b"\xc0\xae\xc0\xae").unwrap_err(),
            ParseError::NotUtf8
        );
        assert_eq!(Command::parse(b"   ").unwrap_err(), ParseError::Empty);
        assert_eq!(Command::parse(b"PASS"), Ok(Command::Pass(String::new())));
        assert_eq!(
            Command::parse(b"XYZZY plugh"),
            Ok(Command::Unknown {
                verb: "XYZZY".into(),
                arg: Some("plugh".into())
            })
        );
        assert_eq!(Command::Retr("x".into()).verb(), "RETR");
    }

    fn path_arg() -> impl Strategy<Value = String> {
        // Anything but CR and LF, not empty.
        "[^\r\n]{1,40}"
    }

    fn opt_path() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(path_arg())
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            path_arg().prop_map(Command::User),
            "[^\r\n]{0,20}".prop_map(Command::Pass),
            path_arg().prop_map(Command::Acct),
            Just(Command::Quit),
            Just(Command::Rein),
            Just(Command::Syst),
            Just(Command::Noop),
            Just(Command::Feat),
            opt_path().prop_map(Command::Help),
            opt_path().prop_map(Command::Stat),
            path_arg().prop_map(Command::Opts),
            path_arg().prop_map(Command::Site),
            prop_oneof![Just(TransferType::Ascii), Just(TransferType::Image)]
                .prop_map(Command::Type),
            prop_oneof![
                Just(Mode::Stream),
                Just(Mode::Block),
                Just(Mode::Compressed),
                Just(Mode::Extended),
                Just(Mode::Deflate)
            ]
            .prop_map(Command::Mode),
            prop_oneof![
                Just(Structure::File),
                Just(Structure::Record),
                Just(Structure::Page)
            ]
            .prop_map(Command::Stru),
            Just(Command::Pwd),
            path_arg().prop_map(Command::Cwd),
            Just(Command::Cdup),
            Just(Command::Pasv),
            prop_oneof![
                Just(EpsvArg::Default),
                Just(EpsvArg::All),
                Just(EpsvArg::Family(1)),
                Just(EpsvArg::Family(2))
            ]
            .prop_map(Command::Epsv),
            any::<SocketAddrV4>().prop_map(Command::Port),
            (any::<std::net::IpAddr>(), any::<u16>())
                .prop_map(|(ip, p)| Command::Eprt(SocketAddr::new(ip, p))),
            any::<u64>().prop_map(Command::Rest),
            proptest::collection::vec((0u64..1 << 40, 1u64..1 << 30), 1..5).prop_map(|v| {
                Command::RestRanges(v.into_iter().map(|(s, l)| (s, s + l)).collect())
            }),
            (
                "[A-Z0-9]{1,8}",
                any::<u64>(),
                proptest::option::of(any::<u64>()),
                path_arg()
            )
                .prop_map(|(alg, offset, length, path)| Command::Cksm {
                    alg,
                    offset,
                    length,
                    path
                }),
            ("[A-Z0-9]{1,8}", proptest::option::of("[0-9a-f]{1,64}"))
                .prop_map(|(alg, value)| Command::Scks { alg, value }),
            any::<u64>().prop_map(Command::Sbuf),
            any::<u32>().prop_map(Command::Mult),
            proptest::collection::vec(any::<u16>(), 1..9).prop_map(Command::Mprt),
            Just(Command::Spas),
            proptest::collection::vec(any::<SocketAddrV4>(), 1..4).prop_map(Command::Spor),
            path_arg().prop_map(Command::Allo),
            "[A-Z][A-Z0-9-]{0,7}".prop_map(Command::Auth),
            any::<u64>().prop_map(Command::Pbsz),
            prop_oneof![Just('C'), Just('S'), Just('E'), Just('P')].prop_map(Command::Prot),
            "[A-Za-z0-9+/]{1,40}=?".prop_map(Command::Adat),
            prop_oneof![
                Just("N".to_string()),
                Just("A".to_string()),
                Just("S /O=x/CN=y".to_string())
            ]
            .prop_map(Command::Dcau),
            path_arg().prop_map(Command::Retr),
            proptest::collection::vec(
                (any::<u64>(), "[^\r\n\0]{1,12}", any::<Option<i64>>()),
                1..4
            )
            .prop_map(|v| {
                Command::Bundle(
                    v.into_iter()
                        .map(|(size, path, mtime)| crate::bundle::Named { size, path, mtime })
                        .collect(),
                )
            }),
            Just(Command::RetrBundle),
            Just(Command::StorBundle),
            path_arg().prop_map(Command::Stor),
            path_arg().prop_map(Command::Appe),
            opt_path().prop_map(Command::List),
            opt_path().prop_map(Command::Nlst),
            opt_path().prop_map(Command::Mlsd),
            opt_path().prop_map(Command::Mlsr),
            opt_path().prop_map(Command::Mlst),
            path_arg().prop_map(Command::Size),
            path_arg().prop_map(Command::Mdtm),
            (0i64..253_402_300_799, path_arg()).prop_map(|(t, p)| Command::Mfmt(t, p)),
            path_arg().prop_map(Command::Dele),
            path_arg().prop_map(Command::Mkd),
            path_arg().prop_map(Command::Rmd),
            path_arg().prop_map(Command::Rnfr),
            path_arg().prop_map(Command::Rnto),
            Just(Command::Abor),
            ("[A-Z]{3,6}", opt_path())
                .prop_filter("known verb", |(v, _)| !KNOWN_VERBS.contains(&v.as_str()))
                .prop_map(|(verb, arg)| Command::Unknown { verb, arg }),
        ]
    }

    proptest! {
        #[test]
        fn every_command_round_trips(cmd in command()) {
            let mut wire = Vec::new();
            cmd.encode(&mut wire);
            prop_assert!(wire.ends_with(b"\r\n"));
            let parsed = Command::parse(&wire[..wire.len() - 2]).unwrap();
            prop_assert_eq!(parsed, cmd);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Command::parse(&bytes);
        }

        /// The fuzz target's property on random printable lines: parse, encode, parse again.
        #[test]
        fn parsed_lines_reencode_to_the_same_command(
            verb in proptest::sample::select(KNOWN_VERBS.to_vec()),
            arg in "[ -~]{0,40}",
        ) {
            crate::fuzzing::command_parser(format!("{verb} {arg}\r\n").as_bytes());
        }
    }
}
