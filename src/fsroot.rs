//! A directory tree that a session may not leave.
//!
//! Every path is opened with `openat2(RESOLVE_BENEATH)` relative to a handle on the root
//! directory, so `..`, absolute symlinks and symlinks that climb out are refused by the kernel
//! itself, with no window between checking a path and using it.

use braid_proto::VPath;
use braid_proto::listing::{Entry, EntryKind};
use braid_proto::session::FsError;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The root of one user's view of the file system.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    path: PathBuf,
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

use braid_proto::path::PART_SUFFIX;

pub fn errno_to_fs(e: Errno) -> FsError {
    match e {
        Errno::NOENT => FsError::NotFound,
        Errno::NOTDIR => FsError::NotADirectory,
        Errno::ACCESS | Errno::PERM | Errno::ROFS => FsError::PermissionDenied,
        Errno::EXIST => FsError::Exists,
        Errno::NOTEMPTY => FsError::NotEmpty,
        Errno::XDEV | Errno::LOOP => FsError::Escapes,
        Errno::NOSPC => FsError::NoSpace,
        Errno::DQUOT => FsError::Quota("no room left in it".into()),
        Errno::ISDIR => FsError::NotAFile,
        e => FsError::Other(std::io::Error::from(e).to_string()),
    }
}

pub fn io_to_fs(e: &std::io::Error) -> FsError {
    match e.raw_os_error() {
        Some(code) => errno_to_fs(Errno::from_raw_os_error(code)),
        None => FsError::Other(e.to_string()),
    }
}

/// Facts about one open file or directory.
fn entry_from_stat(name: &str, st: &Stat) -> Entry {
    let kind = match st.st_mode & 0o170000 {
        0o040000 => EntryKind::Dir,
        0o100000 => EntryKind::File,
        0o120000 => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    Entry {
        name: name.to_string(),
        kind,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mtime: st.st_mtime,
        mode: st.st_mode & 0o7777,
        nlink: st.st_nlink,
        dev: st.st_dev,
        ino: st.st_ino,
    }
}

/// A directory entry's name as a listing shows it; None for `.`, `..`, uploads in progress,
/// and names that cannot be named over an RFC 2640 control connection (not UTF-8, or with
/// control characters).
fn listable(name: &std::ffi::CStr) -> Option<&str> {
    name.to_str().ok().filter(|n| {
        *n != "."
            && *n != ".."
            && !braid_proto::path::is_part_name(n)
            && !n.chars().any(char::is_control)
    })
}

/// The hidden name an upload of `name` is written under until it completes.
pub fn part_name(name: &str) -> String {
    format!(".{name}{PART_SUFFIX}")
}

impl Root {
    pub fn open(path: &Path) -> std::io::Result<Root> {
        let dir = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            dir,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_at(&self, p: &VPath, flags: OFlags) -> Result<OwnedFd, FsError> {
        rustix::fs::openat2(
            &self.dir,
            p.relative(),
            flags | OFlags::CLOEXEC,
            // openat2 refuses a mode without O_CREAT, and nothing here creates.
            Mode::empty(),
            RESOLVE,
        )
        .map_err(errno_to_fs)
    }

    /// The directory that holds `p`, and `p`'s last name. The root itself has no parent.
    fn parent_of<'a>(&self, p: &'a VPath) -> Result<(OwnedFd, &'a str), FsError> {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
            return Err(FsError::PermissionDenied);
        };
        let fd = self.open_at(&parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((fd, name))
    }

    /// Stats `p`, following symlinks only while they stay beneath the root.
    pub fn stat(&self, p: &VPath) -> Result<Entry, FsError> {
        let fd = self.open_at(p, OFlags::PATH)?;
        let st = rustix::fs::fstat(&fd).map_err(errno_to_fs)?;
        Ok(entry_from_stat(p.file_name().unwrap_or("/"), &st))
    }

    /// Stats many paths as [`stat`](Self::stat) does, each through its directory opened once
    /// for the files beside it (a bundle's thousands of files: one syscall each, not a walk
    /// from the root and three). A symbolic link is followed as `stat` follows it.
    pub fn stat_files<'a>(
        &self,
        paths: impl IntoIterator<Item = &'a VPath>,
    ) -> impl Iterator<Item = (&'a VPath, Result<Entry, FsError>)> {
        let mut dir: Option<(&'a [String], OwnedFd)> = None;
        paths.into_iter().map(move |p| {
            let (Some(name), Some((_, parent))) = (p.file_name(), p.parts().split_last()) else {
                return (p, self.stat(p));
            };
            let fd = match dir.take() {
                Some((d, fd)) if d == parent => fd,
                _ => match p.parent() {
                    Some(d) => match self.open_at(&d, OFlags::PATH | OFlags::DIRECTORY) {
                        Ok(fd) => fd,
                        Err(e) => return (p, Err(e)),
                    },
                    None => return (p, self.stat(p)),
                },
            };
            let entry = match rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_mode & 0o170000 == 0o120000 => self.stat(p),
                Ok(st) => Ok(entry_from_stat(name, &st)),
                Err(e) => Err(errno_to_fs(e)),
            };
            dir = Some((parent, fd));
            (p, entry)
        })
    }

    pub fn is_dir(&self, p: &VPath) -> Result<(), FsError> {
        self.open_at(p, OFlags::PATH | OFlags::DIRECTORY).map(drop)
    }

    /// Opens a plain file to read; returns it with its facts. Anything else is refused without
    /// waiting on it: opening a FIFO to read blocks until a writer comes, which held a thread
    /// per RETR forever.
    pub fn open_read(&self, p: &VPath) -> Result<(File, Entry), FsError> {
        let fd = self.open_at(p, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let st = rustix::fs::fstat(&fd).map_err(errno_to_fs)?;
        let entry = entry_from_stat(p.file_name().unwrap_or("/"), &st);
        if entry.kind != EntryKind::File {
            return Err(FsError::NotAFile);
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(errno_to_fs)?;
        Ok((File::from(fd), entry))
    }

    /// The entries of a directory, `.` and `..` left out. Entries whose symlinks lead out of
    /// the root are shown as links, without following them.
    pub fn list(&self, p: &VPath) -> Result<Vec<Entry>, FsError> {
        let fd = self.open_at(p, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let dir = rustix::fs::Dir::new(fd).map_err(errno_to_fs)?;
        let mut children = Vec::new();
        for item in dir {
            let item = item.map_err(errno_to_fs)?;
            let Some(name) = listable(item.file_name()) else {
                continue;
            };
            children.push(p.join(name).map_err(|e| FsError::Other(e.to_string()))?);
        }
        let mut out = Vec::with_capacity(children.len());
        for (child, entry) in self.stat_files(&children) {
            match entry {
                Ok(e) => out.push(e),
                Err(_) => {
                    // Dangling link or a link out of the root: describe the link itself.
                    let (dir, name) = self.parent_of(child)?;
                    if let Ok(st) = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                        out.push(entry_from_stat(name, &st));
                    }
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Every entry beneath directory `p`, breadth first and sorted within each directory,
    /// named by its path relative to `p` (MLSR). Symbolic links are described as links and
    /// never followed, so the walk stays in the tree and ends; directories `depth` levels
    /// down are listed but not entered. More than `most` entries: refused.
    pub fn list_tree(&self, p: &VPath, depth: usize, most: usize) -> Result<Vec<Entry>, FsError> {
        let mut out = Vec::new();
        let mut dirs = VecDeque::from([(p.clone(), String::new(), 0)]);
        while let Some((dir, rel, level)) = dirs.pop_front() {
            // The top may be a link that stays in the root, as for MLSD; nothing under it is
            // followed.
            let follow = if level == 0 {
                OFlags::empty()
            } else {
                OFlags::NOFOLLOW
            };
            let fd = match self.open_at(&dir, OFlags::RDONLY | OFlags::DIRECTORY | follow) {
                Ok(fd) => fd,
                // Gone or replaced since its parent was read: it is listed, with nothing in it.
                Err(_) if level > 0 => continue,
                Err(e) => return Err(e),
            };
            let mut here = Vec::new();
            for item in rustix::fs::Dir::read_from(&fd).map_err(errno_to_fs)? {
                let item = item.map_err(errno_to_fs)?;
                let Some(name) = listable(item.file_name()) else {
                    continue;
                };
                if let Ok(st) = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    here.push(entry_from_stat(name, &st));
                }
            }
            here.sort_by(|a, b| a.name.cmp(&b.name));
            for mut e in here {
                let path = if rel.is_empty() {
                    e.name.clone()
                } else {
                    format!("{rel}/{}", e.name)
                };
                if e.kind == EntryKind::Dir && level + 1 < depth {
                    let child = dir
                        .join(&e.name)
                        .map_err(|e| FsError::Other(e.to_string()))?;
                    dirs.push_back((child, path.clone(), level + 1));
                }
                e.name = path;
                out.push(e);
                if out.len() > most {
                    return Err(FsError::Other(format!(
                        "more than {most} entries beneath this directory: list its directories one at a time (MLSD)"
                    )));
                }
            }
        }
        Ok(out)
    }

    pub fn mkdir(&self, p: &VPath) -> Result<(), FsError> {
        let (dir, name) = self.parent_of(p)?;
        rustix::fs::mkdirat(&dir, name, Mode::from_bits_truncate(0o755)).map_err(errno_to_fs)
    }

    /// MFMT: sets a file's or directory's modification time (its access time is left alone).
    /// Through a descriptor opened beneath the root without following a last symlink, so a
    /// link cannot make it touch something else.
    pub fn set_mtime(&self, p: &VPath, secs: i64) -> Result<(), FsError> {
        let fd = self.open_at(p, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK)?;
        let omit = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        };
        let times = rustix::fs::Timestamps {
            last_access: omit,
            last_modification: rustix::fs::Timespec {
                tv_sec: secs,
                tv_nsec: 0,
            },
        };
        rustix::fs::futimens(&fd, &times).map_err(errno_to_fs)
    }

    pub fn rmdir(&self, p: &VPath) -> Result<(), FsError> {
        let (dir, name) = self.parent_of(p)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(errno_to_fs)
    }

    /// Deletes a file (or symlink); directories need RMD.
    pub fn delete(&self, p: &VPath) -> Result<(), FsError> {
        let (dir, name) = self.parent_of(p)?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(errno_to_fs)?;
        if st.st_mode & 0o170000 == 0o040000 {
            return Err(FsError::NotAFile);
        }
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(errno_to_fs)
    }

    /// Checks that a rename source exists (the link itself, not what it points to).
    pub fn exists_nofollow(&self, p: &VPath) -> Result<(), FsError> {
        let (dir, name) = self.parent_of(p)?;
        rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map(drop)
            .map_err(errno_to_fs)
    }

    pub fn rename(&self, from: &VPath, to: &VPath) -> Result<(), FsError> {
        let (from_dir, from_name) = self.parent_of(from)?;
        let (to_dir, to_name) = self.parent_of(to)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(errno_to_fs)
    }

    /// Size of `p`; for a file still being uploaded (only its partial exists), the partial's
    /// size, so that standard clients can resume an upload with SIZE then REST or APPE.
    pub fn size(&self, p: &VPath) -> Result<u64, FsError> {
        match self.stat(p) {
            Ok(e) if e.kind == EntryKind::File => Ok(e.size),
            Ok(_) => Err(FsError::NotAFile),
            Err(FsError::NotFound) => {
                let upload = Upload::locate(self, p)?;
                match rustix::fs::statat(&upload.dir, &upload.part, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if st.st_mode & 0o170000 == 0o100000 => {
                        Ok(u64::try_from(st.st_size).unwrap_or(0))
                    }
                    _ => Err(FsError::NotFound),
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// How an upload treats data already on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadStart {
    /// STOR, possibly after REST: write from this offset.
    At(u64),
    /// APPE: write after whatever is there.
    Append,
    /// MODE E restart: keep the partial as it is; blocks land at their offsets.
    Keep,
}

/// An upload in progress: data goes to a hidden partial file beside the target, which takes the
/// target's name only when the transfer completes.
#[derive(Debug)]
pub struct Upload {
    /// Shared by a stored bundle's files in one directory (each would hold a descriptor).
    dir: std::sync::Arc<OwnedFd>,
    name: String,
    part: String,
}

impl Upload {
    fn locate(root: &Root, p: &VPath) -> Result<Upload, FsError> {
        let (dir, name) = root.parent_of(p)?;
        Ok(Upload::in_dir(std::sync::Arc::new(dir), name))
    }

    fn in_dir(dir: std::sync::Arc<OwnedFd>, name: &str) -> Upload {
        Upload {
            part: part_name(name),
            name: name.to_string(),
            dir,
        }
    }

    /// Opens the partial file another server is writing (a striped front end, which holds its
    /// lock), to write blocks into it at their offsets: not created, emptied or locked here.
    pub fn join(root: &Root, p: &VPath) -> Result<(Upload, File), FsError> {
        let up = Upload::locate(root, p)?;
        let fd = rustix::fs::openat(
            &up.dir,
            up.part.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(errno_to_fs)?;
        Ok((up, File::from(fd)))
    }

    /// Opens (or creates) the partial file and positions it; returns the file and the offset at
    /// which the incoming data starts.
    pub fn begin(
        root: &Root,
        p: &VPath,
        start: UploadStart,
    ) -> Result<(Upload, File, u64), FsError> {
        Upload::locate(root, p)?.start(start)
    }

    fn start(self, start: UploadStart) -> Result<(Upload, File, u64), FsError> {
        let up = self;
        if let Ok(st) = rustix::fs::statat(&up.dir, up.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            && st.st_mode & 0o170000 == 0o040000
        {
            return Err(FsError::NotAFile);
        }
        let part = |fresh: bool| up.open_part(fresh);
        let part_len = |f: &File| f.metadata().map(|m| m.len()).map_err(|e| io_to_fs(&e));
        let (file, offset) = match start {
            UploadStart::Keep => (part(false)?, 0),
            UploadStart::At(0) => (part(true)?, 0),
            UploadStart::At(n) => match part(false) {
                Ok(f) => {
                    let have = part_len(&f)?;
                    if n > have {
                        return Err(FsError::BadRestart {
                            offset: n,
                            size: have,
                        });
                    }
                    f.set_len(n).map_err(|e| io_to_fs(&e))?;
                    (f, n)
                }
                Err(FsError::NotFound) => {
                    let f = part(true)?;
                    let have = up.seed_from_final(&f, Some(n))?;
                    if have < n {
                        return Err(FsError::BadRestart {
                            offset: n,
                            size: have,
                        });
                    }
                    (f, n)
                }
                Err(e) => return Err(e),
            },
            UploadStart::Append => match part(false) {
                Ok(f) => {
                    let have = part_len(&f)?;
                    (f, have)
                }
                Err(FsError::NotFound) => {
                    let f = part(true)?;
                    let have = up.seed_from_final(&f, None)?;
                    (f, have)
                }
                Err(e) => return Err(e),
            },
        };
        Ok((up, file, offset))
    }

    /// Opens the partial file as the one upload that writes it, `fresh`: created if missing
    /// and emptied. An exclusive lock, held while the file stays open, refuses a second upload
    /// of the same name at the same time, which would interleave its bytes with this one's;
    /// the file is emptied only once the lock is held. The lock is taken on the file under
    /// the partial's name now, not on one a finished upload has just renamed into place. Read
    /// as well as write: a resumed MODE E upload is checksummed from the file.
    fn open_part(&self, fresh: bool) -> Result<File, FsError> {
        let mut flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        if fresh {
            flags |= OFlags::CREATE;
        }
        for _ in 0..8 {
            let fd = rustix::fs::openat(
                &self.dir,
                self.part.as_str(),
                flags,
                Mode::from_bits_truncate(0o644),
            )
            .map_err(errno_to_fs)?;
            match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) => return Err(FsError::Busy),
                Err(e) => return Err(errno_to_fs(e)),
            }
            let held = rustix::fs::fstat(&fd).map_err(errno_to_fs)?;
            match rustix::fs::statat(&self.dir, self.part.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(named) if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino) => {
                    let file = File::from(fd);
                    if fresh {
                        file.set_len(0).map_err(|e| io_to_fs(&e))?;
                    }
                    return Ok(file);
                }
                // Renamed into place (or removed) between the open and the lock: that file
                // is another upload's, finished; look again.
                Ok(_) | Err(Errno::NOENT) if fresh => continue,
                Ok(_) | Err(Errno::NOENT) => return Err(FsError::NotFound),
                Err(e) => return Err(errno_to_fs(e)),
            }
        }
        Err(FsError::Busy)
    }

    /// Copies the first `limit` bytes (all if `None`) of an existing final file into the new
    /// partial, so REST or APPE on a complete file still replaces it atomically.
    fn seed_from_final(&self, part: &File, limit: Option<u64>) -> Result<u64, FsError> {
        let src = match rustix::fs::openat(
            &self.dir,
            self.name.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(0),
            Err(e) => return Err(errno_to_fs(e)),
        };
        let meta = src.metadata().map_err(|e| io_to_fs(&e))?;
        // Only a plain file has data to keep (a FIFO would block the copy).
        if !meta.is_file() {
            return Err(FsError::NotAFile);
        }
        let len = meta.len();
        let want = limit.map_or(len, |l| l.min(len));
        let mut copied = 0;
        while copied < want {
            let n = rustix::fs::copy_file_range(
                &src,
                None,
                part,
                None,
                usize::try_from(want - copied)
                    .unwrap_or(usize::MAX)
                    .min(1 << 30),
            )
            .map_err(errno_to_fs)?;
            if n == 0 {
                break;
            }
            copied += n as u64;
        }
        Ok(copied)
    }

    /// Makes the upload visible under its final name, after its data is on disk. The file
    /// stays open, and so locked, until the rename is done: another upload of the name then
    /// either is refused or finds a fresh partial.
    pub fn commit(self, file: File) -> Result<(), FsError> {
        file.sync_data().map_err(|e| io_to_fs(&e))?;
        let renamed =
            rustix::fs::renameat(&self.dir, self.part.as_str(), &self.dir, self.name.as_str())
                .map_err(errno_to_fs);
        drop(file);
        renamed
    }
}

/// A bundle's files being stored (SBND): each one's partial created empty and held open and
/// locked, as a STOR's is, and the time each takes. All take their names together once the
/// bundle is whole and checked; dropped before that, the partials are removed (a bundle is
/// not resumed: the client sends it again, or its files one by one).
pub struct Partials {
    uploads: Vec<Upload>,
    files: std::sync::Arc<[File]>,
    times: Vec<Option<i64>>,
    /// The first this many are named (a commit that failed part-way leaves the rest).
    named: usize,
}

impl Partials {
    /// Creates the partial of every file; the first that cannot be is the error, naming it.
    pub fn open(root: &Root, files: &[(VPath, u64, Option<i64>)]) -> Result<Partials, FsError> {
        let mut uploads = Vec::with_capacity(files.len());
        let mut opened = Vec::with_capacity(files.len());
        let mut dir: Option<(VPath, std::sync::Arc<OwnedFd>)> = None;
        let named = |p: &VPath, e: FsError| FsError::Other(format!("{p}: {e}"));
        for (p, _, _) in files {
            let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
                return Err(named(p, FsError::PermissionDenied));
            };
            let fd = match &dir {
                Some((d, fd)) if *d == parent => fd.clone(),
                _ => {
                    let fd = root
                        .open_at(&parent, OFlags::PATH | OFlags::DIRECTORY)
                        .map_err(|e| named(p, e))?;
                    let fd = std::sync::Arc::new(fd);
                    dir = Some((parent, fd.clone()));
                    fd
                }
            };
            // Partials already made are removed with `uploads` on the way out.
            let (up, file, _) = match Upload::in_dir(fd, name).start(UploadStart::At(0)) {
                Ok(started) => started,
                Err(e) => {
                    drop(Partials {
                        uploads,
                        files: opened.into(),
                        times: Vec::new(),
                        named: 0,
                    });
                    return Err(named(p, e));
                }
            };
            uploads.push(up);
            opened.push(file);
        }
        Ok(Partials {
            uploads,
            files: opened.into(),
            times: files.iter().map(|(_, _, t)| *t).collect(),
            named: 0,
        })
    }

    /// The open partials, in the bundle's order, for the data to land in.
    pub fn files(&self) -> std::sync::Arc<[File]> {
        self.files.clone()
    }

    /// Names every file, after their data is on disk: one `syncfs` for them all (a file stored
    /// alone syncs its own data; thousands of those would take seconds), then each takes its
    /// time and its name.
    pub fn commit(mut self) -> Result<(), FsError> {
        if let Some(first) = self.files.first() {
            rustix::fs::syncfs(first).map_err(errno_to_fs)?;
        }
        for (i, up) in self.uploads.iter().enumerate() {
            if let Some(t) = self.times[i] {
                let at = rustix::fs::Timespec {
                    tv_sec: t,
                    tv_nsec: 0,
                };
                let times = rustix::fs::Timestamps {
                    last_access: at,
                    last_modification: at,
                };
                rustix::fs::futimens(&self.files[i], &times).map_err(errno_to_fs)?;
            }
            rustix::fs::renameat(&*up.dir, up.part.as_str(), &*up.dir, up.name.as_str())
                .map_err(errno_to_fs)?;
            self.named = i + 1;
        }
        Ok(())
    }
}

impl Drop for Partials {
    /// Removes the partials not named, while they are still locked (so never another
    /// upload's that took the name since).
    fn drop(&mut self) {
        for up in &self.uploads[self.named..] {
            let _ = rustix::fs::unlinkat(&*up.dir, up.part.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path gets what `stat` gives it, whichever directory the one before was in:
    /// files, a directory, links inside the root (followed) and out of it (refused), and
    /// names that are not there.
    #[test]
    fn many_paths_stat_as_each_alone() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"no").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::write(top.join("one"), b"1").unwrap();
        std::fs::write(top.join("a/two"), b"22").unwrap();
        std::fs::write(top.join("a/b/three"), b"333").unwrap();
        std::os::unix::fs::symlink("../one", top.join("a/inside")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), top.join("a/out")).unwrap();
        let root = Root::open(top).unwrap();
        let names = [
            "a/two",
            "one",
            "a/b/three",
            "a/inside",
            "a/out",
            "a/b",
            "a/none",
            "none/x",
            "a/two",
        ];
        let paths: Vec<VPath> = names
            .iter()
            .map(|n| VPath::root().join(n).unwrap())
            .collect();
        let got: Vec<_> = root.stat_files(&paths).collect();
        assert_eq!(got.len(), paths.len());
        for (p, entry) in got {
            let alone = root.stat(p);
            match (&entry, &alone) {
                (Ok(e), Ok(a)) => {
                    assert_eq!((e.kind, e.size, e.ino), (a.kind, a.size, a.ino), "{p}")
                }
                (Err(_), Err(_)) => {}
                _ => panic!("{p}: {entry:?} against {alone:?}"),
            }
        }
        let sizes: Vec<_> = root
            .stat_files(&paths)
            .map(|(_, e)| e.ok().map(|e| (e.kind, e.size)))
            .collect();
        use EntryKind::*;
        assert_eq!(
            sizes[..4],
            [
                Some((File, 2)),
                Some((File, 1)),
                Some((File, 3)),
                Some((File, 1))
            ]
        );
        assert_eq!(sizes[4], None, "a link out of the root is not followed");
        assert_eq!(sizes[5].map(|s| s.0), Some(Dir));
        assert_eq!(sizes[6..8], [None, None]);
    }
}
