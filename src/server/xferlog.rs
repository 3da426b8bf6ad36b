//! The xferlog transfer log of wu-ftpd and vsftpd (`man 5 xferlog`), which log analysers
//! (awstats, xferstats) read: one line of 14 space-separated fields per transfer.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who moved the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User<'a> {
    Account(&'a str),
    /// With what the user gave as password, the custom for anonymous logins.
    Anonymous(Option<&'a str>),
}

/// One finished transfer, as xferlog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// When it ended.
    pub at: SystemTime,
    pub took: Duration,
    pub host: std::net::IpAddr,
    pub bytes: u64,
    /// Where the file is on disk, as wu-ftpd and vsftpd log it.
    pub path: &'a Path,
    pub ascii: bool,
    /// From the client's point of view, as xferlog has it: `o` outgoing (a download), `i`
    /// incoming.
    pub upload: bool,
    pub user: User<'a>,
    pub complete: bool,
}

impl Entry<'_> {
    /// The line, newline included. Fields never contain spaces (the path's are replaced by
    /// `_`, as vsftpd does), so a reader can split on them.
    pub fn line(&self) -> String {
        let secs = self.took.as_secs_f64().round().max(1.0) as u64;
        let path = one_word(&self.path.to_string_lossy(), usize::MAX);
        let (mode, user) = match self.user {
            User::Account(name) => ('r', one_word(name, usize::MAX)),
            User::Anonymous(Some(id)) if !id.is_empty() => ('a', one_word(id, 64)),
            User::Anonymous(_) => ('a', "*".into()),
        };
        format!(
            "{} {secs} {} {} {path} {} _ {} {mode} {user} ftp 0 * {}\n",
            ctime(self.at),
            self.host,
            self.bytes,
            if self.ascii { 'a' } else { 'b' },
            if self.upload { 'i' } else { 'o' },
            if self.complete { 'c' } else { 'i' },
        )
    }
}

/// `text` as one field: at most `max` characters, blanks and control characters as `_`.
fn one_word(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// `Mon Nov 24 08:30:00 2026`, in UTC as vsftpd writes it by default (the day padded with a
/// space, as C's `ctime`).
fn ctime(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{} {} {day:>2} {h:02}:{m:02}:{s:02} {year}",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
    )
}

/// The open log file, shared by all sessions. A reload opens it again, so a rotated log is
/// followed.
#[derive(Debug)]
pub struct XferLog {
    file: Mutex<std::fs::File>,
}

impl XferLog {
    pub fn open(path: &Path) -> anyhow::Result<XferLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("cannot open the xferlog {}: {e}", path.display()))?;
        Ok(XferLog {
            file: Mutex::new(file),
        })
    }

    /// Appends a line in one write, so lines from sessions never interleave.
    pub fn write(&self, entry: &Entry) {
        let line = entry.line();
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()) {
            tracing::warn!("cannot write the xferlog: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn dates_read_as_ctime_does() {
        // `date -u -d @0`, `@951782400` (a leap day), `@1795854245`.
        assert_eq!(ctime(at(0)), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime(at(951_782_400)), "Tue Feb 29 00:00:00 2000");
        assert_eq!(ctime(at(1_795_854_245)), "Sat Nov 28 08:24:05 2026");
    }

    #[test]
    fn a_line_has_the_fourteen_fields_in_order() {
        let e = Entry {
            at: at(1_795_854_245),
            took: Duration::from_millis(2600),
            host: "198.18.0.2".parse().unwrap(),
            bytes: 1234,
            path: Path::new("/srv/ftp/up/my file.bin"),
            ascii: false,
            upload: true,
            user: User::Account("alice"),
            complete: true,
        };
        assert_eq!(
            e.line(),
            "Sat Nov 28 08:24:05 2026 3 198.18.0.2 1234 /srv/ftp/up/my_file.bin b _ i r alice ftp 0 * c\n"
        );
        let anon = Entry {
            took: Duration::from_millis(10),
            upload: false,
            ascii: true,
            user: User::Anonymous(Some("me at example.org")),
            complete: false,
            ..e
        };
        let line = anon.line();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 18, "5 for the date, then 13");
        assert_eq!(fields[5], "1", "under a second counts as one, as in vsftpd");
        assert_eq!(
            &fields[9..],
            [
                "a",
                "_",
                "o",
                "a",
                "me_at_example.org",
                "ftp",
                "0",
                "*",
                "i"
            ]
        );
        let nothing = Entry {
            user: User::Anonymous(Some("")),
            ..anon
        };
        assert_eq!(nothing.line().split_whitespace().nth(13), Some("*"));
    }
}
