//! The local side of a transfer, whatever route its data takes: where a download lands
//! (`DEST.part`, the record of what it holds, the rename that completes it) and what an upload
//! sends (the file, its remote name, what the server holds of it already).

use super::error::{ClientError, Result};
use super::records::Sidecar;
use super::url::Target;
use super::{Options, display_url};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Where a download goes.
#[derive(Debug, Clone)]
pub enum Dest {
    Stdout,
    /// `/dev/null`: the data is received and checked, then dropped (for measurements).
    Null,
    File(PathBuf),
}

/// The file a download lands in: DEST itself, DEST/NAME if DEST is a directory (or ends with
/// `/`: see [`make_dest_dir`]), or NAME in the current directory when no DEST is given.
pub fn resolve_dest(dest: Option<&str>, remote_path: &str) -> Result<Dest> {
    let name = remote_path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..");
    let no_name = |d: &str| {
        ClientError::Usage(format!(
            "the remote path names no file to save into directory {d}: add -r to fetch a directory"
        ))
    };
    match dest {
        Some("-") => Ok(Dest::Stdout),
        Some("/dev/null") => Ok(Dest::Null),
        Some(d) if Path::new(d).is_dir() => match name {
            Some(n) => Ok(Dest::File(Path::new(d).join(n))),
            None => Err(no_name(d)),
        },
        Some(d) if d.ends_with('/') => match name {
            Some(n) => Ok(Dest::File(Path::new(d).join(n))),
            None => Err(no_name(d)),
        },
        Some(d) => Ok(Dest::File(PathBuf::from(d))),
        None => name.map(|n| Dest::File(PathBuf::from(n))).ok_or_else(|| {
            ClientError::Usage(
                "the remote path names no file: give a destination, or add -r for a directory"
                    .into(),
            )
        }),
    }
}

/// Creates DEST when it ends with `/` and does not exist yet: the user named a directory to
/// download into (as `get -r` and a batch make theirs). A DEST without the slash is a file
/// name, and a missing directory on its way is an error, as with `cp`.
pub fn make_dest_dir(dest: Option<&str>) -> Result<()> {
    match dest {
        Some(d) if d.ends_with('/') && !Path::new(d).is_dir() => {
            std::fs::create_dir_all(d).map_err(local_err(format!("cannot create directory {d}")))
        }
        _ => Ok(()),
    }
}

/// `DEST.part`: where a download is written until it is complete and checked.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

pub fn local_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClientError {
    let what = what.into();
    move |cause| ClientError::Local { what, cause }
}

/// A download into a file in progress: `part` is renamed to `final_path` once complete.
pub struct PartFile {
    pub final_path: PathBuf,
    pub part: PathBuf,
    pub file: File,
}

impl PartFile {
    /// Opens `DEST.part` for writing at offsets (and reading back to check), keeping what it
    /// holds when `keep`, else emptied.
    pub fn open(dest: &Path, keep: bool) -> Result<PartFile> {
        let part = part_path(dest);
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create(true)
            .truncate(!keep)
            .open(&part)
            .map_err(local_err(format!("cannot write {}", part.display())))?;
        Ok(PartFile {
            final_path: dest.to_path_buf(),
            part,
            file,
        })
    }

    /// Bytes the partial holds from its start (what a stream-mode download continues from).
    pub fn held(&self) -> Result<u64> {
        let meta = self.file.metadata();
        Ok(meta
            .map_err(local_err(format!("cannot stat {}", self.part.display())))?
            .len())
    }

    /// The record of what it holds (`DEST.part.braid`), for the remote file `remote` of `size`
    /// bytes.
    pub fn record(&self, remote: &str, size: Option<u64>) -> Sidecar {
        Sidecar::beside(&self.part, remote, size)
    }

    pub fn name(&self) -> String {
        self.part.display().to_string()
    }

    /// Cuts the partial to `len` when given (blocks may have landed past the end of an older,
    /// longer partial), flushes it to disk and gives it its final name, which it returns.
    pub fn commit(self, len: Option<u64>) -> Result<String> {
        let part = &self.part;
        len.map_or(Ok(()), |l| self.file.set_len(l))
            .and_then(|_| self.file.sync_all())
            .map_err(local_err(format!("cannot flush {}", part.display())))?;
        std::fs::rename(part, &self.final_path).map_err(local_err(format!(
            "cannot rename {} to {}",
            part.display(),
            self.final_path.display()
        )))?;
        Ok(self.final_path.display().to_string())
    }
}

/// A download replaces an existing DEST the way `curl -o` and `cp` do, once it is complete
/// and checked, but not a file without any write permission: someone protected it.
pub fn refuse_read_only(dest: &Dest) -> Result<()> {
    match dest {
        Dest::File(p) if std::fs::metadata(p).is_ok_and(|m| m.permissions().readonly()) => {
            Err(ClientError::Local {
                what: format!("{} exists and is read-only", p.display()),
                cause: std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "braid does not replace a write-protected file: make it writable, remove it, or choose another destination",
                ),
            })
        }
        _ => Ok(()),
    }
}

/// A partial download longer than the remote file cannot be part of it.
pub fn not_a_partial(part: &Path, have: u64, size: u64) -> ClientError {
    ClientError::Integrity(format!(
        "{} holds {have} bytes but the remote file has only {size}; it is not a partial copy of it. Remove it to start over",
        part.display()
    ))
}

/// What a failed write of a download says: where what arrived is kept.
pub fn cannot_write(partial: Option<&str>) -> String {
    match partial {
        Some(p) => format!(
            "cannot write {p} (what arrived is kept there: once the cause is fixed, e.g. space freed, run again with --resume)"
        ),
        None => "cannot write the download".into(),
    }
}

/// What an upload takes the server to hold of its file already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Nothing: the whole file goes.
    Nothing,
    /// What the record of an earlier MODE E upload of it says, else nothing (`put -r
    /// --update`: a shorter file on the server may be another version, not a beginning).
    Recorded,
    /// What that record says, else the size the server reports, continued in stream mode
    /// (`--resume`).
    RecordedOrSize,
}

impl Held {
    pub fn asked(opts: &Options) -> Held {
        if opts.resume {
            Held::RecordedOrSize
        } else {
            Held::Nothing
        }
    }
}

/// An upload's local side: the open file and its length, and the remote path it goes to.
pub struct Source {
    pub path: PathBuf,
    pub file: File,
    pub meta: std::fs::Metadata,
    pub target: Target,
}

impl Source {
    /// Opens `local` for an upload to `target`; a target ending in `/` names a directory, and
    /// the file keeps its name there.
    pub fn open(local: &Path, target: &Target) -> Result<Source> {
        let not_a_file = || {
            ClientError::Usage(format!(
                "{} is a directory: to upload a directory, use put -r",
                local.display()
            ))
        };
        if local.is_dir() {
            return Err(not_a_file());
        }
        let file =
            File::open(local).map_err(local_err(format!("cannot read {}", local.display())))?;
        let meta = file
            .metadata()
            .map_err(local_err(format!("cannot stat {}", local.display())))?;
        if !meta.is_file() {
            return Err(ClientError::Usage(format!(
                "{} is not a regular file",
                local.display()
            )));
        }
        let mut target = target.clone();
        if target.path.is_empty() || target.path.ends_with('/') {
            let name = local.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                ClientError::Usage(format!("{} has no usable file name", local.display()))
            })?;
            target.path.push_str(name);
        }
        Ok(Source {
            path: local.to_path_buf(),
            file,
            meta,
            target,
        })
    }

    pub fn size(&self) -> u64 {
        self.meta.len()
    }

    pub fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// A remote path that names a directory cannot be downloaded as a file.
pub fn refuse_directory_url(target: &Target) -> Result<()> {
    if target.path.is_empty() || target.path.ends_with('/') {
        return Err(ClientError::Usage(format!(
            "{} names a directory: add -r to fetch it, or list it with braid ls",
            display_url(target)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary directory")
    }

    fn target(path: &str) -> Target {
        Target {
            gsi: false,
            host: "h".into(),
            port: 21,
            user: "anonymous".into(),
            password: String::new(),
            path: path.into(),
        }
    }

    #[test]
    fn a_destination_directory_takes_the_remote_name_and_a_missing_one_needs_a_slash() {
        let dir = tmp();
        let d = dir.path().to_str().expect("utf-8");
        let Dest::File(p) = resolve_dest(Some(d), "pub/a.bin").expect("a file") else {
            panic!("not a file")
        };
        assert_eq!(p, dir.path().join("a.bin"));
        // Not there yet: a trailing slash says it is a directory to create.
        let new = format!("{d}/new/");
        let Dest::File(p) = resolve_dest(Some(&new), "pub/a.bin").expect("a file") else {
            panic!("not a file")
        };
        assert_eq!(p, dir.path().join("new/a.bin"));
        let plain = format!("{d}/b.bin");
        let Dest::File(p) = resolve_dest(Some(&plain), "pub/a.bin").expect("a file") else {
            panic!("not a file")
        };
        assert_eq!(p, dir.path().join("b.bin"));
        assert!(matches!(resolve_dest(Some("-"), "a"), Ok(Dest::Stdout)));
        assert!(matches!(
            resolve_dest(Some("/dev/null"), "a"),
            Ok(Dest::Null)
        ));
    }

    #[test]
    fn a_url_without_a_file_name_is_refused_with_r_suggested() {
        for path in ["pub/", "", "pub/..", "."] {
            let e = resolve_dest(None, path).expect_err("no name");
            assert!(e.to_string().contains("add -r"), "{path}: {e}");
        }
        let dir = tmp();
        let e = resolve_dest(dir.path().to_str(), "pub/").expect_err("no name");
        assert!(e.to_string().contains("add -r"), "{e}");
        assert!(refuse_directory_url(&target("pub/")).is_err());
        assert!(refuse_directory_url(&target("pub/a")).is_ok());
    }

    #[test]
    fn a_partial_is_kept_or_emptied_and_commit_renames_it_cut_to_length() {
        let dir = tmp();
        let dest = dir.path().join("sub/f.bin");
        assert!(
            PartFile::open(&dest, false).is_err(),
            "a missing directory is made only on request"
        );
        let sub = format!("{}/sub/", dir.path().display());
        make_dest_dir(Some(&sub)).expect("made");
        make_dest_dir(Some(&sub)).expect("already there");
        let p = PartFile::open(&dest, false).expect("open");
        std::os::unix::fs::FileExt::write_all_at(&p.file, b"0123456789", 0).expect("write");
        drop(p);
        let p = PartFile::open(&dest, true).expect("open again");
        assert_eq!(p.held().expect("len"), 10, "kept for a resume");
        drop(p);
        let p = PartFile::open(&dest, false).expect("open, not kept");
        assert_eq!(p.held().expect("len"), 0, "emptied for a new download");
        std::os::unix::fs::FileExt::write_all_at(&p.file, b"abcdefgh", 0).expect("write");
        let part = p.part.clone();
        assert_eq!(
            p.commit(Some(5)).expect("commit"),
            dest.display().to_string()
        );
        assert!(!part.exists());
        assert_eq!(std::fs::read(&dest).expect("read"), b"abcde");
    }

    #[test]
    fn a_write_protected_destination_is_not_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp();
        let f = dir.path().join("keep");
        std::fs::write(&f, b"x").expect("write");
        assert!(refuse_read_only(&Dest::File(f.clone())).is_ok());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).expect("chmod");
        assert!(refuse_read_only(&Dest::File(f)).is_err());
    }

    #[test]
    fn an_upload_keeps_its_name_under_a_directory_url_and_a_directory_needs_put_r() {
        let dir = tmp();
        let f = dir.path().join("data.bin");
        std::fs::write(&f, b"12345").expect("write");
        let s = Source::open(&f, &target("in/")).expect("open");
        assert_eq!(s.target.path, "in/data.bin");
        assert_eq!(s.size(), 5);
        let s = Source::open(&f, &target("in/other.bin")).expect("open");
        assert_eq!(s.target.path, "in/other.bin");
        let e = Source::open(dir.path(), &target("in/"))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("put -r"), "{e}");
        assert!(Source::open(&dir.path().join("none"), &target("in/")).is_err());
    }

    #[test]
    fn a_failed_write_says_where_what_arrived_is_kept() {
        let kept = cannot_write(Some("f.part"));
        assert!(
            kept.contains("f.part") && kept.contains("--resume"),
            "{kept}"
        );
        assert_eq!(cannot_write(None), "cannot write the download");
        let e = not_a_partial(Path::new("f.part"), 10, 5);
        assert!(matches!(e, ClientError::Integrity(_)));
        assert!(e.to_string().contains("Remove it"), "{e}");
        assert_eq!(Held::asked(&Options::default()), Held::Nothing);
        let resume = Options {
            resume: true,
            ..Options::default()
        };
        assert_eq!(Held::asked(&resume), Held::RecordedOrSize);
    }
}
