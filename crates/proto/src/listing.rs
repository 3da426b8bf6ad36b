//! Directory listing formats: `ls -l` style LIST lines, NLST names and RFC 3659 MLSx facts.

use crate::time::Civil;

/// What kind of directory entry this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// The facts about one file that a listing shows, gathered by the I/O layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Unix permission bits (the low 12 bits of st_mode).
    pub mode: u32,
    pub nlink: u64,
    /// Device and inode, for the MLSx `unique` fact.
    pub dev: u64,
    pub ino: u64,
}

/// One `ls -l` style line, the de-facto LIST format that clients such as lftp parse.
/// Owner and group are shown as `ftp` so that listings do not reveal local account names.
pub fn list_line(e: &Entry, now: i64) -> String {
    let kind = match e.kind {
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::File => '-',
        EntryKind::Other => '?',
    };
    let mut perms = String::with_capacity(9);
    for shift in [6, 3, 0] {
        let bits = (e.mode >> shift) & 7;
        perms.push(if bits & 4 != 0 { 'r' } else { '-' });
        perms.push(if bits & 2 != 0 { 'w' } else { '-' });
        perms.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let c = Civil::from_unix(e.mtime);
    // Like ls: the time of day for dates within the last half year, the year otherwise.
    const HALF_YEAR: i64 = 182 * 86_400;
    let when = if e.mtime > now - HALF_YEAR && e.mtime <= now + 3600 {
        format!("{:02}:{:02}", c.hour, c.minute)
    } else {
        format!(" {}", c.year)
    };
    format!(
        "{kind}{perms} {:>3} ftp      ftp      {:>12} {} {:>2} {:>5} {}",
        e.nlink,
        e.size,
        c.month_abbrev(),
        c.day,
        when,
        e.name
    )
}

/// The facts of an MLSx line, without the name: `type=file;size=3;modify=...;perm=r;`.
/// `kind_name` lets MLSD call the listed directory `cdir`. `writable` says whether this user may
/// change the entry, which decides the `perm` fact.
pub fn mlsx_facts(e: &Entry, kind_name: Option<&str>, writable: bool) -> String {
    let kind = kind_name.unwrap_or(match e.kind {
        EntryKind::Dir => "dir",
        EntryKind::File => "file",
        EntryKind::Symlink => "OS.unix=symlink",
        EntryKind::Other => "OS.unix=special",
    });
    let perm = match (e.kind, writable) {
        (EntryKind::Dir, false) => "el",
        (EntryKind::Dir, true) => "eflcmp",
        (_, false) => "r",
        (_, true) => "rawfd",
    };
    let mut s = format!("type={kind};");
    if e.kind == EntryKind::File {
        s.push_str(&format!("size={};", e.size));
    }
    s.push_str(&format!(
        "modify={};perm={perm};unique={:x}g{:x};UNIX.mode=0{:o};",
        Civil::from_unix(e.mtime).mdtm(),
        e.dev,
        e.ino,
        e.mode & 0o7777
    ));
    s
}

/// An MLSD line (facts, a space, the name) as it goes on the data connection.
pub fn mlsd_line(e: &Entry, kind_name: Option<&str>, writable: bool) -> String {
    format!("{} {}", mlsx_facts(e, kind_name, writable), e.name)
}

/// One parsed MLSx line, for clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlsxLine {
    pub name: String,
    pub kind: Option<String>,
    pub size: Option<u64>,
    pub modify: Option<i64>,
}

/// Parses `fact=value;fact=value; name`. Fact names are case-insensitive (RFC 3659 §7).
pub fn parse_mlsx(line: &str) -> Option<MlsxLine> {
    let line = line.strip_prefix(' ').unwrap_or(line);
    let (facts, name) = line.split_once(' ')?;
    let mut out = MlsxLine {
        name: name.to_string(),
        kind: None,
        size: None,
        modify: None,
    };
    for fact in facts.split(';').filter(|f| !f.is_empty()) {
        let (k, v) = fact.split_once('=')?;
        match k.to_ascii_lowercase().as_str() {
            "type" => out.kind = Some(v.to_ascii_lowercase()),
            "size" => out.size = v.parse().ok(),
            "modify" => out.modify = Civil::parse_mdtm(v).map(|c| c.to_unix()),
            _ => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: EntryKind) -> Entry {
        Entry {
            name: name.into(),
            kind,
            size: 1234,
            mtime: 1_795_340_180,
            mode: 0o644,
            nlink: 1,
            dev: 1,
            ino: 42,
        }
    }

    #[test]
    fn list_line_looks_like_ls() {
        let e = entry("a file.txt", EntryKind::File);
        assert_eq!(
            list_line(&e, 1_795_340_180 + 10),
            "-rw-r--r--   1 ftp      ftp              1234 Nov 22 09:36 a file.txt"
        );
        assert_eq!(
            list_line(&e, 1_795_340_180 + 400 * 86_400),
            "-rw-r--r--   1 ftp      ftp              1234 Nov 22  2026 a file.txt"
        );
    }

    #[test]
    fn mlsx_facts_and_parse_agree() {
        let e = entry("x y", EntryKind::File);
        let line = mlsd_line(&e, None, false);
        assert_eq!(
            line,
            "type=file;size=1234;modify=20261122093620;perm=r;unique=1g2a;UNIX.mode=0644; x y"
        );
        let p = parse_mlsx(&line).unwrap();
        assert_eq!(p.name, "x y");
        assert_eq!(p.size, Some(1234));
        assert_eq!(p.modify, Some(1_795_340_180));
        let d = mlsd_line(&entry("d", EntryKind::Dir), Some("cdir"), true);
        assert!(d.starts_with("type=cdir;modify="), "{d}");
        assert!(d.contains("perm=eflcmp;"), "{d}");
    }
}
