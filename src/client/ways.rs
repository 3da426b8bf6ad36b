//! The way round a firewall that `braid cp`'s data connections found to a host, kept between
//! runs: the next run to that host takes it at once, instead of waiting for its straight
//! connection to time out first (5 s), for [`REMEMBERED_FOR`]. After that the straight way is
//! tried again (a firewall opened since is found). The file (`ways` in braid's state
//! directory) holds a line per host: `DESTINATION<TAB>WAY<TAB>UNIX-SECONDS`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The ways a data connection can take, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Way {
    Straight = 0,
    /// The far side opens it.
    Back = 1,
    /// Through ssh's channel.
    Channel = 2,
}

impl Way {
    /// As `--json`'s `data_route` says it.
    pub fn name(self) -> &'static str {
        match self {
            Way::Straight => "direct",
            Way::Back => "connect-back",
            Way::Channel => "ssh-channel",
        }
    }

    /// The way [`Way::name`] names.
    pub fn named(name: &str) -> Option<Way> {
        [Way::Straight, Way::Back, Way::Channel]
            .into_iter()
            .find(|w| w.name() == name)
    }

    pub(super) fn from_u8(v: u8) -> Way {
        match v {
            0 => Way::Straight,
            1 => Way::Back,
            _ => Way::Channel,
        }
    }
}

/// How long a way found is taken without trying straight first.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(24 * 3600);

/// Where the ways are kept: `ways` in braid's state directory, if there is one.
pub fn file() -> Option<PathBuf> {
    super::records::state_dir().map(|d| d.join("ways"))
}

/// The way found to `destination` within [`REMEMBERED_FOR`] of `now`, per the file at `path`.
pub fn recall(path: &Path, destination: &str, now: SystemTime) -> Option<Way> {
    let text = std::fs::read_to_string(path).ok()?;
    let now = unix(now);
    parse(&text)
        .into_iter()
        .find(|(d, _, at)| d == destination && now.saturating_sub(*at) < REMEMBERED_FOR.as_secs())
        .map(|(_, way, _)| way)
}

/// Keeps `way` for `destination` in the file at `path` (replacing what it held for it, and
/// dropping lines older than [`REMEMBERED_FOR`]), written whole at once.
pub fn remember(path: &Path, destination: &str, way: Way, now: SystemTime) -> std::io::Result<()> {
    let now = unix(now);
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<(String, Way, u64)> = parse(&old)
        .into_iter()
        .filter(|(d, _, at)| d != destination && now.saturating_sub(*at) < REMEMBERED_FOR.as_secs())
        .collect();
    lines.push((destination.to_string(), way, now));
    super::records::write_atomically(path, format(&lines).as_bytes())
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The file's lines; ones it cannot read (another version's, damaged) are left out.
fn parse(text: &str) -> Vec<(String, Way, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (d, w, t) = (f.next()?, f.next()?, f.next()?);
            let way = Way::named(w)?;
            (!d.is_empty() && f.next().is_none()).then_some((d.to_string(), way, t.parse().ok()?))
        })
        .collect()
}

fn format(lines: &[(String, Way, u64)]) -> String {
    lines
        .iter()
        // A destination with a tab or a line break could not be read back: not kept.
        .filter(|(d, _, _)| !d.contains(['\t', '\n', '\r']))
        .map(|(d, w, t)| format!("{d}\t{}\t{t}\n", w.name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_way_found_is_recalled_for_a_day_for_its_host_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/ways");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(recall(&path, "ann@box", t0), None);
        remember(&path, "ann@box", Way::Back, t0).unwrap();
        remember(&path, "bob@far", Way::Channel, t0).unwrap();
        let hour = t0 + Duration::from_secs(3600);
        assert_eq!(recall(&path, "ann@box", hour), Some(Way::Back));
        assert_eq!(recall(&path, "bob@far", hour), Some(Way::Channel));
        assert_eq!(recall(&path, "box", hour), None);
        // Found again: the newer way replaces the older.
        remember(&path, "ann@box", Way::Channel, hour).unwrap();
        assert_eq!(recall(&path, "ann@box", hour), Some(Way::Channel));
        let lines = std::fs::read_to_string(&path).unwrap();
        assert_eq!(lines.lines().count(), 2, "{lines}");
        // A day on, the straight way is tried again; old lines go at the next write.
        let later = hour + REMEMBERED_FOR;
        assert_eq!(recall(&path, "ann@box", later), None);
        remember(&path, "cy@x", Way::Back, later).unwrap();
        let lines = std::fs::read_to_string(&path).unwrap();
        assert_eq!(lines, format!("cy@x\tconnect-back\t{}\n", unix(later)));
    }

    #[test]
    fn lines_it_cannot_read_are_left_out() {
        let text = "a\tconnect-back\t5\nb\tsideways\t5\n\tdirect\t5\nc\tssh-channel\tsoon\nd\tdirect\t7\textra\n";
        assert_eq!(parse(text), vec![("a".to_string(), Way::Back, 5)]);
        assert_eq!(format(&[("x\ty".into(), Way::Back, 1)]), "");
    }
}
