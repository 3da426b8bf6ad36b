//! The route a file's data takes, chosen once per file from what the server offers and what
//! the user asked, then taken: MODE E blocks over parallel connections (a braid or GridFTP
//! server), ranges on several sessions (`-n N` against a plain FTP server), or one stream-mode
//! connection. The choice itself is pure ([`Route::download`], [`Route::upload`]); new routes
//! slot in beside these.

use super::block_put::Upload;
use super::control::Control;
use super::error::{ClientError, Result};
use super::job::{Dest, Held, Source, part_path, refuse_directory_url};
use super::peer::Peer;
use super::records::{Sidecar, UploadRecord};
use super::summary::Summary;
use super::url::Target;
use super::{Options, segments, stream, striped};
use super::{block_get, block_put};
use braid_proto::ranges::RangeSet;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// MODE E over parallel data connections, blocks at their offsets.
    Blocks(Peer),
    /// MODE E from or to a braid front end's data nodes, each moving its stripes.
    Striped,
    /// Ranges of the file, each on a stream-mode session of its own (as lftp's `pget -n`).
    Segments(usize),
    /// One stream-mode data connection: any FTP server.
    Stream,
}

/// What a download's route depends on.
#[derive(Debug, Clone, Copy)]
pub struct DownloadFacts {
    /// The server's kind of MODE E, if it offers one this session may use.
    pub peer: Option<Peer>,
    /// What SIZE said.
    pub size: Option<u64>,
    /// The download goes into a file (not standard output or /dev/null).
    pub to_file: bool,
    /// The server offers REST STREAM.
    pub rest: bool,
    /// `--resume` finds a record of ranges beside the partial (a segmented download's: it
    /// may have holes, and resumes in ranges).
    pub recorded_ranges: bool,
    /// A braid front end offers data nodes (and the data may go clear).
    pub striped: bool,
}

impl Route {
    /// The route of a download: MODE E wherever the server offers it; `-n N` against any other
    /// server cuts a file big enough into ranges (and a partial fetched in ranges resumes
    /// that way); else one stream-mode connection.
    pub fn download(f: DownloadFacts, opts: &Options) -> Result<Route> {
        // Striped into a file of known size, in the foreground (background mode steers one
        // path, and the nodes have one each).
        if f.striped && f.to_file && f.size.is_some() && opts.background.is_none() {
            return Ok(Route::Striped);
        }
        if let Some(peer) = f.peer {
            return Ok(Route::Blocks(peer));
        }
        let Some(size) = f.size.filter(|_| f.to_file) else {
            return Ok(Route::Stream);
        };
        let n = opts.streams.unwrap_or(1) as usize;
        let worth = n > 1 && size >= 2 * segments::MIN_SEGMENT && f.rest;
        if !(worth || f.recorded_ranges) {
            return Ok(Route::Stream);
        }
        if opts.background.is_some() {
            return Err(ClientError::Usage(format!(
                "--background against a server without MODE E steers one connection: {}",
                if f.recorded_ranges {
                    "this partial was fetched in ranges and resumes that way; run again without --background"
                } else {
                    "drop -n"
                }
            )));
        }
        Ok(Route::Segments(n))
    }

    /// The route of an upload: MODE E where the server offers it and what it holds of the
    /// file is known (`held`: nothing, or a record of an earlier MODE E upload); else one
    /// stream-mode connection.
    pub fn upload(peer: Option<Peer>, held: Option<&RangeSet>, striped: bool) -> Route {
        match (peer, held) {
            (Some(_), Some(_)) if striped => Route::Striped,
            (Some(peer), Some(_)) => Route::Blocks(peer),
            _ => Route::Stream,
        }
    }
}

/// Downloads one file on an open session. A failure that leaves a new, empty `DEST.part`
/// removes it again.
pub fn get_on(c: &mut Control, target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    let part = match dest {
        Dest::File(p) => Some(part_path(p)),
        Dest::Stdout | Dest::Null => None,
    };
    let existed = part.as_ref().is_some_and(|p| p.exists());
    let result = get_file(c, target, dest, opts)
        .map(|s| c.with_data_route(s))
        .map_err(|e| {
            let fix = "add -r to fetch it";
            directory_hint(c, &target.path, e, fix)
        });
    if result.is_err()
        && !existed
        && let Some(p) = part
        && std::fs::metadata(&p).is_ok_and(|m| m.len() == 0)
    {
        let _ = std::fs::remove_file(&p);
        Sidecar::beside(&p, "", None).remove();
    }
    result
}

/// SIZE, the route, and the download by it.
fn get_file(c: &mut Control, target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    refuse_directory_url(target)?;
    let size = c.size(&target.path)?.size();
    let path = match dest {
        Dest::File(p) => Some(p.as_path()),
        _ => None,
    };
    let facts = DownloadFacts {
        peer: Peer::of(c),
        size,
        to_file: path.is_some(),
        rest: c.has_feature("REST"),
        recorded_ranges: opts.resume
            && path.is_some_and(|p| Sidecar::beside(&part_path(p), "", None).exists()),
        striped: striped::offered(c).is_some(),
    };
    let route = Route::download(facts, opts)?;
    if !matches!(route, Route::Blocks(_) | Route::Striped) {
        stream::explain(opts);
    }
    match (route, path, size) {
        (Route::Blocks(peer), ..) => block_get::get(c, peer, target, dest, size, opts),
        (Route::Striped, _, Some(size)) => {
            let peer = striped::offered(c).unwrap_or(Peer::Braid);
            striped::get(c, peer, target, dest, size, opts)
        }
        (Route::Segments(n), Some(path), Some(size)) => {
            segments::get(c, target, path, size, n, opts)
        }
        _ => stream::get(c, target, dest, size, opts),
    }
}

/// Uploads one file on an open session.
pub fn put_on(
    c: &mut Control,
    local: &Path,
    target: &Target,
    opts: &Options,
    held: Held,
) -> Result<Summary> {
    let src = Source::open(local, target)?;
    put_source(c, &src, opts, held)
        .map(|s| c.with_data_route(s))
        .map_err(|e| {
            let fix = "end the URL with / to put the file into it";
            directory_hint(c, &src.target.path, e, fix)
        })
}

/// Uploads one file on an open session as `scp` and `cp` do: a target the server holds as a
/// directory takes the file under its own name, with or without its final `/` (found when
/// the server refuses the path, so an upload to a file's name costs no round trip more).
pub fn put_into_on(
    c: &mut Control,
    local: &Path,
    target: &Target,
    opts: &Options,
    held: Held,
) -> Result<Summary> {
    if target.path.is_empty() || target.path.ends_with('/') {
        return put_on(c, local, target, opts, held);
    }
    let src = Source::open(local, target)?;
    match put_source(c, &src, opts, held) {
        Ok(s) => Ok(c.with_data_route(s)),
        Err(e) if refused_as_directory(c, &target.path, &e) => {
            let into = Target {
                path: format!("{}/", target.path),
                ..target.clone()
            };
            put_on(c, local, &into, opts, held)
        }
        Err(e) => Err(e),
    }
}

/// What the server holds of the file (a record of an earlier MODE E upload, or nothing), the
/// route, and the upload by it.
fn put_source(c: &mut Control, src: &Source, opts: &Options, held: Held) -> Result<Summary> {
    let peer = Peer::of(c);
    let record = UploadRecord::new(&src.path, &src.meta, &src.target.host, &src.target.path);
    let have = match held {
        Held::Nothing => Some(RangeSet::new()),
        Held::Recorded => Some(record.load().unwrap_or_default()),
        Held::RecordedOrSize => record.load(),
    };
    let striped = striped::offered(c).filter(|_| opts.background.is_none());
    match (Route::upload(peer, have.as_ref(), striped.is_some()), have) {
        (route @ (Route::Blocks(_) | Route::Striped), Some(have)) => {
            let up = Upload {
                file: &src.file,
                len: src.size(),
                record,
                have,
            };
            let mut s = match route {
                Route::Blocks(peer) => block_put::put(c, peer, up, &src.target, opts)?,
                _ => striped::put(c, striped.unwrap_or(Peer::Braid), up, &src.target, opts)?,
            };
            s.local = src.name();
            Ok(s)
        }
        _ => {
            stream::explain(opts);
            if peer.is_some() {
                // No record of a MODE E upload: whatever the server holds came in stream mode
                // (another tool, or an older braid), so its length says what it holds.
                eprintln!(
                    "braid: no record of an earlier MODE E upload of {} ({}); continuing in stream mode from the size the server reports",
                    src.name(),
                    record.location()
                );
            }
            stream::put(c, src, opts, held == Held::RecordedOrSize)
        }
    }
}

/// A refusal of a path that turns out to be a directory on the server (MLST says so) names
/// that, and `fix`; other errors pass as they are.
fn directory_hint(c: &mut Control, path: &str, e: ClientError, fix: &str) -> ClientError {
    if !refused_as_directory(c, path, &e) {
        return e;
    }
    match e {
        ClientError::Remote { what, reply } => ClientError::Remote {
            what: format!("{what} ({path} is a directory on the server: {fix})"),
            reply,
        },
        e => e,
    }
}

/// Whether `e` is the server refusing `path` because it is a directory there (MLST says so,
/// asked only after a refusal).
fn refused_as_directory(c: &mut Control, path: &str, e: &ClientError) -> bool {
    matches!(e, ClientError::Remote { reply, .. } if (500..600).contains(&reply.code))
        && c.in_step()
        && c.is_directory(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn facts(peer: Option<Peer>, size: Option<u64>) -> DownloadFacts {
        DownloadFacts {
            peer,
            size,
            to_file: true,
            rest: true,
            recorded_ranges: false,
            striped: false,
        }
    }

    fn n(streams: u32) -> Options {
        Options {
            streams: Some(streams),
            ..Options::default()
        }
    }

    #[test]
    fn a_server_with_mode_e_always_gets_blocks() {
        for peer in [Peer::Braid, Peer::GridFtp] {
            for o in [Options::default(), n(1), n(8)] {
                let r = Route::download(facts(Some(peer), Some(100 * MIB)), &o);
                assert_eq!(r.ok(), Some(Route::Blocks(peer)));
            }
        }
    }

    #[test]
    fn a_plain_server_gets_ranges_only_for_n_and_a_file_big_enough() {
        let big = Some(100 * MIB);
        assert_eq!(
            Route::download(facts(None, big), &n(4)).ok(),
            Some(Route::Segments(4))
        );
        // One stream asked, or left to braid: one connection.
        assert_eq!(
            Route::download(facts(None, big), &n(1)).ok(),
            Some(Route::Stream)
        );
        assert_eq!(
            Route::download(facts(None, big), &Options::default()).ok(),
            Some(Route::Stream)
        );
        // Too small for two ranges, size unknown, no REST, or not into a file.
        let small = Some(2 * segments::MIN_SEGMENT - 1);
        assert_eq!(
            Route::download(facts(None, small), &n(4)).ok(),
            Some(Route::Stream)
        );
        assert_eq!(
            Route::download(facts(None, None), &n(4)).ok(),
            Some(Route::Stream)
        );
        let no_rest = DownloadFacts {
            rest: false,
            ..facts(None, big)
        };
        assert_eq!(Route::download(no_rest, &n(4)).ok(), Some(Route::Stream));
        let to_stdout = DownloadFacts {
            to_file: false,
            ..facts(None, big)
        };
        assert_eq!(Route::download(to_stdout, &n(4)).ok(), Some(Route::Stream));
    }

    #[test]
    fn a_partial_fetched_in_ranges_resumes_in_ranges_and_refuses_background() {
        let holes = DownloadFacts {
            recorded_ranges: true,
            ..facts(None, Some(10 * MIB))
        };
        assert_eq!(Route::download(holes, &n(1)).ok(), Some(Route::Segments(1)));
        let bg = Options {
            background: Some(std::time::Duration::from_millis(5)),
            ..n(1)
        };
        let e = Route::download(holes, &bg).expect_err("background cannot steer ranges");
        assert!(e.to_string().contains("without --background"), "{e}");
        let e = Route::download(
            facts(None, Some(10 * MIB)),
            &Options {
                streams: Some(4),
                ..bg
            },
        )
        .expect_err("background with -n");
        assert!(e.to_string().contains("drop -n"), "{e}");
    }

    #[test]
    fn an_upload_takes_blocks_only_when_what_the_server_holds_is_known() {
        let none = RangeSet::new();
        assert_eq!(
            Route::upload(Some(Peer::Braid), Some(&none), false),
            Route::Blocks(Peer::Braid)
        );
        assert_eq!(
            Route::upload(Some(Peer::GridFtp), Some(&none), false),
            Route::Blocks(Peer::GridFtp)
        );
        // --resume without a record: the server's size says what it holds, in stream mode.
        assert_eq!(Route::upload(Some(Peer::Braid), None, false), Route::Stream);
        assert_eq!(Route::upload(None, Some(&none), false), Route::Stream);
        // A braid front end with data nodes stripes what it may hold in blocks.
        assert_eq!(
            Route::upload(Some(Peer::Braid), Some(&none), true),
            Route::Striped
        );
        assert_eq!(Route::upload(Some(Peer::Braid), None, true), Route::Stream);
    }

    #[test]
    fn a_striped_server_stripes_a_download_into_a_file_of_known_size_in_the_foreground() {
        let striped = |size, to_file| DownloadFacts {
            striped: true,
            to_file,
            ..facts(Some(Peer::Braid), size)
        };
        let opts = Options::default();
        assert_eq!(
            Route::download(striped(Some(MIB), true), &opts).ok(),
            Some(Route::Striped)
        );
        let blocks = Some(Route::Blocks(Peer::Braid));
        assert_eq!(Route::download(striped(None, true), &opts).ok(), blocks);
        assert_eq!(
            Route::download(striped(Some(MIB), false), &opts).ok(),
            blocks
        );
        let bg = Options {
            background: Some(std::time::Duration::from_millis(5)),
            ..Options::default()
        };
        assert_eq!(Route::download(striped(Some(MIB), true), &bg).ok(), blocks);
    }

    use super::super::testing::{done, scripted};
    use braid_proto::Reply;

    fn refused() -> ClientError {
        ClientError::Remote {
            what: "STOR up".into(),
            reply: Reply::new(550, "not a plain file"),
        }
    }

    #[test]
    fn a_refusal_of_a_directory_says_so_with_the_fix() {
        let (mut c, server) = scripted(b"250-Listing up\r\n type=dir;perm=el; /up\r\n250 End\r\n");
        let e = directory_hint(&mut c, "up", refused(), "end the URL with /");
        assert!(
            e.to_string()
                .contains("up is a directory on the server: end the URL with /"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 5);
        assert_eq!(done(c, server), "MLST up\r\n");
    }

    #[test]
    fn a_refusal_of_a_file_or_an_error_that_is_no_refusal_passes_as_it_is() {
        let (mut c, server) = scripted(b"250-Listing f\r\n type=file;size=3; /f\r\n250 End\r\n");
        let e = directory_hint(&mut c, "f", refused(), "fix");
        assert!(!e.to_string().contains("directory"), "{e}");
        let local = ClientError::Local {
            what: "w".into(),
            cause: std::io::Error::other("full"),
        };
        assert!(matches!(
            directory_hint(&mut c, "f", local, "fix"),
            ClientError::Local { .. }
        ));
        // Only the refusal was looked into.
        assert_eq!(done(c, server), "MLST f\r\n");
    }
}
