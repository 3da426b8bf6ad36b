//! Accounts for `braid serve --users FILE`: one line per user,
//! `name:argon2-hash:ro|rw:root-directory`, written by `braid passwd`. The permission may carry
//! the user's class of service after commas: `rw,background,rate=2MB,weight=4` (see [`Class`]).

use anyhow::{Context, bail};
use argon2::password_hash::SaltString;
use argon2::{Argon2, PasswordHash, PasswordHasher};
use braid_proto::session::Perm;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One account.
#[derive(Debug, Clone)]
pub struct Account {
    pub hash: String,
    pub perm: Perm,
    pub root: PathBuf,
    pub class: Class,
}

/// How the server sends to a user: what it may take of the uplink, and how it yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    /// `background`: the server's sending yields to other traffic (as `get --background`).
    pub background: bool,
    /// `rate=2MB`: a cap on the server's sending rate for each of the user's transfers,
    /// bytes/s.
    pub rate: Option<u64>,
    /// `weight=4`: the user's share of `--uplink` against other running transfers' (1 by
    /// default): preferred customers get more.
    pub weight: u32,
    /// `quota=10GB`: most bytes under the user's root (uploads past it get 552).
    pub quota: Option<u64>,
    /// `quota-files=N`: most files under the user's root.
    pub quota_files: Option<u64>,
}

impl Default for Class {
    fn default() -> Class {
        Class {
            background: false,
            rate: None,
            weight: 1,
            quota: None,
            quota_files: None,
        }
    }
}

/// The largest weight (a share of at least a thousandth for everyone).
pub const MAX_WEIGHT: u32 = 1000;

impl Class {
    /// The options after the permission: `background`, `rate=SIZE`, `weight=N`.
    pub fn parse<'a>(options: impl Iterator<Item = &'a str>) -> Result<Class, String> {
        let mut c = Class::default();
        for o in options.map(str::trim).filter(|o| !o.is_empty()) {
            match o.split_once('=') {
                None if o == "background" => c.background = true,
                Some(("rate", v)) => c.rate = Some(crate::units::parse_size(v)?),
                Some(("quota", v)) => c.quota = Some(crate::units::parse_size(v)?),
                Some(("quota-files", v)) => {
                    c.quota_files = Some(
                        v.parse()
                            .map_err(|_| format!("quota-files must be a count, not {v:?}"))?,
                    )
                }
                Some(("weight", v)) => {
                    c.weight = match v.parse::<u32>() {
                        Ok(w) if (1..=MAX_WEIGHT).contains(&w) => w,
                        _ => {
                            return Err(format!(
                                "weight must be from 1 to {MAX_WEIGHT}, not {v:?}"
                            ));
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        "{o:?} is not a class option (background, rate=SIZE, weight=N, quota=SIZE, quota-files=N)"
                    ));
                }
            }
        }
        Ok(c)
    }
}

/// All accounts of a users file.
#[derive(Debug, Clone, Default)]
pub struct Users {
    accounts: HashMap<String, Account>,
}

/// The directory relative root directories in the users file `path` are taken from.
pub fn base_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// A hash checked for unknown user names, so that a failed login takes as long whether or not
/// the user exists (RFC 2577, "Protecting Usernames").
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$YnJhaWRkdW1teXNhbHQ$Ajq0jOeKZz3tv8TDn6fDCf5VGGbCwS2AeC+hmrzUdqE";

impl Users {
    /// Reads a users file. Relative root directories are taken relative to the file.
    pub fn load(path: &Path) -> anyhow::Result<Users> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read users file {}", path.display()))?;
        Users::parse(&text, base_of(path))
            .with_context(|| format!("in users file {}", path.display()))
    }

    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Users> {
        let mut accounts = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut f = line.splitn(4, ':');
            let (Some(name), Some(hash), Some(perm), Some(root)) =
                (f.next(), f.next(), f.next(), f.next())
            else {
                bail!("line {}: expected name:hash:ro|rw:root", i + 1);
            };
            PasswordHash::new(hash)
                .map_err(|e| anyhow::anyhow!("line {}: bad password hash: {e}", i + 1))?;
            let mut options = perm.split(',');
            let perm = match options.next().unwrap_or_default() {
                "ro" => Perm::ReadOnly,
                "rw" => Perm::ReadWrite,
                other => bail!("line {}: permission must be ro or rw, not {other:?}", i + 1),
            };
            let class =
                Class::parse(options).map_err(|e| anyhow::anyhow!("line {}: {e}", i + 1))?;
            let root = base.join(root);
            accounts.insert(
                name.to_string(),
                Account {
                    hash: hash.to_string(),
                    perm,
                    root,
                    class,
                },
            );
        }
        Ok(Users { accounts })
    }

    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// Every account's root directory, each once.
    pub fn roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = self.accounts.values().map(|a| a.root.clone()).collect();
        roots.sort();
        roots.dedup();
        roots
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// A user's class of service (the default for names not in the file).
    pub fn class(&self, user: &str) -> Class {
        self.accounts.get(user).map(|a| a.class).unwrap_or_default()
    }

    /// An account by name, its password unchecked: for a login another way proved (GSI).
    pub fn account(&self, user: &str) -> Option<&Account> {
        self.accounts.get(user)
    }

    /// Checks a password; slow on purpose (argon2), so call it off the async runtime.
    pub fn verify(&self, user: &str, password: &str) -> Option<&Account> {
        let (hash, account) = match self.accounts.get(user) {
            Some(a) => (a.hash.as_str(), Some(a)),
            None => (DUMMY_HASH, None),
        };
        // Checked whether or not the user exists, so that both take as long.
        let ok = matches(hash, password);
        account.filter(|_| ok)
    }
}

thread_local! {
    /// Argon2's working memory (19 MiB with the default parameters), kept by each thread that
    /// checks passwords: allocated and freed per check, glibc kept up to 20 of them in its
    /// arenas after a flood of guesses on two threads (440 MB).
    static ARGON2_MEMORY: std::cell::RefCell<Vec<argon2::Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `password` hashes to the PHC string `hash`, in this thread's argon2 memory; the
/// outputs are compared in constant time.
fn matches(hash: &str, password: &str) -> bool {
    let Ok(h) = PasswordHash::new(hash) else {
        return false;
    };
    let (Ok(algorithm), Ok(params), Some(salt), Some(expected)) = (
        argon2::Algorithm::try_from(h.algorithm),
        argon2::Params::try_from(&h),
        h.salt,
        h.hash,
    ) else {
        return false;
    };
    let version = match h.version.map(argon2::Version::try_from) {
        None => argon2::Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
        return false;
    };
    let mut out = vec![0u8; expected.len()];
    let hashed = ARGON2_MEMORY.with_borrow_mut(|memory| {
        if memory.len() < params.block_count() {
            memory.resize(params.block_count(), argon2::Block::default());
        }
        Argon2::new(algorithm, version, params).hash_password_into_with_memory(
            password.as_bytes(),
            salt,
            &mut out,
            &mut memory[..],
        )
    });
    hashed.is_ok() && argon2::password_hash::Output::new(&out).is_ok_and(|o| o == expected)
}

/// Hashes a password with a fresh random salt.
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    let salt_bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let hash = Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| anyhow::anyhow!("cannot hash password: {e}"))?;
    Ok(hash.to_string())
}

/// Adds or replaces a user's line in a users file (created if missing), keeping other lines.
/// A symlinked file is written at its target; runs at once take turns (a lock on the file), so
/// none loses another's entry; the file keeps its owner and group, and its mode less any access
/// for others (it holds password hashes).
pub fn write_entry(
    file: &Path,
    name: &str,
    password: &str,
    perm: Perm,
    root: &Path,
) -> anyhow::Result<()> {
    if name.is_empty() || name.contains([':', '\n', '\r']) || name.chars().any(char::is_whitespace)
    {
        bail!("user name {name:?} must be non-empty without ':' or white space");
    }
    let root_text = root
        .to_str()
        .context("root directory must be valid UTF-8")?;
    if root_text.contains(['\n', '\r']) {
        bail!("root directory must not contain line breaks");
    }
    let hash = hash_password(password)?;
    let file = &link_target(file)?;
    let (_lock, existing, meta) = lock_and_read(file)?;
    let perm = match perm {
        Perm::ReadOnly => "ro",
        Perm::ReadWrite => "rw",
    };
    // A new password keeps the user's class of service.
    let class = existing
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .and_then(|l| l.split(':').nth(2))
        .and_then(|p| p.split_once(','))
        .map_or(String::new(), |(_, c)| format!(",{c}"));
    let entry = format!("{name}:{hash}:{perm}{class}:{root_text}");
    let mut out: Vec<String> = existing
        .lines()
        .filter(|l| l.split(':').next() != Some(name))
        .map(str::to_string)
        .collect();
    out.push(entry);
    replace_private(file, (out.join("\n") + "\n").as_bytes(), &meta)
}

/// Where `path` leads through symlinks (at most 40, as the kernel allows): the file to
/// replace, so that a link an admin made keeps pointing at the accounts.
fn link_target(path: &Path) -> anyhow::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)
                    .with_context(|| format!("cannot read the link {}", p.display()))?;
                p = match p.parent() {
                    Some(dir) => dir.join(to),
                    None => to,
                };
            }
            _ => return Ok(p),
        }
    }
    bail!("{}: too many levels of symbolic links", path.display())
}

/// Opens `file` (created empty and private if missing), waits for its lock, and reads it. A
/// run that replaced the file while this one waited leaves the lock on the old one, so the lock
/// is taken again on the file now at the path.
fn lock_and_read(file: &Path) -> anyhow::Result<(std::fs::File, String, std::fs::Metadata)> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    loop {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(file)
            .with_context(|| format!("cannot open {}", file.display()))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .with_context(|| format!("cannot lock {}", file.display()))?;
        let meta = f.metadata()?;
        let now = std::fs::metadata(file).ok();
        if now.is_some_and(|n| n.dev() == meta.dev() && n.ino() == meta.ino()) {
            let mut text = String::new();
            f.read_to_string(&mut text)
                .with_context(|| format!("cannot read {}", file.display()))?;
            return Ok((f, text, meta));
        }
    }
}

/// Replaces `file` with `bytes`: a fresh temporary file beside it (random name, created
/// exclusively, 0600 from the start, so a link planted at a predictable name is never
/// followed), given the old file's owner, group and mode less others' access, then renamed
/// over it, so a reader sees the old file or the new one, never half of one.
fn replace_private(file: &Path, bytes: &[u8], old: &std::fs::Metadata) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".braid-users-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let f = tmp.as_file();
    let mine = f.metadata()?;
    if (mine.uid(), mine.gid()) != (old.uid(), old.gid()) {
        std::os::unix::fs::fchown(f, Some(old.uid()), Some(old.gid())).with_context(|| {
            format!(
                "cannot give the new {} its owner and group ({}:{}) back; run braid passwd \
                 as that owner or as root",
                file.display(),
                old.uid(),
                old.gid()
            )
        })?;
    }
    f.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o770))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    tmp.persist(file)
        .with_context(|| format!("cannot replace {}", file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_only_the_right_password() {
        let line = format!("alice:{}:rw:data", hash_password("s3cret").unwrap());
        let users = Users::parse(&line, Path::new("/srv")).unwrap();
        let a = users.verify("alice", "s3cret").unwrap();
        assert_eq!(a.perm, Perm::ReadWrite);
        assert_eq!(a.root, PathBuf::from("/srv/data"));
        assert!(users.verify("alice", "wrong").is_none());
        assert!(users.verify("bob", "s3cret").is_none());
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[test]
    fn rejects_malformed_lines() {
        assert!(Users::parse("alice:nothash:rw:/x", Path::new("/")).is_err());
        assert!(Users::parse("alice", Path::new("/")).is_err());
        let hash = hash_password("p").unwrap();
        for bad in [
            "rw,fast",
            "rw,rate=lots",
            "rw,weight=0",
            "rw,weight=1001",
            "rw,quota=much",
            "rw,quota-files=-1",
            "rx,background",
        ] {
            let line = format!("alice:{hash}:{bad}:/x");
            assert!(Users::parse(&line, Path::new("/")).is_err(), "{bad}");
        }
    }

    #[test]
    fn classes_of_service_and_a_new_password_keeps_them() {
        let hash = hash_password("p").unwrap();
        let text = format!(
            "alice:{hash}:rw,background,rate=2MB,quota=10GB,quota-files=500:/a\nbob:{hash}:ro,weight=4:/b:c\ncarol:{hash}:ro:/c\n"
        );
        let users = Users::parse(&text, Path::new("/")).unwrap();
        let alice = Class {
            background: true,
            rate: Some(2_000_000),
            weight: 1,
            quota: Some(10_000_000_000),
            quota_files: Some(500),
        };
        assert_eq!(users.class("alice"), alice);
        assert_eq!(users.class("bob").weight, 4);
        assert_eq!(
            users.verify("bob", "p").unwrap().root,
            PathBuf::from("/b:c")
        );
        assert_eq!(users.class("carol"), Class::default());
        assert_eq!(users.class("nobody"), Class::default());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users");
        std::fs::write(&file, &text).unwrap();
        write_entry(&file, "alice", "new", Perm::ReadWrite, Path::new("/a")).unwrap();
        let users = Users::load(&file).unwrap();
        assert_eq!(users.class("alice"), alice);
        assert!(users.verify("alice", "new").is_some());
        assert_eq!(users.class("bob").weight, 4);
    }
}
