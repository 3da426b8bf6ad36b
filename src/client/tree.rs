//! `get -r` and `put -r`: a whole tree on a few sessions. One session walks the tree (MLSD, or
//! LIST on servers without it, on the remote side), creating directories as it goes; then
//! `concurrency` sessions take the files from one queue, each file moving as `get`/`put` would
//! move it (MODE E with its data connections kept across files, or stream mode); against a
//! braid or Globus GridFTP server, small files go ahead of their turn, many in flight per
//! session (`pipeline`).
//! A file that fails is listed with why and the others go on; symbolic links are skipped and
//! listed, never followed, on either side.

use super::Options;
use super::bundle;
use super::bundle_put;
use super::control::Control;
use super::error::{ClientError, Result, exit};
use super::inflight::Flight;
use super::interrupt::Interrupt;
use super::job::{Dest, Held, refuse_read_only};
use super::listing::{ListEntry, list_dir, list_dir_in_blocks, list_tree};
use super::names::{case_collisions, unsafe_name, up_to_date};
use super::peer::Peer;
use super::pipeline::{self, Wanted};
use super::records;
use super::route::{get_on, put_on};
use super::sessions::{another_session, session};
use super::summary::{Summary, display_url};
use super::url::Target;
use braid_proto::Command;
use braid_proto::client::{Direction, Op, Outcome};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Sessions a tree moves on unless told otherwise.
pub const SESSIONS: usize = 4;

/// Deeper than this is a loop a server made up (or a tree nobody should mirror blindly).
const MAX_DEPTH: usize = braid_proto::listing::TREE_DEPTH;

/// How a tree transfer runs.
#[derive(Debug, Clone, Copy)]
pub struct TreeOptions {
    /// Sessions at once (`-j`); None: [`SESSIONS`], or one where a braid server sends every
    /// file of the tree in bundles.
    pub concurrency: Option<usize>,
    /// Skip files whose destination has the same size and is not older; continue partials.
    pub update: bool,
}

impl TreeOptions {
    /// The sessions to run, and these options with them fixed. Files that all go in bundles
    /// need no more than one: a bundle runs its own parallel connections, and each session
    /// more is another login (over ssh another far side, about half a second of two cores:
    /// 2.33 s for a tree that one session moved in 1.87 s).
    fn sessions(self, all_bundled: bool) -> (usize, TreeOptions) {
        let default = if all_bundled { 1 } else { SESSIONS };
        let sessions = self.concurrency.unwrap_or(default).max(1);
        let tree = TreeOptions {
            concurrency: Some(sessions),
            ..self
        };
        (sessions, tree)
    }
}

/// What a tree transfer did (`--json`: the last line, after one line per file moved).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TreeSummary {
    pub op: &'static str,
    /// Files moved.
    pub files: u64,
    /// Files `--update` found already there.
    pub up_to_date: u64,
    /// Directories created or found (the tops included).
    pub directories: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Sessions opened (logins).
    pub sessions: u32,
    /// Files (or directories) that did not make it, and why.
    pub failed: Vec<Failure>,
    /// What was left out on purpose: symbolic links and other non-files.
    pub skipped: Vec<Skip>,
    /// Ctrl-C (or SIGTERM) stopped it: what had not started is neither done nor failed.
    pub interrupted: bool,
    /// What stopped it, as a person would name it: `Ctrl-C` or `SIGTERM`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<&'static str>,
    #[serde(skip)]
    started: Instant,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Failure {
    pub path: String,
    pub error: String,
    /// The exit code this failure would have given a single-file transfer.
    pub exit_code: u8,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Skip {
    pub path: String,
    pub why: String,
}

impl TreeSummary {
    fn new(op: &'static str) -> TreeSummary {
        TreeSummary {
            op,
            files: 0,
            up_to_date: 0,
            directories: 0,
            bytes: 0,
            seconds: 0.0,
            bytes_per_second: 0.0,
            sessions: 0,
            failed: Vec::new(),
            skipped: Vec::new(),
            interrupted: false,
            stopped_by: None,
            started: Instant::now(),
        }
    }

    fn finished(mut self) -> TreeSummary {
        self.seconds = self.started.elapsed().as_secs_f64();
        self.bytes_per_second = self.bytes as f64 / self.seconds.max(1e-9);
        self
    }

    fn fail(&mut self, path: impl Into<String>, e: &ClientError) {
        self.failed.push(Failure {
            path: path.into(),
            error: e.to_string(),
            exit_code: e.exit_code(),
        });
    }

    fn refuse(&mut self, path: impl Into<String>, why: &str) {
        self.failed.push(Failure {
            path: path.into(),
            error: format!("refused {why}"),
            exit_code: exit::PROTOCOL,
        });
    }

    fn skip(&mut self, path: impl Into<String>, why: impl Into<String>) {
        self.skipped.push(Skip {
            path: path.into(),
            why: why.into(),
        });
    }

    /// The exit code: 0 when every file made it, 7 after Ctrl-C, else 11.
    pub fn exit_code(&self) -> u8 {
        if self.interrupted {
            exit::INTERRUPTED
        } else if self.failed.is_empty() {
            exit::OK
        } else {
            exit::SOME_FAILED
        }
    }
}

/// One file to move: its path on the server and here, and what the source side says of it.
#[derive(Debug, Clone)]
struct Job {
    remote: String,
    local: PathBuf,
    size: Option<u64>,
    /// Whether `size` comes from MLSD (exact) rather than a LIST line.
    exact: bool,
    mtime: Option<i64>,
    /// A bundle that held it failed: it goes on its own, for its own answer.
    alone: bool,
}

impl Job {
    /// The file as the summary names it: the remote path of a download (`op` "get"), the
    /// local one of an upload.
    fn named(&self, op: &str) -> String {
        match op {
            "get" => shown(&self.remote),
            _ => self.local.display().to_string(),
        }
    }

    /// The options this file moves with. With `-n auto` from a braid server, a small file is
    /// one block, so the self-tuning starts it on one data connection (a connection needs a
    /// block to carry), and the session's next small files go on that one too. More would
    /// each cost a thread per file at both ends and give nothing back, since the session's
    /// files in flight keep its connection busy: on loopback, 1,000 files of 1 MiB took 2.3 s
    /// with 4,048 thread starts on four, 0.8-1.0 s on one. It stays auto otherwise (`-n 1` lost
    /// its choice of cubic over 400 ms: 1,000 × 4 KiB over satellite-t1 took 36.5 s, not 33.5).
    fn options<'a>(&self, opts: &'a Options, c: &Control) -> std::borrow::Cow<'a, Options> {
        let small = self.size.is_some_and(|s| s <= pipeline::MAX_SIZE);
        let auto = opts.streams.is_none() && opts.block_size.is_none();
        if small && auto && super::peer::Peer::of(c) == Some(super::peer::Peer::Braid) {
            std::borrow::Cow::Owned(Options {
                block_size: Some(pipeline::MAX_SIZE),
                ..opts.clone()
            })
        } else {
            std::borrow::Cow::Borrowed(opts)
        }
    }
}

/// Downloads trees (or single files) from one server: each `(source, top)` pair puts the
/// source directory's contents into `top`, which is created if missing.
pub fn get_tree(
    sources: &[(Target, PathBuf)],
    opts: &Options,
    tree: TreeOptions,
    done: impl Fn(&Summary) + Sync,
) -> Result<TreeSummary> {
    let first = one_server(sources.iter().map(|(t, _)| t))?;
    let mut out = TreeSummary::new("get-tree");
    // A source that SIZE answers is a file (a directory gets 550; globus-gridftp-server
    // answers for a directory too, so MLST has the last word there). The first one's goes
    // with the login where the server reads ahead (a round trip less).
    let names_a_file = |t: &Target| !t.path.is_empty() && !t.path.ends_with('/');
    let mut c = session(
        first,
        opts,
        names_a_file(first).then_some(first.path.as_str()),
    )?;
    out.sessions = 1;
    let mut jobs = Vec::new();
    let mut dir_times = Vec::new();
    // Where the tree's files come in bundles, they want the listing's data connections.
    let bundles = bundle::offered(&mut c, opts).then_some(opts);
    for (source, top) in sources {
        let sized = names_a_file(source)
            .then(|| c.size(&source.path))
            .transpose()?;
        let sized = sized.filter(|r| {
            r.code == 213 && !(Peer::of(&c) == Some(Peer::GridFtp) && c.is_directory(&source.path))
        });
        if let Some(r) = sized {
            let parent = top.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(Err(e)) = parent.map(local_dir) {
                out.fail(shown(&source.path), &e);
                continue;
            }
            jobs.push(Job {
                remote: source.path.clone(),
                local: top.clone(),
                size: r.text().trim().parse().ok(),
                exact: true,
                alone: false,
                mtime: None,
            });
            continue;
        }
        walk_remote(
            &mut c,
            source,
            top,
            bundles,
            &mut jobs,
            &mut dir_times,
            &mut out,
        );
    }
    let file_opts = Options {
        progress: false,
        resume: opts.resume || tree.update,
        ..opts.clone()
    };
    let mdtm = c.has_feature("MDTM");
    let all_bundled = bundles.is_some()
        && jobs.iter().all(|j| {
            fits_ahead(j, tree.update) && j.size.is_some_and(|s| s <= bundle::LARGEST_FILE)
        });
    let (sessions, tree) = tree.sessions(all_bundled);
    let work = Work::new(jobs, opts, "get", first);
    let one = |c: &mut Control, job: &Job, o: &Options| {
        let dest = Dest::File(job.local.clone());
        let mut mtime = job.mtime;
        if mtime.is_none() && mdtm {
            mtime = remote_mtime(c, &job.remote);
        }
        if tree.update && already_here(job, mtime) {
            return Ok(None);
        }
        refuse_read_only(&dest)?;
        let target = Target {
            gsi: false,
            path: job.remote.clone(),
            ..first.clone()
        };
        // MLSD sizes are exact; LIST's are only what a line seemed to say.
        if let (Some(size), true) = (job.size, job.exact) {
            c.know_size(&job.remote, size);
        }
        let s = get_on(c, &target, &dest, o)?;
        if let Some(m) = mtime {
            set_mtime(&job.local, m);
        }
        done(&s);
        Ok(Some(s))
    };

    let ahead = |c: &mut Control, work: &Work, results: &Results, stop: &Stop<'_>| {
        if bundle::offered(c, opts) {
            let fetch = Fetch {
                server: first,
                opts,
                update: tree.update,
                done: &done,
            };
            return fetch.bundles(c, work, results, sessions, stop);
        }
        if !pipeline::ready(c, opts, Direction::Download) {
            return true;
        }
        get_ahead(c, work, results, first, tree.update, false, stop, &done)
    };
    work.run(c, &file_opts, tree, &mut out, one, ahead);
    // Deepest first: setting a directory's time is undone by writing into it.
    for (dir, mtime) in dir_times.iter().rev() {
        set_mtime(dir, *mtime);
    }
    Ok(out.finished())
}

/// Uploads local trees (or single files) to one server: each `(source, top)` pair puts the
/// source directory's contents into the remote directory `top`, which is created if missing.
pub fn put_tree(
    sources: &[(PathBuf, Target)],
    opts: &Options,
    tree: TreeOptions,
    done: impl Fn(&Summary) + Sync,
) -> Result<TreeSummary> {
    let first = one_server(sources.iter().map(|(_, t)| t))?;
    let mut out = TreeSummary::new("put-tree");
    // The local trees are walked while the session starts (a login's round trips, or ssh
    // starting the far side): 10,000 files take 50 ms to look at, as long as logging in.
    let (c, scans) = std::thread::scope(|s| {
        let login = s.spawn(|| session(first, opts, None));
        let scans = sources
            .iter()
            .map(|(source, top)| scan_source(source, &top.path, &mut out))
            .collect::<Result<Vec<_>>>();
        let c = login.join().unwrap_or_else(|_| {
            Err(ClientError::Protocol(
                "the thread starting the session failed".into(),
            ))
        });
        (c, scans)
    });
    let mut c = c?;
    let scans = scans?;
    out.sessions = 1;
    let mut jobs = Vec::new();
    for scan in scans {
        match scan {
            Source::File(job) => jobs.push(job),
            Source::Tree(found) => enter_local(&mut c, found, tree.update, &mut jobs, &mut out),
            Source::Neither => {}
        }
    }
    let file_opts = Options {
        progress: false,
        resume: false,
        keep_connections: true,
        ..opts.clone()
    };
    let all_bundled = bundle_put::offered(&mut c, opts)
        && jobs
            .iter()
            .all(|j| j.size.is_some_and(|s| s <= bundle::LARGEST_FILE));
    let (sessions, tree) = tree.sessions(all_bundled);
    let work = Work::new(jobs, opts, "put", first);
    let one = |c: &mut Control, job: &Job, o: &Options| {
        let target = Target {
            gsi: false,
            path: job.remote.clone(),
            ..first.clone()
        };
        // Its data waits for STOR's answer.
        c.later(Op::Eager(false), None)?;
        // With --update, a file an earlier run broke off in MODE E goes on from what the
        // server reported holding.
        let held = if tree.update {
            Held::Recorded
        } else {
            Held::Nothing
        };
        let s = put_on(c, &job.local, &target, o, held)?;
        if let Some(mfmt) = keep_time(c, job) {
            let _ = c.later(Op::Ask(mfmt), None);
        }
        done(&s);
        Ok(Some(s))
    };
    let ahead = |c: &mut Control, work: &Work, results: &Results, stop: &Stop<'_>| {
        if bundle_put::offered(c, opts)
            && !store_bundles(c, work, results, first, opts, sessions, stop, &done)
        {
            return false;
        }
        if !pipeline::ready(c, opts, Direction::Upload) {
            return true;
        }
        put_ahead(c, work, results, first, stop, &done)
    };
    work.run(c, &file_opts, tree, &mut out, one, ahead);
    Ok(out.finished())
}

/// All sources on one server (one login serves them all); the first of them.
fn one_server<'a>(mut targets: impl Iterator<Item = &'a Target>) -> Result<&'a Target> {
    let first = targets
        .next()
        .ok_or_else(|| ClientError::Usage("nothing to transfer".into()))?;
    for t in targets {
        if (&t.host, t.port, &t.user) != (&first.host, first.port, &first.user) {
            return Err(ClientError::Usage(format!(
                "{} is on another server than {}: one recursive transfer is one server",
                display_url(t),
                display_url(first)
            )));
        }
    }
    Ok(first)
}

/// Walks a remote directory breadth first, creating its local copy's directories and
/// collecting its files; every entry is checked before its name reaches a path.
fn walk_remote(
    c: &mut Control,
    source: &Target,
    top: &Path,
    bundles: Option<&Options>,
    jobs: &mut Vec<Job>,
    dir_times: &mut Vec<(PathBuf, i64)>,
    out: &mut TreeSummary,
) {
    // One listing for the whole tree where the server has MLSR; else one per directory.
    let mut listed = c
        .has_feature("MLSR")
        .then(|| match list_tree(c, &source.path, bundles) {
            Ok(all) => Some(Listed::by_directory(all)),
            Err(e) => {
                tracing::info!("MLSR {}: {e}; listing one directory at a time", source.path);
                None
            }
        })
        .flatten();
    let mut dirs = VecDeque::from([(source.path.clone(), top.to_path_buf(), String::new(), 0)]);
    while let Some((remote, local, rel, depth)) = dirs.pop_front() {
        // Listed first: a directory the server refuses leaves nothing empty behind here.
        let entries = match (&mut listed, bundles) {
            (Some(l), _) => Ok(l.take(&rel)),
            (None, Some(opts)) => list_dir_in_blocks(c, &remote, opts),
            (None, None) => list_dir(c, &remote),
        };
        let entries = match entries {
            Ok(e) => e,
            Err(e) => {
                out.fail(shown(&remote), &e);
                continue;
            }
        };
        if let Err(e) = local_dir(&local) {
            out.fail(local.display().to_string(), &e);
            continue;
        }
        out.directories += 1;
        let folded = case_insensitive(&local);
        let collide: Vec<String> = if folded {
            case_collisions(entries.iter().map(|e| e.name.as_str()))
                .into_iter()
                .map(String::from)
                .collect()
        } else {
            Vec::new()
        };
        let base = if remote.is_empty() || remote.ends_with('/') {
            remote.clone()
        } else {
            format!("{remote}/")
        };
        for e in entries {
            let path = format!("{base}{}", e.name);
            let rel_path = if rel.is_empty() {
                e.name.clone()
            } else {
                format!("{rel}/{}", e.name)
            };
            if let Some(l) = &mut listed {
                l.named.insert(rel_path.clone());
            }
            if let Some(why) = unsafe_name(&e.name) {
                out.refuse(shown(&path), why);
                continue;
            }
            if collide.contains(&e.name) {
                out.refuse(
                    shown(&path),
                    "a name that differs from another in this directory only by case, on a local filesystem that ignores case",
                );
                continue;
            }
            match e.kind.as_deref() {
                Some("file") => jobs.push(Job {
                    remote: path,
                    local: local.join(&e.name),
                    size: e.size,
                    exact: e.raw.is_none(),
                    alone: false,
                    mtime: e.modify,
                }),
                Some("dir") if depth + 1 >= MAX_DEPTH => out.refuse(
                    shown(&path),
                    &format!("a directory deeper than {MAX_DEPTH} levels (a loop?)"),
                ),
                Some("dir") => {
                    if let Some(m) = e.modify {
                        dir_times.push((local.join(&e.name), m));
                    }
                    dirs.push_back((path, local.join(&e.name), rel_path, depth + 1));
                }
                kind => out.skip(shown(&path), remote_kind(kind, &e)),
            }
        }
    }
    if let Some(l) = listed {
        l.report_strays(&source.path, out);
    }
}

/// An MLSR listing, by directory: each directory's entries (named by their last name) under
/// its path relative to the listed top ("" for the top).
struct Listed {
    dirs: HashMap<String, Vec<ListEntry>>,
    /// Directories whose entries the walk took.
    taken: HashSet<String>,
    /// Every entry of those, by its path relative to the top.
    named: HashSet<String>,
}

impl Listed {
    fn by_directory(all: Vec<ListEntry>) -> Listed {
        let mut dirs: HashMap<String, Vec<ListEntry>> = HashMap::new();
        for mut e in all {
            if e.name.starts_with('/') || e.name.ends_with('/') || e.name.contains("//") {
                // No directory of the tree: reported as a stray, with nothing in it taken.
                dirs.entry(e.name.clone()).or_default();
                continue;
            }
            let (parent, name) = match e.name.rsplit_once('/') {
                Some((p, n)) => (p.to_string(), n.to_string()),
                None => (String::new(), e.name.clone()),
            };
            e.name = name;
            dirs.entry(parent).or_default().push(e);
        }
        Listed {
            dirs,
            taken: HashSet::new(),
            named: HashSet::new(),
        }
    }

    /// The entries of the directory at `rel`, taken out of the listing.
    fn take(&mut self, rel: &str) -> Vec<ListEntry> {
        self.taken.insert(rel.to_string());
        self.dirs.remove(rel).unwrap_or_default()
    }

    /// Entries the server listed under a path that is no directory of the tree (`a/../b/x`,
    /// `/x`, or a directory it never listed) are refused, once per path, and never requested.
    /// Those beneath an entry the walk refused or skipped (a link, a name too deep) were
    /// reported with it.
    fn report_strays(self, top: &str, out: &mut TreeSummary) {
        let base = top.trim_end_matches('/');
        let mut strays: Vec<&String> = self
            .dirs
            .keys()
            .filter(|parent| {
                // The outermost part of the path the walk did not go into: if the server
                // listed it, the walk reported it.
                let outermost = parent
                    .match_indices('/')
                    .map(|(at, _)| &parent[..at])
                    .chain([parent.as_str()])
                    .find(|p| !self.taken.contains(*p));
                outermost.is_some_and(|p| !self.named.contains(p))
            })
            .collect();
        strays.sort();
        for parent in strays {
            out.refuse(
                shown(&format!("{base}/{parent}")),
                "entries the server listed (MLSR) under a path that is not a directory of the tree",
            );
        }
    }
}

/// What one source of an upload is: a file, a tree walked, or something left out (recorded
/// in the summary).
enum Source {
    File(Job),
    Tree(Found),
    Neither,
}

/// A local tree walked: its files with their times, and its directories as the server will
/// name them, the top first.
struct Found {
    top: String,
    files: Vec<(Job, i64)>,
    dirs: Vec<String>,
}

/// Looks at one source of an upload; one that cannot be read at all is the error.
fn scan_source(source: &Path, top: &str, out: &mut TreeSummary) -> Result<Source> {
    let meta = std::fs::symlink_metadata(source).map_err(|e| ClientError::Local {
        what: format!("cannot read {}", source.display()),
        cause: e,
    })?;
    Ok(if meta.is_file() {
        Source::File(Job {
            remote: top.to_string(),
            local: source.to_path_buf(),
            size: Some(meta.len()),
            exact: true,
            alone: false,
            mtime: Some(unix_seconds(&meta)),
        })
    } else if meta.is_dir() {
        Source::Tree(walk_local(source, top, out))
    } else {
        out.skip(source.display().to_string(), kind_of(&meta));
        Source::Neither
    })
}

/// Walks a local directory breadth first, collecting its directories and files; symbolic
/// links are listed, not followed. Nothing is asked of the server.
fn walk_local(source: &Path, top: &str, out: &mut TreeSummary) -> Found {
    let top = top.trim_end_matches('/');
    let mut found = Vec::new();
    let mut walked = Vec::new();
    let mut dirs = VecDeque::from([(source.to_path_buf(), top.to_string())]);
    while let Some((local, remote)) = dirs.pop_front() {
        walked.push(remote.clone());
        out.directories += 1;
        let mut entries: Vec<_> = match std::fs::read_dir(&local) {
            Ok(rd) => rd.filter_map(|e| e.ok()).collect(),
            Err(e) => {
                out.fail(
                    local.display().to_string(),
                    &ClientError::Local {
                        what: format!("cannot read directory {}", local.display()),
                        cause: e,
                    },
                );
                continue;
            }
        };
        entries.sort_by_key(|e| e.file_name());
        let base = if remote.is_empty() {
            String::new()
        } else {
            format!("{remote}/")
        };
        for e in entries {
            let path = e.path();
            let shown_local = path.display().to_string();
            let Some(name) = e.file_name().to_str().map(String::from) else {
                out.refuse(shown_local, "a name that is not UTF-8 (FTP paths here are)");
                continue;
            };
            if let Some(why) = unsafe_name(&name) {
                out.refuse(shown_local, why);
                continue;
            }
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                // Gone since the directory was read.
                Err(cause) => {
                    let what = format!("cannot read {shown_local}");
                    out.fail(shown_local, &ClientError::Local { what, cause });
                    continue;
                }
            };
            if meta.is_dir() {
                dirs.push_back((path, format!("{base}{name}")));
            } else if meta.is_file() {
                let job = Job {
                    remote: format!("{base}{name}"),
                    local: path,
                    size: Some(meta.len()),
                    exact: true,
                    alone: false,
                    mtime: Some(unix_seconds(&meta)),
                };
                found.push((job, unix_seconds(&meta)));
            } else {
                out.skip(shown_local, kind_of(&meta));
            }
        }
    }
    Found {
        top: top.to_string(),
        files: found,
        dirs: walked,
    }
}

/// Creates a walked tree's remote directories and takes its files as jobs; with `update`,
/// each remote directory is listed so that files already there can be left out.
fn enter_local(
    c: &mut Control,
    found: Found,
    update: bool,
    jobs: &mut Vec<Job>,
    out: &mut TreeSummary,
) {
    let Found {
        top,
        files,
        dirs: walked,
    } = found;
    // The top's parents first, as `mkdir -p` would, then the tree's.
    let made: Vec<String> = parents(&top)
        .chain(walked.iter().filter(|d| !d.is_empty()).cloned())
        .collect();
    make_dirs(c, &made);
    let there = if update {
        remote_files(c, &top, &walked)
    } else {
        HashMap::new()
    };
    for (job, mtime) in files {
        let (dir, name) = job.remote.rsplit_once('/').unwrap_or(("", &job.remote));
        if let Some(t) = there.get(dir).and_then(|d| d.get(name))
            && let (Some(size), Some(len)) = (t.size, job.size)
            && up_to_date((len, Some(mtime)), (size, t.modify.unwrap_or(i64::MAX)))
        {
            out.up_to_date += 1;
            continue;
        }
        jobs.push(job);
    }
}

/// The directories above `path` on a server, outermost first (what `mkdir -p` makes before
/// it).
pub(super) fn parents(path: &str) -> impl Iterator<Item = String> + '_ {
    path.match_indices('/')
        .filter(|&(at, _)| at > 0)
        .map(|(at, _)| path[..at].to_string())
}

/// Creates the remote directories, parents first. A server that pipelines (braid) gets them
/// a batch at a time, others one by one. A directory that exists already is refused (550 or
/// 521) and is fine; one that cannot be made shows in its files' failures. Which of `dirs`
/// were made (by index).
pub(super) fn make_dirs(c: &mut Control, dirs: &[String]) -> Vec<usize> {
    let mut made = Vec::new();
    if !c.session().pipelining() {
        for (i, d) in dirs.iter().enumerate() {
            if c.cmd(&Command::Mkd(d.clone())).is_ok_and(|r| r.code == 257) {
                made.push(i);
            }
        }
        return made;
    }
    const BATCH: usize = 64;
    for (b, batch) in dirs.chunks(BATCH).enumerate() {
        let mkd = batch.iter().map(|d| Op::Ask(Command::Mkd(d.clone())));
        if c.begin_all(mkd).is_err() {
            return made;
        }
        for i in 0..batch.len() {
            if let Ok(Outcome::Done(r)) = c.outcome(None)
                && r.code == 257
            {
                made.push(b * BATCH + i);
            }
        }
    }
    made
}

/// What the server holds in the directories `dirs` (`top` and those beneath it), by
/// directory and name: one MLSR of `top` where the server has it, else a listing per
/// directory.
fn remote_files(
    c: &mut Control,
    top: &str,
    dirs: &[String],
) -> HashMap<String, HashMap<String, ListEntry>> {
    let by_name =
        |entries: Vec<ListEntry>| entries.into_iter().map(|e| (e.name.clone(), e)).collect();
    let tree = c
        .has_feature("MLSR")
        .then(|| list_tree(c, top, None).ok())
        .flatten();
    match tree {
        Some(all) => Listed::by_directory(all)
            .dirs
            .into_iter()
            .map(|(rel, entries)| {
                let dir = match (top.is_empty(), rel.is_empty()) {
                    (_, true) => top.to_string(),
                    (true, false) => rel,
                    (false, false) => format!("{top}/{rel}"),
                };
                (dir, by_name(entries))
            })
            .collect(),
        None => dirs
            .iter()
            .map(|dir| (dir.clone(), by_name(list_dir(c, dir).unwrap_or_default())))
            .collect(),
    }
}

/// The queue of files and the sessions that take from it.
struct Work {
    jobs: Mutex<VecDeque<Job>>,
    total: usize,
    bar: ProgressBar,
    op: &'static str,
    /// Where new sessions go.
    server: Target,
}

/// What each file came to, in the order they ended.
type Results = Mutex<Vec<Moved>>;

/// Whether Ctrl-C (or SIGTERM) asked the tree to stop; asked from any thread.
type Stop<'a> = dyn Fn() -> bool + Sync + 'a;

/// What one file came to.
enum Moved {
    /// The bytes it moved.
    Done(u64),
    UpToDate,
    Failed(String, ClientError),
}

impl Work {
    fn new(jobs: Vec<Job>, opts: &Options, op: &'static str, server: &Target) -> Work {
        let total = jobs.len();
        let bytes: u64 = jobs.iter().filter_map(|j| j.size).sum();
        let bar = if opts.progress && std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(bytes);
            let style = ProgressStyle::with_template(
                "{msg:>14} {bytes:>10}/{total_bytes:10} [{wide_bar}] {binary_bytes_per_sec:>12} ETA {eta:>4}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style.progress_chars("=> "));
            bar.set_message(format!("0/{total} files"));
            bar
        } else {
            ProgressBar::hidden()
        };
        Work {
            jobs: Mutex::new(jobs.into()),
            total,
            bar,
            op,
            server: server.clone(),
        }
    }

    fn next(&self) -> Option<Job> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// The next file, if `take` wants it.
    fn next_if(&self, take: impl Fn(&Job) -> bool) -> Option<Job> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.front().is_some_and(take) {
            jobs.pop_front()
        } else {
            None
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files still waiting.
    fn len(&self) -> usize {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn put_back(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_front(job);
    }

    /// Runs the queue on `concurrency` sessions (the walker's among them) and adds what each
    /// file came to into `out`.
    fn run(
        self,
        walker: Control,
        opts: &Options,
        tree: TreeOptions,
        out: &mut TreeSummary,
        one: impl Fn(&mut Control, &Job, &Options) -> Result<Option<Summary>> + Sync,
        ahead: impl Fn(&mut Control, &Work, &Results, &Stop<'_>) -> bool + Sync,
    ) {
        let crew = Crew {
            work: &self,
            opts,
            interrupt: Interrupt::install(),
            logins: AtomicU32::new(0),
            results: Mutex::new(Vec::new()),
            last_error: Mutex::new(None),
        };
        let workers = tree
            .concurrency
            .unwrap_or(SESSIONS)
            .clamp(1, self.total.max(1));
        let mut walker = Some(walker);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let (crew, one, ahead) = (&crew, &one, &ahead);
                let first = walker.take();
                scope.spawn(move || crew.worker(first, one, ahead));
            }
        });
        self.bar.finish_and_clear();
        out.sessions += crew.logins.into_inner();
        let results = crew.results.into_inner().unwrap_or_else(|e| e.into_inner());
        for moved in results {
            match moved {
                Moved::Done(bytes) => {
                    out.files += 1;
                    out.bytes += bytes;
                }
                Moved::UpToDate => out.up_to_date += 1,
                Moved::Failed(path, e) => out.fail(path, &e),
            }
        }
        out.interrupted = crew.interrupt.hit();
        out.stopped_by = out.interrupted.then(|| crew.interrupt.cause());
        let why = crew
            .last_error
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| "no session could be opened".into());
        let left = self.jobs.into_inner().unwrap_or_else(|e| e.into_inner());
        if !out.interrupted {
            for job in left {
                out.fail(
                    job.named(self.op),
                    &ClientError::Protocol(format!(
                        "not transferred: every session failed ({why})"
                    )),
                );
            }
        }
    }

    /// Keeps what a file came to, and moves the progress bar on by it.
    fn record(&self, job: &Job, moved: Moved, results: &Results) {
        let bytes = match moved {
            Moved::Done(bytes) => bytes,
            _ => 0,
        };
        let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
        results.push(moved);
        self.bar.inc(job.size.unwrap_or(bytes));
        self.bar
            .set_message(format!("{}/{} files", results.len(), self.total));
    }
}

/// What the sessions working through a tree's queue share.
struct Crew<'a> {
    work: &'a Work,
    opts: &'a Options,
    interrupt: Interrupt,
    /// Sessions opened beyond the walker's.
    logins: AtomicU32,
    results: Results,
    /// Why the last session that could not be opened failed.
    last_error: Mutex<Option<String>>,
}

impl Crew<'_> {
    /// One session's work: files requested ahead where they can be, else one at a time, until
    /// the queue is empty or Ctrl-C. A session that breaks is dropped and another opened (its
    /// file waits in the queue meanwhile). `c`: the walker's session, for the first worker.
    fn worker(
        &self,
        mut c: Option<Control>,
        one: &(impl Fn(&mut Control, &Job, &Options) -> Result<Option<Summary>> + Sync),
        ahead: &(impl Fn(&mut Control, &Work, &Results, &Stop<'_>) -> bool + Sync),
    ) {
        let (work, interrupt) = (self.work, &self.interrupt);
        let stop = || interrupt.hit();
        while !interrupt.hit() {
            // The files that can go requested ahead, first; a session that broke doing so is
            // dropped, and its files wait for the next.
            if let Some(s) = c.as_mut()
                && !ahead(s, work, &self.results, &stop)
            {
                c = None;
                continue;
            }
            let Some(job) = work.next() else { break };
            let Some(session) = c.as_mut() else {
                // The file waits for this session or another's.
                work.put_back(job);
                match self.another() {
                    Some(s) => {
                        c = Some(s);
                        continue;
                    }
                    None => break,
                }
            };
            let moved = match one(session, &job, &job.options(self.opts, session)) {
                Ok(Some(s)) => Moved::Done(s.bytes),
                Ok(None) => Moved::UpToDate,
                Err(e) => {
                    if breaks_session(&e) || !session.in_step() {
                        c = None;
                    }
                    Moved::Failed(job.named(work.op), e)
                }
            };
            work.record(&job, moved, &self.results);
        }
        if let Some(s) = c {
            s.quit();
        }
    }

    /// A new session, unless Ctrl-C or the others have taken every file meanwhile.
    fn another(&self) -> Option<Control> {
        let give_up = || self.interrupt.hit() || self.work.is_empty();
        match another_session(&self.work.server, self.opts, give_up) {
            Ok(s) => {
                self.logins.fetch_add(1, Ordering::Relaxed);
                Some(s)
            }
            Err(e) => {
                *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                None
            }
        }
    }
}

/// Files moved ahead of their turn on one session (see `pipeline`): which files may go, what
/// each needs before its commands go out, the commands, and the move itself.
struct Ahead<F, P, R, M> {
    /// Files in flight at most: the flight grows from `pipeline::AHEAD` to this.
    most: usize,
    fits: F,
    prepare: P,
    request: R,
    moved: M,
}

impl<T, F, P, R, M> Ahead<F, P, R, M>
where
    F: Fn(&Job) -> bool,
    // None: nothing to move (up to date); Err: the file fails before anything is asked.
    P: Fn(&Job) -> Result<Option<T>>,
    R: Fn(&mut Control, &mut [(Job, T)]) -> Result<()>,
    M: Fn(&mut Control, &Job, T) -> std::result::Result<Summary, pipeline::Failed>,
{
    /// Moves the files at the head of the queue that fit, as many asked for at a time as the
    /// path holds ([`Flight`]), until the head is a file that does not. False if the session
    /// broke: the files it had asked for and not moved go back to the queue.
    fn run(&self, c: &mut Control, work: &Work, results: &Results, stop: &Stop<'_>) -> bool {
        let mut flight = Flight::new(pipeline::AHEAD, self.most);
        let mut out: VecDeque<(Job, T, Instant)> = VecDeque::new();
        let give_back = |out: VecDeque<(Job, T, Instant)>| {
            for (job, _, _) in out.into_iter().rev() {
                work.put_back(job);
            }
        };
        loop {
            let mut ask = Vec::new();
            // Topped up by eighths: several files' commands per write rather than one each
            // time, and the flight kept nearly full.
            let depth = flight.depth();
            let low = out.len() + depth / 8 <= depth;
            while low && out.len() + ask.len() < depth && !stop() {
                let Some(job) = work.next_if(&self.fits) else {
                    break;
                };
                match (self.prepare)(&job) {
                    Ok(Some(item)) => ask.push((job, item)),
                    Ok(None) => work.record(&job, Moved::UpToDate, results),
                    Err(e) => {
                        let named = job.named(work.op);
                        work.record(&job, Moved::Failed(named, e), results);
                    }
                }
            }
            if !ask.is_empty() {
                // Before asking: an upload's request sends its data, which can take a while.
                let now = Instant::now();
                let result = (self.request)(c, &mut ask);
                let asked = ask.into_iter().map(|(j, t)| (j, t, now));
                if let Err(e) = result {
                    tracing::info!("asking for files ahead: {e}");
                    give_back(out.into_iter().chain(asked).collect());
                    return false;
                }
                out.extend(asked);
            }
            let Some((job, item, asked)) = out.pop_front() else {
                return true;
            };
            match (self.moved)(c, &job, item) {
                Ok(s) => {
                    flight.arrived(asked, Instant::now());
                    work.record(&job, Moved::Done(s.bytes), results)
                }
                Err(f) => {
                    let named = job.named(work.op);
                    work.record(&job, Moved::Failed(named, f.error), results);
                    if f.session_broken {
                        give_back(out);
                        return false;
                    }
                }
            }
            if stop() && !out.is_empty() {
                // Asked for, not moved: not started, as far as the summary goes.
                give_back(out);
                return false;
            }
        }
    }
}

/// Whether a file can be requested ahead (or in a bundle): known exactly, small, and not a
/// partial with a record to resume from.
fn fits_ahead(j: &Job, update: bool) -> bool {
    j.exact
        && j.mtime.is_some()
        && j.size.is_some_and(|s| s <= pipeline::MAX_SIZE)
        && !(update && records::sidecar_path(&super::part_path(&j.local)).exists())
}

/// What a download needs before it is asked for: None if it is up to date here.
fn wanted(job: &Job, update: bool) -> Result<Option<Wanted>> {
    if update && already_here(job, job.mtime) {
        return Ok(None);
    }
    refuse_read_only(&Dest::File(job.local.clone()))?;
    Ok(Some(Wanted {
        remote: job.remote.clone(),
        local: job.local.clone(),
        size: job.size.unwrap_or(0),
    }))
}

/// A tree's small files fetched in bundles ([`bundle`]).
struct Fetch<'a, D> {
    server: &'a Target,
    opts: &'a Options,
    update: bool,
    done: &'a D,
}

impl<D: Fn(&Summary) + Sync> Fetch<'_, D> {
    /// Fetches the files at the head of the queue in bundles, each a share of what is left
    /// (so that the tree's sessions each take some) up to [`bundle::MOST_FILES`]; the next is
    /// asked for while one arrives, so that the data connections never wait for a round
    /// trip. Files a failed bundle held go one by one after it. False if the session broke.
    fn bundles(
        &self,
        c: &mut Control,
        work: &Work,
        results: &Results,
        sessions: usize,
        stop: &Stop<'_>,
    ) -> bool {
        type Run = Vec<(Job, Wanted)>;
        let mut out: VecDeque<(Run, bundle::Asked)> = VecDeque::new();
        let give_back = |runs: Vec<Run>| {
            for run in runs.into_iter().rev() {
                for (job, _) in run.into_iter().rev() {
                    work.put_back(job);
                }
            }
        };
        let files = |run: &Run| -> Vec<Wanted> { run.iter().map(|(_, w)| w.clone()).collect() };
        let mut most_bytes = bundle::FIRST_BYTES;
        // Asks for bundles until BUNDLES_AHEAD are out (`started`: one more is under way). The
        // session's first opens its data connections after its BNDL lines, so none may be
        // named behind it until its RBND went. Err: the session broke; the run being asked
        // for is back in the queue, those in `out` are the caller's.
        let ask = |c: &mut Control,
                   out: &mut VecDeque<(Run, bundle::Asked)>,
                   started: bool,
                   most_bytes: u64|
         -> Result<()> {
            while out.len() + usize::from(started) < BUNDLES_AHEAD
                && !out.back().is_some_and(|(_, a)| a.opens_connections())
                && !stop()
            {
                let run = self.next_run(work, results, sessions, most_bytes);
                if run.is_empty() {
                    break;
                }
                let rbnd = started || !out.is_empty() || c.session().can_reuse(Direction::Download);
                match bundle::request(c, &files(&run), rbnd) {
                    Ok(asked) => out.push_back((run, asked)),
                    Err(e) => {
                        give_back(vec![run]);
                        return Err(e);
                    }
                }
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let mut committing = None;
            loop {
                if let Err(e) = ask(c, &mut out, false, most_bytes) {
                    tracing::info!("asking for a bundle: {e}");
                    give_back(out.into_iter().map(|(r, _)| r).collect());
                    return false;
                }
                let Some((run, asked)) = out.pop_front() else {
                    // Files a failed bundle held go requested ahead on the connections it left,
                    // or (none left) the first on its own, opening them.
                    if stop() || !pipeline::ready(c, self.opts, Direction::Download) {
                        return true;
                    }
                    let server = self.server;
                    return get_ahead(c, work, results, server, self.update, true, stop, self.done);
                };
                let bytes = run.iter().map(|(_, w)| w.size).sum();
                let moved = bundle::start(c, asked, bytes, self.opts).and_then(|started| {
                    let at = started.at;
                    // Its RBND is out: the next may be asked for behind it now, while its data
                    // arrives (naming a few thousand files takes a while).
                    let wanted = files(&run);
                    let (received, asked) = std::thread::scope(|s| {
                        let receiving = s.spawn(|| bundle::receive(wanted, started, stop));
                        let asked = ask(c, &mut out, true, most_bytes);
                        let received = receiving.join().unwrap_or_else(|_| {
                            Err(pipeline::Failed::session(ClientError::Protocol(
                                "the thread receiving a bundle failed".into(),
                            )))
                        });
                        (received, asked)
                    });
                    if let Err(e) = asked {
                        if let Ok(r) = received {
                            r.discard();
                        }
                        return Err(pipeline::Failed::session(e));
                    }
                    let arrived = bundle::conclude(c, received?, self.server);
                    most_bytes = bundle::next_bytes(bytes, at.elapsed());
                    arrived
                });
                match moved {
                    // Named on a thread of its own while the next bundle's data arrives; its files
                    // go one by one if that fails.
                    Ok(arrived) => {
                        if let Some(before) = committing.take() {
                            let _ = std::thread::ScopedJoinHandle::join(before);
                        }
                        committing = Some(scope.spawn(move || match arrived.commit() {
                            Ok(summaries) => {
                                for ((job, _), s) in run.iter().zip(summaries) {
                                    if let Some(m) = job.mtime {
                                        set_mtime(&job.local, m);
                                    }
                                    (self.done)(&s);
                                    work.record(job, Moved::Done(s.bytes), results);
                                }
                            }
                            Err(e) => {
                                tracing::info!(
                                    "a bundle's files could not be named ({e}); they go one by one"
                                );
                                for (mut job, _) in run.into_iter().rev() {
                                    job.alone = true;
                                    work.put_back(job);
                                }
                            }
                        }));
                    }
                    Err(f) => {
                        tracing::info!(
                            "a bundle of {} files failed ({}); they go one by one",
                            run.len(),
                            f.error
                        );
                        let alone: Run = run
                            .into_iter()
                            .map(|(mut job, w)| {
                                job.alone = true;
                                (job, w)
                            })
                            .collect();
                        if f.session_broken {
                            let mut runs = vec![alone];
                            runs.extend(out.into_iter().map(|(r, _)| r));
                            give_back(runs);
                            return false;
                        }
                        // Behind any bundle still asked for, which may yet arrive.
                        give_back(vec![alone]);
                    }
                }
            }
        })
    }

    /// The next bundle's files from the head of the queue ([`next_run`]).
    fn next_run(
        &self,
        work: &Work,
        results: &Results,
        sessions: usize,
        most_bytes: u64,
    ) -> Vec<(Job, Wanted)> {
        let update = self.update;
        let bundled = |j: &Job| {
            !j.alone && fits_ahead(j, update) && j.size.is_some_and(|s| s <= bundle::LARGEST_FILE)
        };
        let wanted = |j: &Job| wanted(j, update).map(|w| w.map(|w| (w.size, w)));
        next_run(work, results, sessions, most_bytes, bundled, wanted)
    }
}

/// The next bundle's files from the head of the queue, those `bundled` takes: a share of what
/// is left (so that the tree's sessions each take some), up to the bundle's limits. What
/// `prepare` makes of each, with its size; files it finds up to date (None) or refuses are
/// settled on the way.
fn next_run<T>(
    work: &Work,
    results: &Results,
    sessions: usize,
    most_bytes: u64,
    bundled: impl Fn(&Job) -> bool,
    prepare: impl Fn(&Job) -> Result<Option<(u64, T)>>,
) -> Vec<(Job, T)> {
    let most = (work.len() / sessions.max(1)).clamp(64, bundle::MOST_FILES);
    let (mut run, mut bytes) = (Vec::new(), 0);
    while run.len() < most && bytes < most_bytes {
        let Some(job) = work.next_if(&bundled) else {
            break;
        };
        match prepare(&job) {
            Ok(Some((size, item))) => {
                bytes += size;
                run.push((job, item));
            }
            Ok(None) => work.record(&job, Moved::UpToDate, results),
            Err(e) => {
                let named = job.named(work.op);
                work.record(&job, Moved::Failed(named, e), results);
            }
        }
    }
    run
}

/// Stores the small files at the head of the queue in bundles ([`bundle_put`]), each a share
/// of what is left up to [`bundle::MOST_FILES`] and what the path moves in
/// [`bundle::BUNDLE_TIME`]. Each goes, data and all, before the server's answers to the one
/// before it are read, so that the data connections never wait for a round trip or for the
/// server naming files. Files a failed bundle held go one by one after it. False if the
/// session broke.
#[allow(clippy::too_many_arguments)]
fn store_bundles(
    c: &mut Control,
    work: &Work,
    results: &Results,
    server: &Target,
    opts: &Options,
    sessions: usize,
    stop: &Stop<'_>,
    done: &(impl Fn(&Summary) + Sync),
) -> bool {
    type Run = Vec<(Job, bundle_put::Outgoing)>;
    let give_back = |run: Run| {
        for (mut job, _) in run.into_iter().rev() {
            job.alone = true;
            work.put_back(job);
        }
    };
    let failed = |run: Run, f: &pipeline::Failed| {
        tracing::info!(
            "a bundle of {} files was not stored ({}); they go one by one",
            run.len(),
            f.error
        );
        give_back(run);
    };
    // The answers to the bundle sent last; false if the session broke.
    let settle = |c: &mut Control, (run, sent): (Run, bundle_put::Sent)| -> bool {
        match bundle_put::answers(c, sent, server, stop) {
            Ok(summaries) => {
                for ((job, _), s) in run.iter().zip(summaries) {
                    done(&s);
                    work.record(job, Moved::Done(s.bytes), results);
                }
                true
            }
            Err(f) => {
                let broken = f.session_broken;
                failed(run, &f);
                !broken
            }
        }
    };
    let bundled = |j: &Job| !j.alone && j.size.is_some_and(|s| s <= bundle::LARGEST_FILE);
    let outgoing = |j: &Job| {
        let size = j.size.unwrap_or(0);
        let wanted = Wanted {
            remote: j.remote.clone(),
            local: j.local.clone(),
            size,
        };
        let mtime = j.mtime;
        Ok(Some((size, bundle_put::Outgoing { wanted, mtime })))
    };
    let mut most_bytes = bundle::FIRST_BYTES;
    let mut unanswered: Option<(Run, bundle_put::Sent)> = None;
    loop {
        let run = match stop() {
            true => Vec::new(),
            false => next_run(work, results, sessions, most_bytes, bundled, outgoing),
        };
        if run.is_empty() {
            return unanswered.is_none_or(|last| settle(c, last));
        }
        // The session's first opens its connections once the server has answered the one
        // before (there is none) : only bundles on kept connections go ahead of answers.
        if !c.session().can_reuse(Direction::Upload)
            && let Some(last) = unanswered.take()
            && !settle(c, last)
        {
            give_back(run);
            return false;
        }
        let files = run.iter().map(|(_, o)| o.clone()).collect();
        let bytes = run.iter().map(|(_, o)| o.wanted.size).sum();
        let at = Instant::now();
        let sent = bundle_put::send(c, files, opts, stop);
        if sent.is_ok() {
            most_bytes = bundle::next_bytes(bytes, at.elapsed());
        }
        let before = unanswered.take();
        let settled = before.is_none_or(|last| settle(c, last));
        match sent {
            Ok(sent) => unanswered = Some((run, sent)),
            Err(f) => {
                let broken = f.session_broken;
                failed(run, &f);
                if broken {
                    return false;
                }
            }
        }
        if !settled {
            if let Some((run, _)) = unanswered.take() {
                give_back(run);
            }
            return false;
        }
    }
}

/// Bundles a session asks for before the oldest has arrived: three wait behind the one that
/// arrives. The next is asked for only once that one is read, and its names (up to 150 kB of
/// BNDL lines) take several round trips on a control connection whose window never grew,
/// while a first bundle of 4 MiB takes 35 ms on a fast path: 1 Gbit/s over 20 ms sat idle
/// 60 ms between bundles with one waiting, and 100 ms with two.
const BUNDLES_AHEAD: usize = 4;

/// Downloads the small files at the head of the queue requested ahead (with `alone`, only
/// those a failed bundle held).
#[allow(clippy::too_many_arguments)]
fn get_ahead(
    c: &mut Control,
    work: &Work,
    results: &Results,
    server: &Target,
    update: bool,
    alone: bool,
    stop: &Stop<'_>,
    done: &(impl Fn(&Summary) + Sync),
) -> bool {
    Ahead {
        most: pipeline::MOST_AHEAD,
        fits: |j: &Job| fits_ahead(j, update) && (j.alone || !alone),
        prepare: |job: &Job| wanted(job, update),
        request: |c: &mut Control, ask: &mut [(Job, Wanted)]| {
            pipeline::request(c, ask.iter().map(|(_, w)| w))
        },
        moved: |c: &mut Control, job: &Job, wanted: Wanted| {
            let s = pipeline::receive_next(c, &wanted, server)?;
            if let Some(m) = job.mtime {
                set_mtime(&job.local, m);
            }
            done(&s);
            Ok(s)
        },
    }
    .run(c, work, results, stop)
}

/// Uploads the small files at the head of the queue announced ahead.
fn put_ahead(
    c: &mut Control,
    work: &Work,
    results: &Results,
    server: &Target,
    stop: &Stop<'_>,
    done: &(impl Fn(&Summary) + Sync),
) -> bool {
    let buf = std::cell::RefCell::new(Vec::new());
    let times = std::cell::RefCell::new(Vec::new());
    let gridftp = super::peer::Peer::of(c) == Some(super::peer::Peer::GridFtp);
    let ok = Ahead {
        most: match gridftp {
            true => pipeline::GRIDFTP_UPLOADS_AHEAD,
            false => pipeline::MOST_AHEAD,
        },
        fits: |j: &Job| j.size.is_some_and(|s| s <= pipeline::MAX_SIZE),
        prepare: |job: &Job| {
            let wanted = Wanted {
                remote: job.remote.clone(),
                local: job.local.clone(),
                size: job.size.unwrap_or(0),
            };
            match gridftp {
                true => pipeline::Outgoing::open(wanted).map(Some),
                false => Ok(Some(pipeline::Outgoing::to_read(wanted))),
            }
        },
        request: |c: &mut Control, ask: &mut [(Job, pipeline::Outgoing)]| {
            if gridftp {
                let files: Vec<_> = ask.iter().map(|(_, o)| o).collect();
                return pipeline::store(c, &files);
            }
            let mut files: Vec<_> = ask.iter_mut().map(|(_, o)| o).collect();
            pipeline::announce(c, &mut files, &mut buf.borrow_mut())
        },
        moved: |c: &mut Control, job: &Job, outgoing: pipeline::Outgoing| {
            let s = if gridftp {
                pipeline::stored_next(c, outgoing, server)?
            } else {
                pipeline::send_next(c, outgoing, server)?
            };
            let mut times = times.borrow_mut();
            times.extend(keep_time(c, job));
            if times.len() >= TIMES_PER_WRITE {
                send_times(c, &mut times);
            }
            done(&s);
            Ok(s)
        },
    }
    .run(c, work, results, stop);
    send_times(c, &mut times.borrow_mut());
    ok
}

/// MFMTs sent in one write: one each would cost a write and a server wake-up per file
/// (10,000 small files' upload took 12 % longer so).
const TIMES_PER_WRITE: usize = 64;

/// Whether a download's destination already has its size and is not older than `mtime`
/// (`--update`).
fn already_here(job: &Job, mtime: Option<i64>) -> bool {
    let (Some(size), Ok(m)) = (job.size, std::fs::metadata(&job.local)) else {
        return false;
    };
    up_to_date((size, mtime), (m.len(), unix_seconds(&m)))
}

/// Whether an error leaves the session unusable for the next file: a file the server refused
/// or a local write that failed does not; a broken connection or a confused dialogue does.
fn breaks_session(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connect { .. }
            | ClientError::ControlLost(_)
            | ClientError::Interrupted { .. }
            | ClientError::Protocol(_)
            | ClientError::Tls(_)
    )
}

/// A remote path as the summary shows it.
fn shown(remote: &str) -> String {
    format!("/{}", remote.trim_start_matches('/'))
}

/// Creates a local directory of the tree (and its parents), refusing to go through a symbolic
/// link: one planted in the destination would send the files elsewhere.
fn local_dir(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) => Err(ClientError::Local {
            what: format!("cannot put a directory at {}", path.display()),
            cause: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "it exists and is {} (not followed): move it away",
                    kind_of(&m)
                ),
            ),
        }),
        Err(_) => std::fs::create_dir_all(path).map_err(|cause| ClientError::Local {
            what: format!("cannot create directory {}", path.display()),
            cause,
        }),
    }
}

/// Whether a local directory ignores case (vfat, exFAT, ext4 with casefold): found by making a
/// file and looking for it under another case.
fn case_insensitive(dir: &Path) -> bool {
    let name = format!(".braid-case-{}", std::process::id());
    let probe = dir.join(&name);
    if std::fs::File::create_new(&probe).is_err() {
        return false;
    }
    let folded = dir.join(name.to_uppercase()).exists();
    let _ = std::fs::remove_file(&probe);
    folded
}

/// Why a remote entry that is neither a file nor a directory is left out.
fn remote_kind(kind: Option<&str>, e: &ListEntry) -> String {
    match kind {
        Some(k) if k.contains("link") => "a symbolic link (not followed)".into(),
        Some(k) => format!("not a regular file or directory (type {k})"),
        None => format!(
            "a listing line braid cannot read: {}",
            e.raw.as_deref().unwrap_or(&e.name)
        ),
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "a symbolic link (not followed)"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file or directory"
    }
}

/// MDTM of a remote file, seconds since the epoch (UTC), if the server says.
pub(super) fn remote_mtime(c: &mut Control, path: &str) -> Option<i64> {
    let r = c.cmd(&Command::Mdtm(path.into())).ok()?;
    if r.code != 213 {
        return None;
    }
    braid_proto::time::Civil::parse_mdtm(r.text().trim()).map(|c| c.to_unix())
}

fn unix_seconds(meta: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    meta.mtime()
}

/// The MFMT that gives an uploaded file its local modification time on the server, where
/// FEAT lists MFMT (as downloads keep the server's times).
fn keep_time(c: &Control, job: &Job) -> Option<Command> {
    let t = job.mtime?;
    c.has_feature("MFMT")
        .then(|| Command::Mfmt(t, job.remote.clone()))
}

/// Sends the MFMTs gathered, in one write. Their answers are read in turn behind the requests
/// already in flight, and whatever they are only the times are at stake: a refusal is not a
/// file's failure, and a broken session shows at the next request.
fn send_times(c: &mut Control, times: &mut Vec<Command>) {
    if !times.is_empty() {
        let _ = c.later_all(times.drain(..).map(Op::Ask));
    }
}

/// Gives a downloaded file or directory the server's modification time; a failure only
/// loses the time.
/// Sets a file's modification time by its name (one syscall: a tree sets thousands).
fn set_mtime(path: &Path, unix: i64) {
    use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, UTIME_OMIT, utimensat};
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: unix,
            tv_nsec: 0,
        },
    };
    let _ = utimensat(CWD, path, &times, AtFlags::empty());
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::client::testing::listed as entry;

    fn job(remote: &str, size: Option<u64>) -> Job {
        Job {
            remote: remote.into(),
            local: PathBuf::from(format!("/tmp/x/{remote}")),
            size,
            exact: true,
            alone: false,
            mtime: None,
        }
    }

    fn work(jobs: Vec<Job>) -> Work {
        let server = Target {
            gsi: false,
            host: "h".into(),
            port: 21,
            user: "anonymous".into(),
            password: String::new(),
            path: String::new(),
        };
        Work::new(jobs, &Options::default(), "get", &server)
    }

    #[test]
    fn a_recursive_listing_is_split_into_its_directories() {
        let all = vec![
            entry("a", "dir"),
            entry("a/f", "file"),
            entry("a/b", "dir"),
            entry("a/b/g", "file"),
            entry("top.txt", "file"),
        ];
        let mut listed = Listed::by_directory(all);
        let top: Vec<String> = listed.take("").into_iter().map(|e| e.name).collect();
        assert_eq!(top, ["a", "top.txt"]);
        let a: Vec<String> = listed.take("a").into_iter().map(|e| e.name).collect();
        assert_eq!(a, ["f", "b"], "names are relative to their directory");
        assert_eq!(listed.take("a/b").len(), 1);
        assert!(listed.take("a/b").is_empty(), "taken once");
        let mut out = TreeSummary::new("get-tree");
        listed.report_strays("pub", &mut out);
        assert!(out.failed.is_empty(), "{:?}", out.failed);
    }

    #[test]
    fn entries_under_paths_that_are_no_directory_of_the_tree_are_refused_once() {
        let all = vec![
            entry("a", "dir"),
            entry("a/f", "file"),
            // Made-up paths: absolute, a doubled slash, and under a directory never listed.
            entry("/etc/passwd", "file"),
            entry("a//x", "file"),
            entry("ghost/y", "file"),
            entry("ghost/z", "file"),
        ];
        let mut listed = Listed::by_directory(all);
        listed.take("");
        listed.take("a");
        let mut out = TreeSummary::new("get-tree");
        listed.report_strays("pub/", &mut out);
        let refused: Vec<&str> = out.failed.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(refused, ["/pub//etc/passwd", "/pub/a//x", "/pub/ghost"]);
        assert!(out.failed.iter().all(|f| f.exit_code == exit::PROTOCOL));
    }

    #[test]
    fn the_queue_gives_files_in_order_and_takes_one_back_at_its_front() {
        let w = work(vec![
            job("a", Some(1)),
            job("b", Some(1 << 30)),
            job("c", None),
        ]);
        let first = w.next().expect("a");
        assert_eq!(first.remote, "a");
        w.put_back(first);
        assert_eq!(w.next().map(|j| j.remote), Some("a".into()));
        // Only a small file goes ahead of its turn.
        let small = |j: &Job| j.size.is_some_and(|s| s <= pipeline::MAX_SIZE);
        assert!(w.next_if(small).is_none(), "b is large: it stays");
        assert_eq!(w.next().map(|j| j.remote), Some("b".into()));
        assert!(!w.is_empty());
        assert_eq!(w.next().map(|j| j.remote), Some("c".into()));
        assert!(w.is_empty() && w.next().is_none());
    }

    #[test]
    fn what_each_file_came_to_is_recorded_in_the_order_they_ended() {
        let w = work(vec![job("a", Some(5)), job("b", None)]);
        let results: Results = Mutex::new(Vec::new());
        w.record(&job("a", Some(5)), Moved::Done(5), &results);
        let e = ClientError::Protocol("x".into());
        w.record(&job("b", None), Moved::Failed("/b".into(), e), &results);
        let r = results.into_inner().expect("results");
        assert!(matches!(r[0], Moved::Done(5)));
        assert!(matches!(&r[1], Moved::Failed(p, _) if p == "/b"));
    }

    #[test]
    fn a_tree_exits_0_when_all_moved_11_when_some_failed_and_7_when_stopped() {
        let mut out = TreeSummary::new("put-tree");
        assert_eq!(out.exit_code(), exit::OK);
        out.skip("link", "a symbolic link (not followed)");
        assert_eq!(out.exit_code(), exit::OK, "a skipped link is no failure");
        out.fail("f", &ClientError::Protocol("x".into()));
        assert_eq!(out.exit_code(), exit::SOME_FAILED);
        out.interrupted = true;
        assert_eq!(out.exit_code(), exit::INTERRUPTED);
        let done = out.finished();
        assert!(done.seconds >= 0.0 && done.bytes_per_second == 0.0);
    }

    #[test]
    fn a_session_survives_a_refused_file_but_not_a_broken_connection() {
        let refused = ClientError::Remote {
            what: "RETR x".into(),
            reply: braid_proto::Reply::new(550, "no"),
        };
        assert!(!breaks_session(&refused));
        let local = ClientError::Local {
            what: "w".into(),
            cause: std::io::Error::other("full"),
        };
        assert!(!breaks_session(&local));
        assert!(breaks_session(&ClientError::ControlLost("gone".into())));
        assert!(breaks_session(&ClientError::Protocol("confused".into())));
    }

    #[test]
    fn files_are_named_by_the_side_they_come_from() {
        let j = job("//pub/a", Some(1));
        assert_eq!(j.named("get"), "/pub/a");
        assert_eq!(j.named("put"), "/tmp/x///pub/a");
        assert_eq!(shown("x/y"), "/x/y");
        let link = remote_kind(Some("OS.unix=symlink"), &entry("l", "x"));
        assert!(link.contains("symbolic link"));
        let mut e = entry("?", "x");
        e.raw = Some("garbage line".into());
        assert!(remote_kind(None, &e).contains("garbage line"));
    }

    #[test]
    fn a_local_directory_is_created_but_never_through_a_symbolic_link() {
        let dir = tempfile::tempdir().expect("tmp");
        let deep = dir.path().join("a/b/c");
        local_dir(&deep).expect("created");
        assert!(deep.is_dir());
        local_dir(&deep).expect("already there");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("a"), &link).expect("symlink");
        let e = local_dir(&link).expect_err("a link is not followed");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(local_dir(&file).is_err());
    }

    #[test]
    fn a_file_of_the_same_size_and_not_older_is_already_here() {
        let dir = tempfile::tempdir().expect("tmp");
        let local = dir.path().join("f");
        std::fs::write(&local, b"12345").expect("write");
        let mtime = unix_seconds(&std::fs::metadata(&local).expect("stat"));
        let mut j = job("f", Some(5));
        j.local = local;
        assert!(already_here(&j, Some(mtime)));
        assert!(!already_here(&j, Some(mtime + 3600)), "the source is newer");
        j.size = Some(6);
        assert!(!already_here(&j, Some(mtime)), "another size");
        j.size = None;
        assert!(!already_here(&j, Some(mtime)), "size unknown");
    }

    #[test]
    fn a_downloaded_file_takes_the_servers_time_and_a_case_sensitive_dir_is_found_so() {
        let dir = tempfile::tempdir().expect("tmp");
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").expect("write");
        set_mtime(&f, 1_700_000_000);
        let m = std::fs::metadata(&f).expect("stat");
        assert_eq!(unix_seconds(&m), 1_700_000_000);
        // tmpfs and ext4 without casefold tell a from A; the probe leaves nothing behind.
        assert!(!case_insensitive(dir.path()));
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1);
    }

    #[test]
    fn a_recursive_transfer_is_one_server() {
        let a = work(Vec::new()).server;
        let mut b = a.clone();
        assert!(one_server([&a, &b].into_iter()).is_ok());
        b.port = 2121;
        let e = one_server([&a, &b].into_iter()).unwrap_err();
        assert!(e.to_string().contains("another server"), "{e}");
        assert!(one_server(std::iter::empty()).is_err());
    }

    #[test]
    fn directories_are_made_one_mkd_each_and_refusals_do_not_stop_the_rest() {
        use super::super::testing::{done, scripted};
        let (mut c, server) = scripted(b"257 made\r\n550 exists\r\n257 made\r\n");
        make_dirs(&mut c, &["a".into(), "a/b".into(), "c".into()]);
        assert_eq!(done(c, server), "MKD a\r\nMKD a/b\r\nMKD c\r\n");
    }

    #[test]
    fn a_remote_files_time_comes_from_mdtm_and_is_kept_with_mfmt_where_offered() {
        use super::super::testing::{done, scripted};
        let (mut c, server) = scripted(b"213 20260102030405\r\n550 no\r\n");
        assert_eq!(remote_mtime(&mut c, "f"), Some(1_767_323_045));
        assert_eq!(remote_mtime(&mut c, "g"), None);
        let mut j = job("f", Some(1));
        j.mtime = Some(1_767_323_045);
        assert!(keep_time(&c, &j).is_none(), "no MFMT in FEAT");
        assert_eq!(done(c, server), "MDTM f\r\nMDTM g\r\n");
    }
}
