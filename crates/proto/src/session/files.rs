//! Commands on files and directories, and the transfer commands: each resolves its path
//! inside the user's root (no I/O: the caller does it and reports back through `fs_done` or
//! `transfer_done`).

use super::{
    Action, ChecksumAlg, Expected, FsOp, ListStyle, Session, TransferKind, path_error,
    strip_list_flags,
};
use crate::command::Command;
use crate::path::VPath;
use crate::ranges::RangeSet;
use crate::reply::Reply;

/// What a command may consume from the session's state before it runs.
pub(super) struct Pending {
    /// The user may change files.
    pub writable: bool,
    /// REST offset for a transfer command.
    pub rest: u64,
    /// REST ranges (MODE E) for a transfer command.
    pub rest_ranges: Option<RangeSet>,
    /// RNFR's path, for RNTO right after it.
    pub rename_from: Option<VPath>,
}

impl Session {
    /// BNDL: the files join the bundle, all or (if one cannot be named here) none; a refused
    /// line leaves the bundle empty, so that the RBND behind it is refused too and the client
    /// takes those files one by one.
    fn add_to_bundle(&mut self, files: Vec<crate::bundle::Named>) -> Action {
        if self.bundle_refused {
            return Action::Reply(Reply::new(
                503,
                "A BNDL line before this one was refused, and with it the bundle: end it with RBND or SBND.",
            ));
        }
        let adding: usize = files.iter().map(|f| f.path.len()).sum();
        if self.bundle.len() + files.len() > crate::bundle::MAX_FILES
            || self.bundle_names + adding > crate::bundle::MAX_NAME_BYTES
        {
            self.bundle.clear();
            self.bundle_names = 0;
            self.bundle_refused = true;
            return Action::Reply(Reply::new(
                504,
                format!(
                    "A bundle holds at most {} files and {} MiB of names; send RBND, then BNDL the rest.",
                    crate::bundle::MAX_FILES,
                    crate::bundle::MAX_NAME_BYTES >> 20
                ),
            ));
        }
        for f in files {
            match self.cwd.join(&f.path) {
                Ok(p) => self.bundle.push((p, f.size, f.mtime)),
                Err(e) => {
                    self.bundle.clear();
                    self.bundle_names = 0;
                    self.bundle_refused = true;
                    return Action::Reply(path_error(e, &f.path));
                }
            }
        }
        self.bundle_names += adding;
        Action::Reply(Reply::new(
            200,
            format!("The bundle holds {} files.", self.bundle.len()),
        ))
    }

    /// The files BNDL named, for the RBND or SBND that ends them; none if a line was refused
    /// (or none came). Either way the next BNDL starts a new bundle.
    fn take_bundle(&mut self) -> Vec<(VPath, u64, Option<i64>)> {
        self.bundle_names = 0;
        let files = std::mem::take(&mut self.bundle);
        match std::mem::take(&mut self.bundle_refused) {
            true => Vec::new(),
            false => files,
        }
    }

    /// One file or transfer command from a logged-in user.
    pub(super) fn file_command(&mut self, cmd: Command, p: Pending) -> Action {
        let Pending {
            writable,
            rest,
            rest_ranges,
            rename_from,
        } = p;
        let reply = |code, text: &str| Action::Reply(Reply::new(code, text));
        let need_write = |path: &VPath| -> Option<Action> {
            (!writable).then(|| {
                Action::Reply(Reply::new(
                    550,
                    format!("{path}: permission denied: this account is read-only."),
                ))
            })
        };
        macro_rules! resolve {
            ($arg:expr) => {
                match self.cwd.join($arg) {
                    Ok(p) => p,
                    Err(e) => return Action::Reply(path_error(e, $arg)),
                }
            };
        }
        match cmd {
            Command::Stat(Some(arg)) => {
                let p = resolve!(&strip_list_flags(&arg));
                self.fs(FsOp::StatList(p))
            }
            Command::Pwd => Action::Reply(Reply::new(
                257,
                format!("{} is the current directory.", self.cwd.quoted()),
            )),
            Command::Cwd(arg) => {
                let p = resolve!(&arg);
                self.fs(FsOp::ChangeDir(p))
            }
            Command::Cdup => match self.cwd.parent() {
                Some(p) => self.fs(FsOp::ChangeDir(p)),
                None => reply(550, "Already at the root directory."),
            },
            Command::Cksm {
                alg,
                offset,
                length,
                path,
            } => {
                let Some(alg) = ChecksumAlg::parse(&alg) else {
                    return Action::Reply(Reply::new(
                        504,
                        format!("Unsupported checksum algorithm {alg}; use XXH3, MD5 or ADLER32."),
                    ));
                };
                if alg == ChecksumAlg::Xxh3 && (offset != 0 || length.is_some()) {
                    return reply(
                        504,
                        "XXH3 covers whole files only: use offset 0 and length -1.",
                    );
                }
                let p = resolve!(&path);
                self.fs(FsOp::Checksum {
                    path: p,
                    alg,
                    offset,
                    length,
                })
            }
            Command::Scks { alg, value } => {
                if ChecksumAlg::parse(&alg) != Some(ChecksumAlg::Xxh3) {
                    return Action::Reply(Reply::new(
                        504,
                        format!("SCKS supports {} only.", crate::checksum::NAME),
                    ));
                }
                self.expect = Some(match value {
                    Some(v) => Expected::Value(v),
                    None => Expected::Deferred,
                });
                reply(200, "SCKS Command Successful.")
            }
            Command::Retr(arg) => {
                let p = resolve!(&arg);
                self.transfer(TransferKind::Retr(p), rest, rest_ranges, writable)
            }
            Command::Bundle(files) => self.add_to_bundle(files),
            Command::RetrBundle => {
                let files = self.take_bundle();
                if files.is_empty() {
                    return reply(503, "Name the files with BNDL first (all its lines taken).");
                }
                let files = files.into_iter().map(|(p, size, _)| (p, size)).collect();
                self.transfer(TransferKind::Bundle(files), rest, rest_ranges, writable)
            }
            Command::StorBundle => {
                let files = self.take_bundle();
                let Some((first, ..)) = files.first() else {
                    return reply(503, "Name the files with BNDL first (all its lines taken).");
                };
                if let Some(a) = need_write(first) {
                    return a;
                }
                if files.len() > crate::bundle::STORE_MOST {
                    return Action::Reply(Reply::new(
                        504,
                        format!(
                            "SBND stores at most {} files at a time; send the rest in another bundle.",
                            crate::bundle::STORE_MOST
                        ),
                    ));
                }
                if rest != 0 || rest_ranges.is_some() {
                    return reply(
                        504,
                        "SBND stores whole files only: send it without REST, or STOR each file.",
                    );
                }
                if self.expect.is_none() {
                    return reply(
                        503,
                        "A bundle is stored only with the checksum of all it holds: send SCKS XXH3 * first.",
                    );
                }
                self.transfer(TransferKind::StoreBundle(files), 0, None, writable)
            }
            Command::Stor(arg) => {
                let p = resolve!(&arg);
                match need_write(&p) {
                    Some(a) => a,
                    None => self.transfer(TransferKind::Stor(p), rest, rest_ranges, writable),
                }
            }
            Command::Appe(arg) => {
                let p = resolve!(&arg);
                match need_write(&p) {
                    Some(a) => a,
                    None => self.transfer(TransferKind::Appe(p), rest, rest_ranges, writable),
                }
            }
            Command::List(arg) => self.list(arg, ListStyle::Long, writable),
            Command::Nlst(arg) => self.list(arg, ListStyle::Names, writable),
            Command::Mlsd(arg) => self.list(arg, ListStyle::Machine, writable),
            Command::Mlsr(arg) => self.list(arg, ListStyle::MachineTree, writable),
            Command::Mlst(arg) => {
                let p = resolve!(arg.as_deref().unwrap_or(""));
                self.fs(FsOp::Mlst(p))
            }
            Command::Size(arg) => {
                let p = resolve!(&arg);
                let ascii = self.ascii;
                self.fs(FsOp::Size { path: p, ascii })
            }
            Command::Mdtm(arg) => {
                let p = resolve!(&arg);
                self.fs(FsOp::Mdtm(p))
            }
            Command::Mfmt(time, arg) => {
                let p = resolve!(&arg);
                need_write(&p).unwrap_or_else(|| self.fs(FsOp::SetMtime(p, time)))
            }
            Command::Dele(arg) => {
                let p = resolve!(&arg);
                need_write(&p).unwrap_or_else(|| self.fs(FsOp::Dele(p)))
            }
            Command::Mkd(arg) => {
                let p = resolve!(&arg);
                need_write(&p).unwrap_or_else(|| self.fs(FsOp::Mkd(p)))
            }
            Command::Rmd(arg) => {
                let p = resolve!(&arg);
                if p.is_root() {
                    return reply(550, "The root directory cannot be removed.");
                }
                need_write(&p).unwrap_or_else(|| self.fs(FsOp::Rmd(p)))
            }
            Command::Rnfr(arg) => {
                let p = resolve!(&arg);
                if p.is_root() {
                    return reply(550, "The root directory cannot be renamed.");
                }
                need_write(&p).unwrap_or_else(|| self.fs(FsOp::RenameFrom(p)))
            }
            Command::Rnto(arg) => {
                let Some(from) = rename_from else {
                    return reply(503, "Send RNFR first.");
                };
                let to = resolve!(&arg);
                if to.is_root() {
                    return reply(553, "Cannot rename onto the root directory.");
                }
                self.fs(FsOp::Rename { from, to })
            }
            _ => reply(500, "Not a file command."),
        }
    }
}
