//! What an interrupted MODE E transfer has already stored, kept on disk so that `--resume`
//! moves only the rest, even after the client was killed. Blocks land at their offsets, so a
//! partial file may have holes: its length alone says nothing.
//!
//! - Downloads: `DEST.part.braid` beside the partial file (like aria2's control file), with
//!   the ranges stored. No checksum state: a partial sat on disk between runs, where nothing
//!   watched it, so a resumed download is checked by reading the file back.
//! - Uploads: the server's partial is out of reach, so the client keeps what the server's
//!   `111 Range Marker` replies reported, in the user's state directory
//!   (`$XDG_STATE_HOME/braid/uploads`, else `~/.local/state/braid/uploads`): the source may sit
//!   in a directory the user cannot write.

use crate::engine::receive::Progress;
use braid_proto::ranges::RangeSet;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// `DEST.part.braid`: what a download has stored.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Stored {
    /// The remote path and size identify the file (not host and port: a restarted server may
    /// listen elsewhere).
    path: String,
    size: u64,
    /// Byte ranges stored, `a-b,c-d` with exclusive ends.
    ranges: String,
}

pub fn sidecar_path(part: &Path) -> PathBuf {
    let mut s = part.as_os_str().to_owned();
    s.push(".braid");
    PathBuf::from(s)
}

/// The record of what a partial download holds, for one remote file.
#[derive(Debug, Clone)]
pub struct Sidecar {
    path: PathBuf,
    remote: String,
    /// The remote file's size (None: unknown, and then nothing is recorded).
    size: Option<u64>,
}

impl Sidecar {
    /// The record beside the partial `part` of the remote file `remote`.
    pub fn beside(part: &Path, remote: &str, size: Option<u64>) -> Sidecar {
        Sidecar {
            path: sidecar_path(part),
            remote: remote.to_string(),
            size,
        }
    }

    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    pub fn location(&self) -> String {
        self.path.display().to_string()
    }

    /// What an earlier run stored, if the record describes this same remote file.
    pub fn load(&self) -> Option<Progress> {
        load_sidecar(&self.path, &self.remote, self.size)
    }

    /// Records what the partial holds now (nothing for a file of unknown size).
    pub fn save(&self, p: &Progress) {
        if let Some(size) = self.size {
            save_sidecar(&self.path, &self.remote, size, p);
        }
    }

    /// Records what the partial holds as the download stops unfinished, and gives back the
    /// space kept for the record's next version (no empty `.braid-tmp` stays behind).
    pub fn save_last(&self, p: &Progress) {
        self.save(p);
        let _ = std::fs::remove_file(self.path.with_extension("braid-tmp"));
    }

    pub fn remove(&self) {
        remove_sidecar(&self.path);
    }
}

/// Writes `bytes` to `path` (its directory made if missing) through a temporary file of this
/// process and a rename, so that a crash mid-write leaves the previous version and a reader,
/// or another braid writing at once, never sees half of it.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("braid-tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Space kept allocated for the sidecar's next version.
const SIDECAR_ROOM: u64 = 16 << 10;

/// Like `write_atomically`, but the temporary file already holds allocated space (taken right
/// after the previous rename): when the download itself fills the disk, the save that records
/// what arrived must still fit.
fn write_into_reserved(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let tmp = path.with_extension("braid-tmp");
    // No truncation: that would give the reserved space back.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)?;
    f.write_all_at(bytes, 0)?;
    f.set_len(bytes.len() as u64)?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Ok(f) = std::fs::File::create_new(&tmp) {
        // Best effort: without it the next save just needs free space as any write does.
        let keep = rustix::fs::FallocateFlags::KEEP_SIZE;
        let _ = rustix::fs::fallocate(&f, keep, 0, SIDECAR_ROOM);
    }
    Ok(())
}

/// Removes a sidecar and the space reserved for its next version.
fn remove_sidecar(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("braid-tmp"));
}

fn save_sidecar(path: &Path, remote: &str, size: u64, p: &Progress) {
    let sc = Stored {
        path: remote.to_string(),
        size,
        ranges: p.ranges.to_string(),
    };
    let saved = serde_json::to_vec(&sc)
        .map_err(std::io::Error::other)
        .and_then(|bytes| write_into_reserved(path, &bytes));
    if let Err(e) = saved {
        tracing::warn!(path = %path.display(), "could not save the resume sidecar: {e}");
    }
}

/// What an earlier run stored, if its sidecar describes this same remote file.
fn load_sidecar(path: &Path, remote: &str, size: Option<u64>) -> Option<Progress> {
    let sc: Stored = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    if sc.path != remote || Some(sc.size) != size {
        return None;
    }
    Some(Progress::holding(parse_ranges(&sc.ranges)?))
}

fn parse_ranges(s: &str) -> Option<RangeSet> {
    if s.is_empty() {
        Some(RangeSet::new())
    } else {
        RangeSet::parse(s).ok()
    }
}

/// The upload record's contents: which local file went where, and what the server holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Upload {
    local: String,
    /// Size and modification time of the source: if either changed, the server's partial
    /// holds stale data and the upload starts over.
    size: u64,
    modified_ns: u64,
    host: String,
    remote: String,
    ranges: String,
}

/// The record of one upload (local file, server, remote path).
pub struct UploadRecord {
    /// None when there is no state directory (no HOME): uploads then cannot resume in MODE E.
    path: Option<PathBuf>,
    upload: Upload,
}

impl UploadRecord {
    pub fn new(local: &Path, meta: &std::fs::Metadata, host: &str, remote: &str) -> UploadRecord {
        let local = std::fs::canonicalize(local).unwrap_or_else(|_| local.to_path_buf());
        let upload = Upload {
            local: local.display().to_string(),
            size: meta.len(),
            modified_ns: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            host: host.to_string(),
            remote: remote.to_string(),
            ranges: String::new(),
        };
        UploadRecord::of(upload)
    }

    /// The record of a copy between servers: `source` (a URL) on one server to `remote` on
    /// `host`, the source `size` bytes and last modified at `modified` (seconds, if its
    /// server says): what the receiving server holds of it.
    pub fn copy(
        source: &str,
        size: u64,
        modified: Option<i64>,
        host: &str,
        remote: &str,
    ) -> UploadRecord {
        UploadRecord::of(Upload {
            local: source.to_string(),
            size,
            modified_ns: modified.map_or(0, |s| {
                u64::try_from(s).unwrap_or(0).saturating_mul(1_000_000_000)
            }),
            host: host.to_string(),
            remote: remote.to_string(),
            ranges: String::new(),
        })
    }

    fn of(upload: Upload) -> UploadRecord {
        let key = format!("{}\0{}\0{}", upload.local, upload.host, upload.remote);
        let name = braid_proto::checksum::hex(braid_proto::checksum::of(key.as_bytes()));
        let dir = state_dir().map(|d| d.join("uploads"));
        // Once per upload, not per save (a save follows every range marker).
        if let Some(d) = &dir {
            forget_old_records(d);
        }
        let path = dir.map(|d| d.join(format!("{}.json", &name[..16])));
        UploadRecord { path, upload }
    }

    /// Where the record lives, for messages.
    pub fn location(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "nowhere: neither XDG_STATE_HOME nor HOME is set".into(),
        }
    }

    /// The ranges an earlier run of this same upload left on the server, if it left a record.
    pub fn load(&self) -> Option<RangeSet> {
        let found: Upload =
            serde_json::from_slice(&std::fs::read(self.path.as_ref()?).ok()?).ok()?;
        let same = Upload {
            ranges: found.ranges.clone(),
            ..self.upload.clone()
        };
        (found == same)
            .then(|| parse_ranges(&found.ranges))
            .flatten()
    }

    /// Records that the server holds `ranges`. Returns why it could not.
    pub fn save(&self, ranges: &RangeSet) -> std::io::Result<()> {
        let path = self
            .path
            .as_ref()
            .ok_or_else(|| std::io::Error::other("no state directory"))?;
        let upload = Upload {
            ranges: ranges.to_string(),
            ..self.upload.clone()
        };
        let bytes = serde_json::to_vec(&upload).map_err(std::io::Error::other)?;
        write_atomically(path, &bytes)
    }

    pub fn remove(&self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// How long the record of an upload that was never finished is kept: a server does not keep
/// a partial for ever either, and records must not pile up.
const RECORD_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Removes records in `dir` not written for [`RECORD_LIFETIME`].
fn forget_old_records(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > RECORD_LIFETIME);
        let ours = e.file_name().to_str().is_some_and(|n| n.ends_with(".json"));
        if old && ours {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `$XDG_STATE_HOME/braid`, else `~/.local/state/braid` if HOME exists (braid makes its
/// state directory, never a home directory).
pub(super) fn state_dir() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| {
        let p = PathBuf::from(v);
        p.is_absolute().then_some(p)
    };
    std::env::var_os("XDG_STATE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .filter(|h| h.is_dir())
                .map(|h| h.join(".local").join("state"))
        })
        .map(|d| d.join("braid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_record_matches_only_the_same_unchanged_source_and_target() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.bin");
        std::fs::write(&src, b"0123456789").unwrap();
        let meta = std::fs::metadata(&src).unwrap();
        let mut rec = UploadRecord::new(&src, &meta, "h", "/a");
        rec.path = Some(dir.path().join("state").join("rec.json"));
        assert_eq!(rec.load(), None);
        let ranges = RangeSet::parse("0-4,6-8").unwrap();
        rec.save(&ranges).unwrap();
        assert_eq!(rec.load(), Some(ranges.clone()));
        // Another target, or a source that changed since, does not match.
        let mut other = UploadRecord::new(&src, &meta, "h", "/b");
        other.path = rec.path.clone();
        assert_eq!(other.load(), None);
        std::fs::write(&src, b"01234567890").unwrap();
        let changed = std::fs::metadata(&src).unwrap();
        let mut stale = UploadRecord::new(&src, &changed, "h", "/a");
        stale.path = rec.path.clone();
        assert_eq!(stale.load(), None);
        rec.remove();
        assert_eq!(rec.load(), None);
    }

    #[test]
    fn a_copy_record_matches_only_a_source_unchanged_in_size_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let at = |size, modified| {
            let mut r = UploadRecord::copy("ftp://a:21/f", size, modified, "b:21", "g");
            r.path = Some(dir.path().join("rec.json"));
            r
        };
        let rec = at(100, Some(1_700_000_000));
        let ranges = RangeSet::parse("0-50").unwrap();
        rec.save(&ranges).unwrap();
        assert_eq!(rec.load(), Some(ranges));
        assert_eq!(at(101, Some(1_700_000_000)).load(), None);
        assert_eq!(at(100, Some(1_700_000_001)).load(), None);
        assert_eq!(at(100, None).load(), None);
    }

    #[test]
    fn records_not_written_for_a_month_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("0123456789abcdef.json");
        let fresh = dir.path().join("fedcba9876543210.json");
        let other = dir.path().join("notes.txt");
        for p in [&stale, &fresh, &other] {
            std::fs::write(p, "{}").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - RECORD_LIFETIME * 2;
        for p in [&stale, &other] {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(long_ago).unwrap();
        }
        forget_old_records(dir.path());
        assert!(!stale.exists());
        assert!(fresh.exists() && other.exists());
    }

    #[test]
    fn a_download_record_describes_one_remote_file_and_leaves_nothing_once_removed() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("f.part");
        let rec = Sidecar::beside(&part, "pub/f", Some(100));
        assert!(rec.load().is_none() && !rec.exists());
        let held = Progress::holding(RangeSet::parse("0-10,50-60").unwrap());
        rec.save(&held);
        assert!(rec.exists());
        assert_eq!(
            rec.load().map(|p| p.ranges.to_string()),
            Some("0-10,50-60".into())
        );
        // Another file, or the same path grown since: not this partial's record.
        assert!(Sidecar::beside(&part, "pub/g", Some(100)).load().is_none());
        assert!(Sidecar::beside(&part, "pub/f", Some(101)).load().is_none());
        // Space is kept for the next version while the download runs, given back when it
        // stops, and the record goes with the completed download.
        let reserve = sidecar_path(&part).with_extension("braid-tmp");
        assert!(reserve.exists());
        rec.save_last(&held);
        assert!(!reserve.exists() && rec.exists());
        rec.remove();
        assert!(!rec.exists() && !reserve.exists());
        // A file of unknown size is not recorded.
        let unknown = Sidecar::beside(&part, "pub/f", None);
        unknown.save(&held);
        assert!(!unknown.exists());
    }

    #[test]
    fn without_a_state_directory_an_upload_has_no_record_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.bin");
        std::fs::write(&src, b"x").unwrap();
        let meta = std::fs::metadata(&src).unwrap();
        let mut rec = UploadRecord::new(&src, &meta, "h", "/a");
        rec.path = None;
        assert!(rec.location().starts_with("nowhere"));
        assert!(rec.save(&RangeSet::parse("0-1").unwrap()).is_err());
        assert_eq!(rec.load(), None);
        rec.remove();
    }
}
