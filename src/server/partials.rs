//! Partial uploads left behind expire: a failed or abandoned upload keeps its hidden
//! `.NAME.braid-part` for a resume, but not forever (`--partial-max-age`).

use super::Config;
use braid_proto::path::is_part_name;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// Entries one sweep looks at, at most, so a sweep of a huge tree stays bounded (partials
/// past that many entries are not reached).
const MOST_ENTRIES: usize = 1_000_000;

/// What one sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub files: u64,
    pub bytes: u64,
}

/// Removes partial uploads under `roots` last written before `now - max_age` that no upload
/// holds open (an upload keeps its partial locked). Symbolic links are not followed.
pub fn sweep(roots: &[PathBuf], max_age: Duration, now: SystemTime) -> Swept {
    let mut swept = Swept::default();
    let Some(cutoff) = now.checked_sub(max_age) else {
        return swept;
    };
    let mut seen = 0;
    let mut dirs: Vec<PathBuf> = roots.to_vec();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MOST_ENTRIES {
                return swept;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file()
                && entry.file_name().to_str().is_some_and(is_part_name)
                && let Some(bytes) = remove_if_stale(&entry.path(), cutoff)
            {
                swept.files += 1;
                swept.bytes += bytes;
            }
        }
    }
    swept
}

/// Removes one partial if it is older than `cutoff` and not in use; its size if it did.
fn remove_if_stale(path: &Path, cutoff: SystemTime) -> Option<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    // Not through a link someone put in place of the file since the directory was read.
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nofollow)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if meta.modified().ok()? >= cutoff {
        return None;
    }
    // Held by a running upload (or a resume that has just begun): not stale.
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    std::fs::remove_file(path).ok()?;
    Some(meta.len())
}

/// How often the server looks: a fraction of the age, between a minute and an hour.
fn every(max_age: Duration) -> Duration {
    (max_age / 8).clamp(Duration::from_secs(60), Duration::from_secs(3600))
}

/// Sweeps the served roots now and then, with the configuration current at each sweep.
pub async fn expire(configs: watch::Receiver<Arc<Config>>) {
    loop {
        let config = configs.borrow().clone();
        let Some(max_age) = config.partial_max_age else {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            continue;
        };
        let mut roots = config.users.roots();
        if config.anonymous.is_some() {
            roots.push(config.root.clone());
        }
        let swept =
            tokio::task::spawn_blocking(move || sweep(&roots, max_age, SystemTime::now())).await;
        if let Ok(s) = swept
            && s.files > 0
        {
            tracing::info!(
                files = s.files,
                bytes = s.bytes,
                max_age_s = max_age.as_secs(),
                "expired partial uploads"
            );
        }
        tokio::time::sleep(every(max_age)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path, ago: Duration) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn only_old_partials_that_no_upload_holds_are_removed() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        let deep = root.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        let day = Duration::from_secs(86_400);
        let old = deep.join(".old.bin.braid-part");
        let young = root.join(".young.bin.braid-part");
        let held = root.join(".held.bin.braid-part");
        let user_file = root.join("kept.bin");
        let named_like = root.join("x.braid-part");
        for (p, ago) in [
            (&old, 8 * day),
            (&young, day),
            (&held, 8 * day),
            (&user_file, 30 * day),
            (&named_like, 30 * day),
        ] {
            std::fs::write(p, vec![7u8; 1000]).unwrap();
            age(p, ago);
        }
        // A link to a partial elsewhere is not followed.
        let outside = top.path().join(".outside.braid-part");
        std::fs::write(&outside, b"x").unwrap();
        age(&outside, 30 * day);
        std::os::unix::fs::symlink(&outside, root.join(".link.braid-part")).unwrap();
        let holding = std::fs::File::open(&held).unwrap();
        rustix::fs::flock(&holding, rustix::fs::FlockOperation::LockExclusive).unwrap();

        let swept = sweep(std::slice::from_ref(&root), 7 * day, SystemTime::now());
        assert_eq!(
            swept,
            Swept {
                files: 1,
                bytes: 1000
            }
        );
        assert!(!old.exists());
        for kept in [&young, &held, &user_file, &named_like, &outside] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        drop(holding);
        assert_eq!(
            sweep(&[root], 7 * day, SystemTime::now()).files,
            1,
            "the partial no longer held"
        );
    }

    #[test]
    fn sweeps_come_between_a_minute_and_an_hour_apart() {
        assert_eq!(every(Duration::from_secs(10)), Duration::from_secs(60));
        assert_eq!(
            every(Duration::from_secs(8 * 600)),
            Duration::from_secs(600)
        );
        assert_eq!(
            every(Duration::from_secs(86_400 * 7)),
            Duration::from_secs(3600)
        );
    }
}
