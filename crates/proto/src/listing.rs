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

/// How deep a tree is walked (MLSR on the server, `get -r` on the client): deeper is a loop
/// or a tree nobody should mirror blindly.
pub const TREE_DEPTH: usize = 64;

/// The facts of an MLSx line, without the name: `type=file;size=3;modify=...;perm=r;`.
/// `kind_name` lets MLSD call the listed directory `cdir`. `writable` says whether this user may
/// change the entry, which decides the `perm` fact.
pub fn mlsx_facts(e: &Entry, kind_name: Option<&str>, writable: bool) -> String {
    let mut s = String::with_capacity(96);
    write_facts(&mut s, e, kind_name, writable, None);
    s
}

/// Appends to `out` the facts of an MLSx line that `wanted` names (lower-case fact names, as
/// OPTS MLST keeps them; None: all), in [`mlsx_facts`]'s order. Written in place: a tree's
/// listing formats hundreds of thousands of them, where each fact as its own string cost
/// about half of the server's time to list.
pub fn write_facts(
    out: &mut String,
    e: &Entry,
    kind_name: Option<&str>,
    writable: bool,
    wanted: Option<&[String]>,
) {
    use std::fmt::Write;
    let want = |fact: &str| wanted.is_none_or(|w| w.iter().any(|x| x == fact));
    if want("type") {
        let kind = kind_name.unwrap_or(match e.kind {
            EntryKind::Dir => "dir",
            EntryKind::File => "file",
            EntryKind::Symlink => "OS.unix=symlink",
            EntryKind::Other => "OS.unix=special",
        });
        let _ = write!(out, "type={kind};");
    }
    if e.kind == EntryKind::File && want("size") {
        let _ = write!(out, "size={};", e.size);
    }
    if want("modify") {
        let _ = write!(out, "modify={};", Civil::from_unix(e.mtime));
    }
    if want("perm") {
        let perm = match (e.kind, writable) {
            (EntryKind::Dir, false) => "el",
            (EntryKind::Dir, true) => "eflcmp",
            (_, false) => "r",
            (_, true) => "rawfd",
        };
        let _ = write!(out, "perm={perm};");
    }
    if want("unique") {
        let _ = write!(out, "unique={:x}g{:x};", e.dev, e.ino);
    }
    if want("unix.mode") {
        let _ = write!(out, "UNIX.mode=0{:o};", e.mode & 0o7777);
    }
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

/// Parses a LIST line as Unix `ls -l` (most servers) or DOS/IIS (`11-24-26  11:33AM  <DIR>
/// name`) writes it: name, kind (`file`, `dir`, `symlink`, `other`) and size; no time (LIST
/// leaves out the year of recent files). None for a line that is neither (`total 12`).
pub fn parse_list(line: &str) -> Option<MlsxLine> {
    let words: Vec<(usize, &str)> = line
        .split_whitespace()
        .map(|w| (w.as_ptr() as usize - line.as_ptr() as usize, w))
        .collect();
    let rest = |i: usize| {
        words
            .get(i)
            .map(|&(at, _)| line[at..].trim_end_matches(['\r', '\n']))
    };
    let digits = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
    let entry = |name: &str, kind: &str, size: Option<u64>| {
        (!name.is_empty()).then(|| MlsxLine {
            name: name.to_string(),
            kind: Some(kind.to_string()),
            size,
            modify: None,
        })
    };
    let first = words.first()?.1;
    // DOS: date, time, <DIR> or size, name.
    if first.len() >= 8 && first.as_bytes().get(2) == Some(&b'-') && words.len() >= 4 {
        let (what, name) = (words[2].1, rest(3)?);
        return match what {
            "<DIR>" => entry(name, "dir", None),
            w if digits(w) => entry(name, "file", w.parse().ok()),
            _ => None,
        };
    }
    // Unix: mode, links, owner, [group,] size, month, day, time or year, name.
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    if first.len() < 10 || !"-dlbcps".contains(first.chars().next()?) {
        return None;
    }
    let month = (3..words.len().saturating_sub(3)).find(|&i| {
        MONTHS.contains(&words[i].1.to_ascii_lowercase().as_str())
            && digits(words[i - 1].1)
            && digits(words[i + 1].1)
            && (words[i + 2].1.contains(':') || digits(words[i + 2].1))
    })?;
    let size = words[month - 1].1.parse().ok();
    let name = rest(month + 3)?;
    match first.as_bytes()[0] {
        b'-' => entry(name, "file", size),
        b'd' => entry(name, "dir", None),
        b'l' => entry(name.split(" -> ").next().unwrap_or(name), "symlink", None),
        _ => entry(name, "other", None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the facts OPTS MLST chose, each as the whole line has it and in its order, for
    /// every kind of entry: what a client that asked for `type;size;modify;` parses.
    #[test]
    fn chosen_facts_are_the_full_lines_facts_filtered() {
        let entry = |kind, name: &str| Entry {
            name: name.into(),
            kind,
            size: 4096,
            mtime: 1_795_940_714,
            mode: 0o640,
            nlink: 1,
            dev: 0x801,
            ino: 77,
        };
        let choices: [&[&str]; 5] = [
            &["type", "size", "modify"],
            &["unix.mode"],
            &["perm", "type"],
            &[],
            &["type", "size", "modify", "perm", "unique", "unix.mode"],
        ];
        for kind in [
            EntryKind::File,
            EntryKind::Dir,
            EntryKind::Symlink,
            EntryKind::Other,
        ] {
            for writable in [false, true] {
                let e = entry(kind, "f");
                let all = mlsx_facts(&e, None, writable);
                assert!(all.contains("modify=20261129"), "{all}");
                for chosen in choices {
                    let wanted: Vec<String> = chosen.iter().map(|s| s.to_string()).collect();
                    let mut got = String::new();
                    write_facts(&mut got, &e, None, writable, Some(&wanted));
                    let expected: String = all
                        .split_terminator(';')
                        .filter(|f| {
                            let key = f.split('=').next().unwrap_or("").to_ascii_lowercase();
                            wanted.contains(&key)
                        })
                        .map(|f| format!("{f};"))
                        .collect();
                    assert_eq!(got, expected, "{kind:?} {chosen:?}");
                }
            }
        }
        let mut cdir = String::new();
        write_facts(
            &mut cdir,
            &entry(EntryKind::Dir, "."),
            Some("cdir"),
            false,
            None,
        );
        assert!(cdir.starts_with("type=cdir;modify="), "{cdir}");
    }

    #[test]
    fn list_lines_of_unix_and_dos_servers_parse() {
        let p = |l: &str| parse_list(l).map(|m| (m.name, m.kind.unwrap_or_default(), m.size));
        let f = |n: &str, k: &str, s: Option<u64>| Some((n.to_string(), k.to_string(), s));
        // vsftpd, ProFTPD, braid serve's own LIST, and a server without a group column.
        assert_eq!(
            p("-rw-r--r--    1 0        0        20000000 Nov 24 11:33 f.bin"),
            f("f.bin", "file", Some(20_000_000))
        );
        assert_eq!(
            p("drwxr-xr-x   2 ftp      ftp          4096 Nov 22  2026 a dir"),
            f("a dir", "dir", None)
        );
        assert_eq!(
            p("lrwxrwxrwx 1 owner 11 Jan  1 00:00 up -> ../../etc"),
            f("up", "symlink", None)
        );
        assert_eq!(
            p("-rw-r--r--   1 ftp      ftp              1234 Nov 22 09:36 a file.txt\r"),
            f("a file.txt", "file", Some(1234))
        );
        // A name that looks like a date stays whole.
        assert_eq!(
            p("-rw-r--r-- 1 u g 5 Mar 3 2020 Dec 1 10:00 x"),
            f("Dec 1 10:00 x", "file", Some(5))
        );
        // IIS in DOS style.
        assert_eq!(
            p("11-24-26  11:33AM       <DIR>          pub"),
            f("pub", "dir", None)
        );
        assert_eq!(
            p("11-24-26  11:33AM             20000000 f b.bin"),
            f("f b.bin", "file", Some(20_000_000))
        );
        for junk in ["total 12", "", "drwx", "-rw-r--r-- 1 u g x Nov 1 10:00 y"] {
            assert_eq!(p(junk), None, "{junk}");
        }
        // The line braid serve writes reads back as what it describes.
        let e = entry("x y", EntryKind::File);
        assert_eq!(
            p(&list_line(&e, 1_795_340_180)),
            f("x y", "file", Some(1234))
        );
    }

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
