//! Remote listings: `braid ls`, and the walks of `get -r` (MLSD, MLSR, or LIST on servers
//! without them).

use super::Options;
use super::bundle;
use super::control::Control;
use super::error::{ClientError, Result};
use super::parallel;
use super::peer::STALL;
use super::sessions::session;
use super::url::Target;
use super::wire::Wire;
use crate::engine::receive::{Progress, Shared, receive};
use crate::engine::sink::Sink;
use crate::engine::transfer::Joins;
use braid_proto::Command;
use braid_proto::client::Direction;
use braid_proto::ranges::RangeSet;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// One entry of a remote listing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ListEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub size: Option<u64>,
    /// Modification time, seconds since the Unix epoch (UTC).
    pub modify: Option<i64>,
    /// The raw line, for servers without MLSD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
}

/// Lists a directory: MLSD when the server has it (exact sizes and UTC times), LIST otherwise.
pub fn ls(target: &Target, opts: &Options) -> Result<Vec<ListEntry>> {
    let mut c = session(target, opts, None)?;
    let entries = list_dir(&mut c, &target.path)?;
    c.quit();
    Ok(entries)
}

/// Every entry beneath `path` in one listing (MLSR, which globus-gridftp-server and braid
/// serve offer), each named by its path relative to `path`. `bundles`: the session fetches
/// the tree in bundles next, with these options, and the listing comes in MODE E on the data
/// connections they then take ([`in_blocks`]).
pub fn list_tree(c: &mut Control, path: &str, bundles: Option<&Options>) -> Result<Vec<ListEntry>> {
    // Only the facts braid reads: a tree's listing is then about 40 % shorter (10,000 files:
    // 590 kB, not 980 kB), which on a fresh connection is a round trip less of slow start.
    if c.has_feature("MLST") {
        let facts = Command::Opts("MLST type;size;modify;".into());
        c.later(braid_proto::client::Op::Ask(facts), None)?;
    }
    let mlsr = Command::Mlsr((!path.is_empty()).then(|| path.to_string()));
    if let Some(opts) = bundles {
        return Ok(machine_entries(&in_blocks(c, &mlsr, opts)?));
    }
    let deflated = c.deflate_next()?;
    let data = c.open_data()?;
    let listed = c
        .start_on(data, &mlsr)
        .and_then(|wire| read_all(wire, c, &mlsr, deflated));
    if deflated {
        c.plain_again()?;
    }
    Ok(machine_entries(&listed?))
}

/// One directory's entries (MLSD) in MODE E, as [`list_tree`] gets a tree's for `bundles`:
/// once a session asked for MODE E it stays in it, so when a braid server refuses MLSR (a
/// tree of more entries than it lists at once) each directory's listing comes in blocks too.
pub fn list_dir_in_blocks(
    c: &mut Control,
    path: &str,
    bundles: &Options,
) -> Result<Vec<ListEntry>> {
    let mlsd = Command::Mlsd((!path.is_empty()).then(|| path.to_string()));
    Ok(machine_entries(&in_blocks(c, &mlsd, bundles)?))
}

/// A listing received in MODE E, under the settings of the bundles that follow it: it comes
/// compressed where the server offers that, on several connections, and they stay open for
/// the first bundle, which then costs no connection set-up and finds them past their first
/// round trips. (10,000 files over 20 ms: the first bundle's data 0.15 s sooner.)
fn in_blocks(c: &mut Control, cmd: &Command, opts: &Options) -> Result<String> {
    let (plan, elastic) = bundle::settings(c, opts, Direction::Download, bundle::FIRST_BYTES)?;
    let addr = c.passive_addr()?;
    let transfer = parallel::transfer(c, Direction::Download, elastic);
    let socks = parallel::open_and_start(c, cmd, &addr, plan.start, opts.buffer, elastic)?;
    let joins = Joins::fixed(socks, STALL).protected(c.data_tls());
    let sink = Sink::Memory(Default::default());
    let shared = Shared::new(
        Progress::holding(RangeSet::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let kept = receive(&transfer, joins, &sink, Some(MAX_LISTING), &shared).map_err(|e| {
        ClientError::Interrupted {
            bytes: shared.snapshot().ranges.len(),
            why: format!("the listing's data connection: {e}"),
            partial: None,
        }
    })?;
    c.keep_data_connections(Direction::Download, kept.socks);
    c.finish_transfer(cmd)?;
    let text = sink.into_memory();
    let got = shared.snapshot().ranges;
    if got.len() != text.len() as u64 {
        return Err(ClientError::Protocol(format!(
            "the server's answer to {} left gaps: {} of its {} bytes came",
            cmd.verb(),
            got.len(),
            text.len()
        )));
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// The entries of an MLSD or MLSR listing, the listed directory (and its parent) left out.
fn machine_entries(text: &str) -> Vec<ListEntry> {
    text.lines()
        .filter_map(braid_proto::listing::parse_mlsx)
        .filter(|m| !matches!(m.kind.as_deref(), Some("cdir" | "pdir")))
        .map(|m| ListEntry {
            name: m.name,
            kind: m.kind,
            size: m.size,
            modify: m.modify,
            raw: None,
        })
        .collect()
}

/// Lists `path` (the login directory when empty) on an open session: MLSD, or LIST on
/// servers without it, whose lines are kept as they came (`raw`) beside what their usual forms
/// say. The directory's own `.` and `..` entries are left out.
pub fn list_dir(c: &mut Control, path: &str) -> Result<Vec<ListEntry>> {
    let path = (!path.is_empty()).then(|| path.to_string());
    let mlsd = Command::Mlsd(path.clone());
    let deflated = c.deflate_next()?;
    let data = c.open_data()?;
    let listed = match c.start_on(data, &mlsd) {
        Ok(wire) => read_all(wire, c, &mlsd, deflated).map(|t| (t, true)),
        // No MLSD (RFC 3659).
        Err(ClientError::Remote { reply, .. }) if matches!(reply.code, 500 | 501 | 502 | 504) => {
            let list = Command::List(path);
            let data = c.open_data()?;
            let wire = c.start_on(data, &list)?;
            read_all(wire, c, &list, deflated).map(|t| (t, false))
        }
        Err(e) => Err(e),
    };
    if deflated {
        c.plain_again()?;
    }
    let (text, machine) = listed?;
    if machine {
        return Ok(machine_entries(&text));
    }
    let mut entries = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = braid_proto::listing::parse_list(line);
        if parsed.as_ref().is_some_and(|p| {
            p.kind.as_deref() == Some("dir") && matches!(p.name.as_str(), "." | "..")
        }) {
            continue;
        }
        entries.push(ListEntry {
            name: parsed.as_ref().map_or(line, |p| &p.name).to_string(),
            kind: parsed.as_ref().and_then(|p| p.kind.clone()),
            size: parsed.as_ref().and_then(|p| p.size),
            modify: None,
            raw: Some(line.to_string()),
        });
    }
    Ok(entries)
}

/// The longest listing read (a million entries of 256 bytes): a server whose listing never
/// ends must not fill the client's memory.
const MAX_LISTING: u64 = 256 << 20;

/// Reads a listing's data connection to its end (through zlib in MODE Z, `deflated`), then the
/// transfer's final reply.
pub fn read_all(mut data: Wire, c: &mut Control, cmd: &Command, deflated: bool) -> Result<String> {
    let mut buf = Vec::new();
    super::wire::reading(&mut data, deflated)
        .take(MAX_LISTING + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ClientError::Interrupted {
            bytes: buf.len() as u64,
            why: e.to_string(),
            partial: None,
        })?;
    if buf.len() as u64 > MAX_LISTING {
        return Err(ClientError::Protocol(format!(
            "the server's answer to {} went past {} MiB: a listing that does not end, or a \
             directory too large to list in one go (list its subdirectories instead)",
            cmd.verb(),
            MAX_LISTING >> 20
        )));
    }
    // Under TLS this sends close_notify first: vsftpd, for one, waits for it before its 226.
    data.finish();
    c.finish_transfer(cmd)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_listing_gives_its_entries_without_the_directory_itself() {
        let text = "type=cdir;modify=20260101000000; /pub\r\n\
                    type=pdir; ..\r\n\
                    type=file;size=12;modify=20260102030405; a file.txt\r\n\
                    type=dir;modify=20260101000000; sub\r\n\
                    garbage without facts\r\n";
        let e = machine_entries(text);
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a file.txt", "sub"]);
        assert_eq!(e[0].size, Some(12));
        assert_eq!(e[0].kind.as_deref(), Some("file"));
        assert_eq!(e[0].modify, Some(1_767_323_045));
        assert!(e.iter().all(|e| e.raw.is_none()));
    }
}
