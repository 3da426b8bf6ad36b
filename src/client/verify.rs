//! Whole-file checks: the checksum a transfer ends with, compared with the server's, and what
//! a GridFTP server reported holding of an upload checked before it is trusted.

use super::control::Control;
use super::error::{ClientError, Result};
use super::job::local_err;
use super::peer::Peer;
use super::url::Target;
use crate::engine::receive::Progress;
use braid_proto::Command;
use braid_proto::checksum;
use braid_proto::ranges::RangeSet;
use std::fs::File;

/// Compares the whole-file checksum with the server's. braid peers: XXH3 from the blocks as
/// they arrived. GridFTP peers: ADLER32 or MD5 (see [`Peer::checksum`]), which needs one read
/// of the file. Returns what was checked; a mismatch is an error that says so.
pub fn verify(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    total: u64,
    got: &Progress,
    file: Option<&File>,
) -> Result<Option<String>> {
    let (alg, local) = match (peer, got.sum, file) {
        (Peer::Braid, Some(sum), _) => (checksum::NAME, checksum::hex(sum.finish(total))),
        (Peer::Braid, None, Some(f)) => (
            checksum::NAME,
            checksum::hex(
                crate::sums::xxh3(f, total)
                    .map_err(local_err("cannot read the download back to check it"))?,
            ),
        ),
        (Peer::GridFtp, _, Some(f)) => {
            let alg = peer.checksum(c);
            let sum = crate::sums::named(alg, f, 0, total)
                .map_err(local_err("cannot read the download back to check it"))?;
            (alg, sum)
        }
        // Standard output from a GridFTP server: nothing to read back.
        _ => return Ok(None),
    };
    let ours = "the data received hashes to";
    let advice = "; the data is kept, rerun without --resume to fetch it again";
    compare_with_server(c, alg, &target.path, &local, ours, advice)
}

/// Compares `local` with the server's CKSM of the whole file: `ALG hex` when they agree,
/// None when the server offers no such checksum, an integrity error (saying what `ours` is)
/// when they differ.
pub fn compare_with_server(
    c: &mut Control,
    alg: &str,
    path: &str,
    local: &str,
    ours: &str,
    advice: &str,
) -> Result<Option<String>> {
    let remote = c.checksum(alg, path)?;
    agree_with(remote, alg, path, local, ours, advice)
}

/// [`compare_with_server`] with the server's answer to CKSM in hand.
pub fn agree_with(
    remote: Option<String>,
    alg: &str,
    path: &str,
    local: &str,
    ours: &str,
    advice: &str,
) -> Result<Option<String>> {
    let Some(remote) = remote else {
        tracing::info!("the server offers no {alg} checksum; size check only");
        return Ok(None);
    };
    if remote != local {
        return Err(ClientError::Integrity(format!(
            "checksum mismatch: the server's {alg} of {path} is {remote}, {ours} {local}{advice}"
        )));
    }
    Ok(Some(format!("{alg} {local}")))
}

/// Of the ranges a GridFTP server reported holding (111 markers), those whose MD5 on the
/// server matches this file's. globus-gridftp-server 13 writes the block it held when an
/// upload broke at offset 0 (strace: `lseek(fd, 0)`, then the block), inside a range it had
/// reported: trusted blindly, that range would never be sent again and the whole-file check
/// would fail after every resume. A range that differs is halved down to [`CHECKED_PIECE`],
/// so only the damaged part goes again.
pub fn held_for_sure(
    c: &mut Control,
    file: &File,
    have: &RangeSet,
    path: &str,
) -> Result<RangeSet> {
    let mut sure = RangeSet::new();
    let mut todo: Vec<(u64, u64)> = have.iter().collect();
    while let Some((start, end)) = todo.pop() {
        let ours = crate::sums::md5(file, start, end).map_err(local_err("cannot read the file"))?;
        let theirs = c.cmd(&Command::Cksm {
            alg: "MD5".into(),
            offset: start,
            length: Some(end - start),
            path: path.into(),
        })?;
        if theirs.code == 213 && theirs.text().trim().eq_ignore_ascii_case(&ours) {
            sure.insert(start, end);
        } else if theirs.code != 213 {
            // No range checksums here: nothing can be vouched for.
            eprintln!(
                "braid: the server cannot check what it holds of {path} ({theirs}); sending the whole file"
            );
            return Ok(RangeSet::new());
        } else if end - start > CHECKED_PIECE {
            let mid = start + (end - start) / 2;
            todo.extend([(start, mid), (mid, end)]);
        } else {
            tracing::info!(
                "the server's copy of {start}-{end} of {path} differs: sending it again"
            );
        }
    }
    if sure.len() < have.len() {
        eprintln!(
            "braid: {} of the {} bytes the server reported holding of {path} differ from this file; sending them again",
            have.len() - sure.len(),
            have.len()
        );
    }
    Ok(sure)
}

/// The smallest part of a held range checked on its own before it is given up.
const CHECKED_PIECE: u64 = 4 << 20;

/// `SCKS XXH3 <hex>` for the whole local file: a braid server checks an upload it did not see
/// whole (a resumed one) against it before the file takes its name.
pub fn whole_file_checksum(file: &std::fs::File, len: u64) -> Result<Command> {
    let sum = crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
    Ok(Command::Scks {
        alg: checksum::NAME.into(),
        value: Some(checksum::hex(sum)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_that_agree_are_named_and_those_that_differ_say_both_sides() {
        let same = agree_with(Some("abc".into()), "XXH3", "f", "abc", "ours is", "");
        assert_eq!(same.ok().flatten().as_deref(), Some("XXH3 abc"));
        let e = agree_with(Some("abd".into()), "MD5", "f", "abc", "ours is", "; retry")
            .expect_err("a mismatch");
        assert!(matches!(e, ClientError::Integrity(_)));
        let text = e.to_string();
        assert!(text.contains("abd") && text.contains("ours is abc") && text.ends_with("; retry"));
        // A server without that checksum: nothing checked, nothing claimed.
        let none = agree_with(None, "ADLER32", "f", "abc", "ours is", "");
        assert_eq!(none.ok().flatten(), None);
    }

    #[test]
    fn the_whole_file_checksum_announced_for_an_upload_is_that_of_its_bytes() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let file = File::open(&path).expect("open");
        let Ok(Command::Scks { alg, value }) = whole_file_checksum(&file, data.len() as u64) else {
            panic!("not SCKS")
        };
        assert_eq!(alg, checksum::NAME);
        assert_eq!(value, Some(checksum::hex(checksum::of(&data))));
    }

    #[test]
    fn the_servers_checksum_is_asked_with_cksm_and_compared() {
        use super::super::testing::{done, scripted};
        let (mut c, server) = scripted(b"213 ABC123\r\n213 abc124\r\n");
        let ok = compare_with_server(&mut c, "MD5", "f", "abc123", "ours", "").unwrap();
        assert_eq!(ok.as_deref(), Some("MD5 abc123"));
        let e = compare_with_server(&mut c, "MD5", "f", "abc123", "ours", "").unwrap_err();
        assert!(matches!(e, ClientError::Integrity(_)));
        assert_eq!(done(c, server), "CKSM MD5 0 -1 f\r\nCKSM MD5 0 -1 f\r\n");
    }
}
