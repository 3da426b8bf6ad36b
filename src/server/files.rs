//! File-system requests and the local side of a transfer (files opened, listings written),
//! run on blocking threads inside the user's root.

use super::ChecksumCache;
use super::data::Job;
use super::quota::Quota;
use crate::fsroot::{Root, Upload, UploadStart};
use braid_proto::checksum;
use braid_proto::listing::{self, EntryKind};
use braid_proto::session::{
    ChecksumAlg, FsError, FsOp, FsOutcome, ListStyle, Transfer, TransferKind,
};
use std::time::SystemTime;

pub(super) fn fs_blocking(
    root: &Root,
    sums: &ChecksumCache,
    op: FsOp,
) -> Result<FsOutcome, FsError> {
    Ok(match op {
        FsOp::ChangeDir(p) => {
            root.is_dir(&p)?;
            FsOutcome::Done
        }
        FsOp::Size { path, ascii: false } => FsOutcome::Size(root.size(&path)?),
        FsOp::Size { path, ascii: true } => FsOutcome::Size(ascii_size(root, &path)?),
        FsOp::Mdtm(p) => {
            let e = root.stat(&p)?;
            if e.kind != EntryKind::File {
                return Err(FsError::NotAFile);
            }
            FsOutcome::Mtime(e.mtime)
        }
        FsOp::SetMtime(p, t) => {
            root.set_mtime(&p, t)?;
            FsOutcome::Done
        }
        FsOp::Mkd(p) => {
            root.mkdir(&p)?;
            FsOutcome::Done
        }
        FsOp::Rmd(p) => {
            root.rmdir(&p)?;
            FsOutcome::Done
        }
        FsOp::Dele(p) => {
            root.delete(&p)?;
            FsOutcome::Done
        }
        FsOp::RenameFrom(p) => {
            root.exists_nofollow(&p)?;
            FsOutcome::Done
        }
        FsOp::Rename { from, to } => {
            root.rename(&from, &to)?;
            FsOutcome::Done
        }
        FsOp::Mlst(p) => FsOutcome::Entry(root.stat(&p)?),
        FsOp::Checksum {
            path,
            alg,
            offset,
            length,
        } => {
            let (file, entry) = root.open_read(&path)?;
            let end = match length {
                None => entry.size,
                Some(l) => offset.saturating_add(l),
            };
            if offset > entry.size || end > entry.size {
                return Err(FsError::Other(format!(
                    "range {offset}+{} is past the end of the {}-byte file",
                    end - offset.min(end),
                    entry.size
                )));
            }
            let io = |e: std::io::Error| crate::fsroot::io_to_fs(&e);
            FsOutcome::Checksum(match alg {
                ChecksumAlg::Xxh3 => checksum::hex(sums.xxh3(&file, entry.size).map_err(io)?),
                alg => crate::sums::cksm(alg, &file, offset, end).map_err(io)?,
            })
        }
        FsOp::StatList(p) => {
            let now = unix_now();
            let lines = match root.stat(&p)? {
                e if e.kind == EntryKind::Dir => root
                    .list(&p)?
                    .iter()
                    .map(|e| listing::list_line(e, now))
                    .collect(),
                e => vec![listing::list_line(&e, now)],
            };
            FsOutcome::Lines(lines)
        }
    })
}

/// SIZE in TYPE A counts the CRs that conversion adds, which means reading the file; refuse
/// for large files rather than stall the session.
fn ascii_size(root: &Root, p: &braid_proto::VPath) -> Result<u64, FsError> {
    const LIMIT: u64 = 64 << 20;
    let (mut file, entry) = root.open_read(p)?;
    if entry.size > LIMIT {
        return Err(FsError::Other(format!(
            "SIZE in ASCII mode is only offered for files up to {} MiB; use TYPE I",
            LIMIT >> 20
        )));
    }
    let mut buf = vec![0u8; 1 << 16];
    let mut last_cr = false;
    let mut total = 0;
    loop {
        let n =
            std::io::Read::read(&mut file, &mut buf).map_err(|e| crate::fsroot::io_to_fs(&e))?;
        if n == 0 {
            return Ok(total);
        }
        total += braid_proto::ascii::wire_len(&buf[..n], &mut last_cr);
    }
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Opens the local side of a transfer, before anything is promised to the client. An MLSR
/// lists at most `tree_entries` entries.
pub(super) fn prepare(
    root: &std::sync::Arc<Root>,
    t: &Transfer,
    quota: Option<&Quota>,
    tree_entries: usize,
) -> Result<(Job, Option<u64>), FsError> {
    Ok(match &t.kind {
        TransferKind::Retr(p) => {
            let (file, entry) = root.open_read(p)?;
            if t.offset > entry.size {
                return Err(FsError::BadRestart {
                    offset: t.offset,
                    size: entry.size,
                });
            }
            (
                Job::Retr {
                    file,
                    offset: t.offset,
                    ascii: t.ascii,
                    whole: None,
                    stripe: t.stripe.clone(),
                },
                Some(entry.size - t.offset),
            )
        }
        // Each file is looked at now, so that one gone or changed since the client listed it
        // refuses the bundle before a byte moves (a few microseconds a file), rather than
        // breaking its data connections part-way.
        TransferKind::Bundle(files) => {
            let sizes = files.iter().map(|(_, size)| size);
            for ((p, entry), size) in root.stat_files(files.iter().map(|(p, _)| p)).zip(sizes) {
                let entry = entry.map_err(|e| FsError::Other(format!("{p}: {e}")))?;
                if entry.kind != EntryKind::File || entry.size != *size {
                    return Err(FsError::Other(format!(
                        "{p} is not the {size}-byte file it was listed as (it changed since)"
                    )));
                }
            }
            (
                Job::Bundle {
                    root: root.clone(),
                    files: files.clone(),
                },
                Some(files.iter().map(|(_, n)| n).sum()),
            )
        }
        // Every file's partial is made now: one that cannot be (no such directory, no
        // permission, another upload of it under way) refuses the bundle before a byte
        // moves, and the client stores its files one by one, each with its own answer.
        TransferKind::StoreBundle(files) => {
            if quota.is_some() {
                return Err(FsError::Other(
                    "this account's quota counts files stored one by one: send STOR for each"
                        .into(),
                ));
            }
            let partials = crate::fsroot::Partials::open(root, files)?;
            let layout = braid_proto::bundle::Layout::new(files.iter().map(|(_, n, _)| *n));
            (Job::StoreBundle { partials, layout }, None)
        }
        // A data node's stripe goes into the partial its front end opened.
        TransferKind::Stor(p) if t.stripe.is_some() => {
            let (upload, file) = Upload::join(root, p)?;
            (
                Job::Stor {
                    upload,
                    file,
                    offset: 0,
                    ascii: false,
                    check: false,
                    charge: None,
                    stripe: true,
                },
                None,
            )
        }
        TransferKind::Stor(p) | TransferKind::Appe(p) => {
            let have = t.block.as_ref().map(|b| &b.have).filter(|h| !h.is_empty());
            let start = match (&t.kind, have) {
                (TransferKind::Appe(_), _) => UploadStart::Append,
                (_, Some(_)) => UploadStart::Keep,
                _ => UploadStart::At(t.offset),
            };
            if let Some(q) = quota {
                q.admit(root.stat(p).is_err())?;
                // ALLO gave the size: what is not there yet must fit before a byte moves.
                if let Some(size) = t.allocate {
                    let there = have
                        .and_then(|h| h.iter().last())
                        .map_or(t.offset, |(_, end)| end.max(t.offset));
                    q.fits(size.saturating_sub(there))?;
                }
            }
            let (upload, file, offset) = Upload::begin(root, p, start).map_err(|e| match e {
                FsError::NotFound if have.is_some() => FsError::NothingToResume,
                e => e,
            })?;
            // REST ranges claim data the partial must hold.
            if let Some(end) = have.and_then(|h| h.iter().last()).map(|(_, end)| end) {
                let size = file
                    .metadata()
                    .map_err(|e| crate::fsroot::io_to_fs(&e))?
                    .len();
                if size < end {
                    return Err(FsError::BadRestart { offset: end, size });
                }
            }
            // What the partial holds is on the disk, and counted already.
            let charge = match quota {
                Some(q) => Some(
                    q.charge(
                        file.metadata()
                            .map_err(|e| crate::fsroot::io_to_fs(&e))?
                            .len(),
                    ),
                ),
                None => None,
            };
            (
                Job::Stor {
                    upload,
                    file,
                    offset,
                    ascii: t.ascii,
                    check: t.expect.is_some(),
                    charge,
                    stripe: false,
                },
                None,
            )
        }
        TransferKind::List(p, style) => {
            let now = unix_now();
            let dir = root.stat(p)?;
            let mut text = String::new();
            let entries = match (dir.kind, style) {
                (EntryKind::Dir, ListStyle::MachineTree) => {
                    root.list_tree(p, listing::TREE_DEPTH, tree_entries)?
                }
                (EntryKind::Dir, _) => root.list(p)?,
                _ => vec![dir.clone()],
            };
            if matches!(style, ListStyle::Machine | ListStyle::MachineTree) {
                if dir.kind != EntryKind::Dir {
                    return Err(FsError::NotADirectory);
                }
                let mut cdir = dir.clone();
                cdir.name = ".".into();
                listing::write_facts(&mut text, &cdir, Some("cdir"), t.writable, Some(&t.facts));
                text.push_str(" .\r\n");
            }
            text.reserve(entries.len() * 64);
            for e in &entries {
                match style {
                    ListStyle::Long => text.push_str(&listing::list_line(e, now)),
                    ListStyle::Names => text.push_str(&e.name),
                    ListStyle::Machine | ListStyle::MachineTree => {
                        listing::write_facts(&mut text, e, None, t.writable, Some(&t.facts));
                        text.push(' ');
                        text.push_str(&e.name);
                    }
                }
                text.push_str("\r\n");
            }
            (
                Job::List {
                    text: text.into_bytes(),
                },
                None,
            )
        }
    })
}
