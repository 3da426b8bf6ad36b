//! Per-user quotas (`quota=SIZE`, `quota-files=N` in the users file): what is under an
//! account's root, counted once by a walk and then kept up to date as uploads grow, replace
//! and delete files. An upload is refused at its start when the account is full (or a new file
//! would pass the file count), and stopped as it grows past the quota: every byte up to the
//! furthest one written counts, so a byte far out (a sparse file, as a hostile MODE E block
//! makes) costs what its offset says. Accounts with the same root share their usage. A reload
//! (SIGHUP) counts again.

use braid_proto::path::is_part_name;
use braid_proto::session::FsError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What an account may hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub bytes: Option<u64>,
    pub files: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.bytes.is_some() || self.files.is_some()
    }
}

/// Bytes and files under one root.
#[derive(Debug, Default)]
pub struct Usage {
    bytes: AtomicU64,
    files: AtomicU64,
}

/// The usage of every root counted so far, shared by the sessions of one configuration.
#[derive(Debug, Default)]
pub struct Usages {
    roots: Mutex<HashMap<PathBuf, Arc<Usage>>>,
}

impl Usages {
    /// The usage under `root`, walked the first time it is asked for (blocking).
    pub fn of(&self, root: &Path) -> std::io::Result<Arc<Usage>> {
        if let Some(u) = self.lock().get(root) {
            return Ok(u.clone());
        }
        let (bytes, files) = count(root)?;
        let usage = Arc::new(Usage {
            bytes: AtomicU64::new(bytes),
            files: AtomicU64::new(files),
        });
        Ok(self
            .lock()
            .entry(root.to_path_buf())
            .or_insert(usage)
            .clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Usage>>> {
        self.roots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bytes (apparent sizes: a sparse file counts whole) and files under `dir`, links not
/// followed; partial uploads count their bytes but not as files (they become one when they
/// complete).
fn count(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut bytes, mut files) = (0u64, 0u64);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if d != dir => {
                tracing::warn!("quota: cannot read {}: {e}", d.display());
                continue;
            }
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                bytes += entry.metadata().map_or(0, |m| m.len());
                if !is_part_name(&entry.file_name().to_string_lossy()) {
                    files += 1;
                }
            }
        }
    }
    Ok((bytes, files))
}

/// One session's account: its limits and its root's usage.
#[derive(Debug, Clone)]
pub struct Quota {
    pub limits: Limits,
    pub usage: Arc<Usage>,
}

fn over(what: String) -> FsError {
    FsError::Quota(what)
}

impl Quota {
    /// Whether an upload may start: the account is not full, and a new file (`new`: none of
    /// that name yet) fits the file count.
    pub fn admit(&self, new: bool) -> Result<(), FsError> {
        let bytes = self.usage.bytes.load(Ordering::Acquire);
        let files = self.usage.files.load(Ordering::Acquire);
        if let Some(limit) = self.limits.bytes
            && bytes >= limit
        {
            return Err(over(format!("{bytes} of {limit} bytes used")));
        }
        if let Some(limit) = self.limits.files
            && new
            && files >= limit
        {
            return Err(over(format!("{files} of {limit} files")));
        }
        Ok(())
    }

    /// Whether `more` bytes fit now (ALLO before an upload).
    pub fn fits(&self, more: u64) -> Result<(), FsError> {
        let bytes = self.usage.bytes.load(Ordering::Acquire);
        match self.limits.bytes {
            Some(limit) if bytes.saturating_add(more) > limit => Err(over(format!(
                "{more} more bytes do not fit: {bytes} of {limit} used"
            ))),
            _ => Ok(()),
        }
    }

    /// The upload of a file that holds `have` bytes now: charged as it grows past them.
    pub fn charge(&self, have: u64) -> Charge {
        Charge {
            usage: self.usage.clone(),
            limit: self.limits.bytes,
            high: have,
        }
    }

    /// An upload is about to take a new name: one more file, if the count allows it. Uploads
    /// that started together are admitted together, so this is where the count holds.
    pub fn new_file(&self) -> Result<(), FsError> {
        let limit = self.limits.files.unwrap_or(u64::MAX);
        self.usage
            .files
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|n| over(format!("{n} of {limit} files")))
    }

    /// The new name was not taken after all.
    pub fn no_new_file(&self) {
        sub(&self.usage.files, 1);
    }

    /// An upload replaced a file of `size` bytes: they are gone.
    pub fn replaced(&self, size: u64) {
        sub(&self.usage.bytes, size);
    }

    /// A file of `size` bytes was deleted.
    pub fn deleted(&self, size: u64) {
        sub(&self.usage.bytes, size);
        sub(&self.usage.files, 1);
    }
}

fn sub(n: &AtomicU64, by: u64) {
    let _ = n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(by))
    });
}

/// One upload's share of its account's quota: the furthest byte written so far, and what
/// reaching further costs. One atomic addition when a write passes the furthest byte, none
/// otherwise.
#[derive(Debug)]
pub struct Charge {
    usage: Arc<Usage>,
    limit: Option<u64>,
    high: u64,
}

impl Charge {
    /// A write reaches `end`: counted, or refused with EDQUOT ("disk quota exceeded") when the
    /// account has no room for it.
    pub fn reach(&mut self, end: u64) -> std::io::Result<()> {
        if end <= self.high {
            return Ok(());
        }
        let more = end - self.high;
        let before = self.usage.bytes.fetch_add(more, Ordering::AcqRel);
        if let Some(limit) = self.limit
            && before.saturating_add(more) > limit
        {
            sub(&self.usage.bytes, more);
            return Err(std::io::Error::from_raw_os_error(
                rustix::io::Errno::DQUOT.raw_os_error(),
            ));
        }
        self.high = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(bytes: Option<u64>, files: Option<u64>, used: u64, count: u64) -> Quota {
        Quota {
            limits: Limits { bytes, files },
            usage: Arc::new(Usage {
                bytes: AtomicU64::new(used),
                files: AtomicU64::new(count),
            }),
        }
    }

    #[test]
    fn uploads_share_the_quota_and_a_far_byte_costs_its_offset() {
        let q = quota(Some(1000), None, 100, 1);
        let (mut a, mut b) = (q.charge(0), q.charge(50));
        a.reach(300).unwrap();
        a.reach(200).unwrap(); // behind the furthest byte: free
        b.reach(450).unwrap(); // 400 more: 800 used
        let e = a.reach(600).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::DQUOT.raw_os_error())
        );
        assert_eq!(
            q.usage.bytes.load(Ordering::Acquire),
            800,
            "a refused write costs nothing"
        );
        // One byte far out, as a sparse MODE E block: all of it counts.
        assert!(q.charge(0).reach(10_000).is_err());
        a.reach(500).unwrap();
        assert_eq!(q.usage.bytes.load(Ordering::Acquire), 1000);
        assert!(matches!(q.admit(false), Err(FsError::Quota(_))), "full");
        assert!(q.fits(0).is_ok() && q.fits(1).is_err());
        q.deleted(300);
        assert!(q.admit(true).is_ok());
    }

    #[test]
    fn the_file_count_refuses_new_names_only_and_replacing_frees_bytes() {
        let q = quota(None, Some(2), 0, 1);
        assert!(q.admit(true).is_ok());
        q.new_file().unwrap();
        assert!(matches!(q.admit(true), Err(FsError::Quota(_))));
        assert!(
            matches!(q.new_file(), Err(FsError::Quota(_))),
            "at the count"
        );
        assert!(q.admit(false).is_ok(), "replacing a file adds none");
        q.no_new_file();
        q.new_file().unwrap();
        q.usage.bytes.store(500, Ordering::Release);
        q.replaced(200);
        assert_eq!(q.usage.bytes.load(Ordering::Acquire), 300);
    }

    #[test]
    fn the_walk_counts_bytes_and_files_but_not_partials_as_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("sub/b"), [0u8; 5]).unwrap();
        let part = format!(".c{}", braid_proto::path::PART_SUFFIX);
        std::fs::write(dir.path().join("sub").join(part), [0u8; 7]).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
        assert_eq!(count(dir.path()).unwrap(), (22, 2));
        let usages = Usages::default();
        let u = usages.of(dir.path()).unwrap();
        assert!(
            Arc::ptr_eq(&u, &usages.of(dir.path()).unwrap()),
            "walked once"
        );
    }
}
