//! Many small files as one MODE E transfer (braid's `BNDL`, then `RBND` to fetch them or
//! `SBND` to store them; FEAT `BRAID-BUNDLE`, `BRAID-BUNDLE 2` with `SBND`).
//!
//! A tree of small files costs a RETR, its reply, an open for CKSM and a transfer's set-up per
//! file; at 4 KiB a file that per-file work, not the bytes, sets the pace (10,000 files took
//! braid about twice rsync's time, which streams the tree with no exchange per file). A
//! bundle lays its files end to end in one virtual byte range, in the order the client named
//! them, and moves that range as one file: blocks carry their offset as always, any
//! connection takes the next, and one checksum covers it all. The client names each file
//! with the size its listing gave; the server sends a file only at that size, so both ends
//! know the layout before a byte moves, and a file that changed since fails the bundle (the
//! client then takes its files one by one).

use crate::checksum;

/// Files one bundle may name: a client sends a few thousand at a time, and the server keeps
/// their names in memory until RBND.
pub const MAX_FILES: usize = 100_000;

/// Bytes of names one bundle may hold (with [`MAX_FILES`], what a session can make the
/// server keep: long paths by the thousand would otherwise be hundreds of megabytes).
pub const MAX_NAME_BYTES: usize = 16 << 20;

/// Files one `SBND` may store: the server holds each one's partial open (and locked) until
/// the bundle is whole and checked.
pub const STORE_MOST: usize = 4096;

/// A file in a bundle: its size, its path as the client names it and, for `SBND`, the
/// modification time it takes once stored (Unix seconds; a tree's times cost no MFMT each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub size: u64,
    pub path: String,
    pub mtime: Option<i64>,
}

/// `BNDL`'s argument: `SIZE:PATH` or `SIZE@MTIME:PATH` items separated by spaces, each path
/// percent-encoded where it holds `%`, a space or a control character (FTP paths may hold
/// spaces; a CR or LF could not be sent anyway).
pub fn encode(files: &[Named]) -> String {
    let mut out = String::new();
    for f in files {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&f.size.to_string());
        if let Some(t) = f.mtime {
            out.push_str(&format!("@{t}"));
        }
        out.push(':');
        for ch in f.path.chars() {
            if ch == '%' || ch.is_whitespace() || ch.is_control() {
                let mut buf = [0u8; 4];
                for b in ch.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            } else {
                out.push(ch);
            }
        }
    }
    out
}

/// `files` cut into runs whose `BNDL` argument is at most `max` bytes each (a command line
/// has a limit), in order; a file longer than `max` alone is a run of its own.
pub fn runs(files: &[Named], max: usize) -> Vec<&[Named]> {
    let mut out = Vec::new();
    let (mut start, mut len) = (0, 0);
    for (i, f) in files.iter().enumerate() {
        let item = encode(std::slice::from_ref(f)).len();
        if i > start && len + 1 + item > max {
            out.push(&files[start..i]);
            (start, len) = (i, 0);
        }
        len += item + usize::from(i > start);
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// Reads `BNDL`'s argument back; an error names what is wrong with it.
pub fn decode(arg: &str) -> Result<Vec<Named>, String> {
    arg.split(' ')
        .filter(|w| !w.is_empty())
        .map(|item| {
            let (head, path) = item
                .split_once(':')
                .ok_or_else(|| format!("{item:?}: expected SIZE:PATH"))?;
            let (size, mtime) = match head.split_once('@') {
                Some((size, t)) => (size, Some(t)),
                None => (head, None),
            };
            let size = size
                .parse()
                .map_err(|_| format!("{item:?}: the size is not a number"))?;
            let mtime = mtime
                .map(|t| t.parse())
                .transpose()
                .map_err(|_| format!("{item:?}: the time is not a number of seconds"))?;
            let path = unescape(path).ok_or_else(|| format!("{item:?}: bad percent-encoding"))?;
            if path.is_empty() {
                return Err(format!("{item:?}: no path"));
            }
            Ok(Named { size, path, mtime })
        })
        .collect()
}

fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where each file of a bundle lies in its virtual byte range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// Each file's first byte; the files lie in order, end to end.
    starts: Vec<u64>,
    total: u64,
}

/// One file's share of a range of the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The file's index in the bundle.
    pub file: usize,
    /// Where in the file.
    pub at: u64,
    /// Where in the range asked for, and how long.
    pub from: usize,
    pub len: usize,
}

impl Layout {
    pub fn new(sizes: impl IntoIterator<Item = u64>) -> Layout {
        let mut starts = Vec::new();
        let mut total = 0u64;
        for size in sizes {
            starts.push(total);
            total = total.saturating_add(size);
        }
        Layout { starts, total }
    }

    /// The bytes of all files together.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn files(&self) -> usize {
        self.starts.len()
    }

    pub fn size(&self, file: usize) -> u64 {
        let end = self.starts.get(file + 1).copied().unwrap_or(self.total);
        end - self.starts[file]
    }

    /// The files' shares of `len` bytes at `offset`, in order (empty files have none).
    pub fn pieces(&self, offset: u64, len: usize) -> impl Iterator<Item = Piece> + '_ {
        let end = offset.saturating_add(len as u64).min(self.total);
        // The last file that starts at or before `offset`: empty files before it share its
        // start and hold nothing.
        let first = self
            .starts
            .partition_point(|&s| s <= offset)
            .saturating_sub(1);
        (first..self.starts.len())
            .map_while(move |file| {
                let start = self.starts[file];
                (start < end || file == first).then_some(file)
            })
            .filter_map(move |file| {
                let start = self.starts[file];
                let stop = self
                    .starts
                    .get(file + 1)
                    .copied()
                    .unwrap_or(self.total)
                    .min(end);
                let from = start.max(offset);
                (from < stop).then(|| Piece {
                    file,
                    at: from - start,
                    from: (from - offset) as usize,
                    len: (stop - from) as usize,
                })
            })
    }
}

/// The 226 that ends a bundle names the checksum of all it sent, so that no second read of
/// the files is needed: `226 Transfer complete; XXH3 <hex>.`
pub fn ended(sum: &str) -> String {
    format!("Transfer complete; {} {sum}.", checksum::NAME)
}

/// The checksum in a bundle's 226, if it names one.
pub fn sum_in(text: &str) -> Option<String> {
    let (_, rest) = text.split_once(&format!("; {} ", checksum::NAME))?;
    let sum = rest.trim_end_matches('.').trim();
    (!sum.is_empty() && sum.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sum.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn named(size: u64, path: &str) -> Named {
        Named {
            size,
            path: path.into(),
            mtime: None,
        }
    }

    #[test]
    fn names_with_spaces_percents_and_controls_come_back_as_they_were() {
        let files = vec![
            named(4096, "a/b c.txt"),
            named(0, "100%/x\ty"),
            named(7, "ünï/cödé"),
        ];
        let wire = encode(&files);
        assert!(
            !wire.contains('\t') && wire.matches(' ').count() == 2,
            "{wire}"
        );
        assert_eq!(decode(&wire).unwrap(), files);
        // SBND's files carry their time; a path may hold `@` and `:` as it likes.
        let timed = vec![Named {
            mtime: Some(1_764_400_000),
            ..named(3, "a@b:c")
        }];
        assert_eq!(encode(&timed), "3@1764400000:a@b:c");
        assert_eq!(decode(&encode(&timed)).unwrap(), timed);
        assert!(decode("3@x:a").is_err());
        assert!(decode("12").is_err());
        assert!(decode("x:a").is_err());
        assert!(decode("1:%G0").is_err());
        assert!(decode("1:").is_err());
    }

    #[test]
    fn runs_stay_under_their_limit_and_name_every_file_in_order() {
        let files: Vec<Named> = (0..500)
            .map(|i| named(i, &format!("dir/file {i}")))
            .collect();
        let runs = runs(&files, 1000);
        assert!(runs.len() > 5);
        assert!(
            runs.iter().all(|r| encode(r).len() <= 1000),
            "{:?}",
            runs.iter().map(|r| encode(r).len()).max()
        );
        assert!(runs.iter().any(|r| encode(r).len() > 950));
        let back: Vec<Named> = runs.concat();
        assert_eq!(back, files);
    }

    #[test]
    fn a_range_is_cut_at_file_ends_and_empty_files_get_nothing() {
        let layout = Layout::new([10, 0, 5, 0, 0, 20]);
        assert_eq!(layout.total(), 35);
        let got: Vec<Piece> = layout.pieces(8, 10).collect();
        assert_eq!(
            got,
            vec![
                Piece {
                    file: 0,
                    at: 8,
                    from: 0,
                    len: 2
                },
                Piece {
                    file: 2,
                    at: 0,
                    from: 2,
                    len: 5
                },
                Piece {
                    file: 5,
                    at: 0,
                    from: 7,
                    len: 3
                },
            ]
        );
        assert_eq!(
            layout.pieces(15, 100).collect::<Vec<_>>(),
            vec![Piece {
                file: 5,
                at: 0,
                from: 0,
                len: 20
            }]
        );
        assert_eq!(layout.pieces(35, 10).count(), 0);
        assert_eq!(layout.size(1), 0);
        assert_eq!(layout.size(5), 20);
    }

    #[test]
    fn the_sum_in_a_bundles_end_is_read_back() {
        assert_eq!(sum_in(&ended("00ff")), Some("00ff".into()));
        assert_eq!(sum_in("Transfer complete."), None);
    }

    proptest! {
        /// Every byte of the range belongs to exactly one piece, in order, inside its file.
        #[test]
        fn pieces_tile_any_range(sizes in proptest::collection::vec(0u64..50, 1..30),
                                 offset in 0u64..1500, len in 0usize..400) {
            let layout = Layout::new(sizes.iter().copied());
            let mut next = 0usize;
            for p in layout.pieces(offset, len) {
                prop_assert_eq!(p.from, next);
                prop_assert!(p.len > 0 && p.at + p.len as u64 <= sizes[p.file]);
                next += p.len;
            }
            let want = layout.total().saturating_sub(offset).min(len as u64) as usize;
            prop_assert_eq!(next, want);
        }

        #[test]
        fn any_names_round_trip(paths in proptest::collection::vec("[^\r\n\0]{1,20}", 1..10)) {
            let files: Vec<Named> = paths.iter().enumerate().map(|(i, p)| named(i as u64, p)).collect();
            prop_assert_eq!(decode(&encode(&files)).unwrap(), files);
        }
    }
}
