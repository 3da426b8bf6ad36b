//! scp's remote wildcards: `braid cp 'host:logs/*.gz' .` fetches every file of `logs` whose
//! name matches, as scp does. The far side's directories are listed (on one session of their
//! own) and the names matched here, with a shell's rules: `*`, `?` and `[...]` within one
//! name, and a leading dot matched only by a dot (`*` leaves hidden files out).

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::listing::{ListEntry, list_dir};
use super::names::unsafe_name;
use super::sessions::session;
use super::url::Target;

/// Whether the last part of `path` holds a wildcard (a directory's part is taken as it is).
fn has_wildcard(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or(path);
    last.contains(['*', '?', '['])
}

/// `targets` with each that holds a wildcard replaced by those it stands for, in name order:
/// files, and with `recursive` directories too. One matching nothing is an error, as a
/// missing file is. Without wildcards, no session.
pub fn expand(targets: Vec<Target>, opts: &Options, recursive: bool) -> Result<Vec<Target>> {
    let Some(first) = targets.iter().find(|t| has_wildcard(&t.path)) else {
        return Ok(targets);
    };
    let mut c = session(first, opts, None)?;
    let mut out = Vec::new();
    for t in targets {
        if has_wildcard(&t.path) {
            out.extend(expand_one(&mut c, &t, recursive)?);
        } else {
            out.push(t);
        }
    }
    c.quit();
    Ok(out)
}

/// The targets one wildcard stands for, from its directory's listing.
fn expand_one(c: &mut Control, target: &Target, recursive: bool) -> Result<Vec<Target>> {
    let (dir, pattern) = split(&target.path);
    let names = matching(&list_dir(c, dir)?, pattern, recursive)?;
    if names.is_empty() {
        return Err(ClientError::NoMatch(format!(
            "{}:{}",
            target.host, target.path
        )));
    }
    Ok(names
        .into_iter()
        .map(|name| Target {
            path: format!("{}{name}", prefix(dir)),
            ..target.clone()
        })
        .collect())
}

/// The directory to list and the pattern: `logs/*.gz` is (`logs`, `*.gz`), `*.gz` (the home
/// directory, ``), `/*.gz` (`/`).
fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some(("", pattern)) => ("/", pattern),
        Some((dir, pattern)) => (dir, pattern),
        None => ("", path),
    }
}

/// What a name in `dir` is prefixed with to name it there.
fn prefix(dir: &str) -> String {
    match dir {
        "" => String::new(),
        "/" => "/".into(),
        d => format!("{d}/"),
    }
}

/// The names of `entries` that `pattern` matches and that are files (or, `recursive`,
/// directories), sorted; names no path may take (`..`, a slash) are left out.
fn matching(entries: &[ListEntry], pattern: &str, recursive: bool) -> Result<Vec<String>> {
    let pattern = glob::Pattern::new(pattern)
        .map_err(|e| ClientError::Usage(format!("{pattern}: not a wildcard pattern ({e})")))?;
    let shell = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let mut names: Vec<String> = entries
        .iter()
        .filter(|e| match e.kind.as_deref() {
            Some("file") => true,
            Some("dir") => recursive,
            _ => false,
        })
        .map(|e| e.name.clone())
        .filter(|n| unsafe_name(n).is_none() && pattern.matches_with(n, shell))
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::client::testing::listed as entry;

    #[test]
    fn wildcards_match_names_as_a_shell_does() {
        let entries = [
            entry("b.gz", "file"),
            entry("a.gz", "file"),
            entry(".hidden.gz", "file"),
            entry("c.txt", "file"),
            entry("d.gz", "dir"),
            entry("..", "dir"),
            entry("e.gz", "pdir"),
        ];
        let got = |p: &str, r: bool| matching(&entries, p, r).unwrap();
        assert_eq!(got("*.gz", false), ["a.gz", "b.gz"]);
        assert_eq!(got("*.gz", true), ["a.gz", "b.gz", "d.gz"]);
        assert_eq!(got(".*.gz", false), [".hidden.gz"]);
        assert_eq!(got("?.txt", false), ["c.txt"]);
        assert_eq!(got("[ab].gz", false), ["a.gz", "b.gz"]);
        assert!(got("*.zip", false).is_empty());
        assert!(matching(&entries, "[", false).is_err());
    }

    #[test]
    fn a_pattern_is_split_from_its_directory() {
        assert_eq!(split("logs/*.gz"), ("logs", "*.gz"));
        assert_eq!(split("*.gz"), ("", "*.gz"));
        assert_eq!(split("/*.gz"), ("/", "*.gz"));
        assert_eq!(split("/var/log/*.gz"), ("/var/log", "*.gz"));
        assert_eq!(prefix(""), "");
        assert_eq!(prefix("/"), "/");
        assert_eq!(prefix("logs"), "logs/");
        assert!(has_wildcard("logs/*.gz") && has_wildcard("a?") && has_wildcard("[ab]"));
        assert!(!has_wildcard("lo*gs/f.gz") && !has_wildcard("plain"));
    }
}
