//! `braid passwd`: an account in a users file for `braid serve --users`.

use crate::client::error::exit;
use crate::users;
use anyhow::{Context, bail};
use braid_proto::session::Perm;
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PasswdArgs {
    user: String,
    /// The users file to update (created if missing).
    #[arg(long)]
    file: PathBuf,
    /// The user's root directory (relative paths are relative to the users file).
    #[arg(long)]
    root: PathBuf,
    /// Let the user upload, delete, rename and create directories.
    #[arg(long)]
    rw: bool,
}

pub fn run(a: PasswdArgs) -> anyhow::Result<u8> {
    let password = read_new_password()?;
    let perm = if a.rw {
        Perm::ReadWrite
    } else {
        Perm::ReadOnly
    };
    users::write_entry(&a.file, &a.user, &password, perm, &a.root)?;
    eprintln!(
        "braid: {} user {} in {} (root {})",
        if a.rw { "read-write" } else { "read-only" },
        a.user,
        a.file.display(),
        a.root.display()
    );
    let resolved = users::base_of(&a.file).join(&a.root);
    if !resolved.is_dir() {
        eprintln!(
            "braid: warning: {} is not a directory; {} cannot log in until it is created",
            resolved.display(),
            a.user
        );
    }
    Ok(exit::OK)
}

fn read_new_password() -> anyhow::Result<String> {
    let pw = if std::io::stdin().is_terminal() {
        let a = rpassword::prompt_password("New password: ")?;
        let b = rpassword::prompt_password("Again: ")?;
        if a != b {
            bail!("the passwords differ");
        }
        a
    } else {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("cannot read the password from stdin")?;
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    if pw.is_empty() {
        bail!("empty password");
    }
    Ok(pw)
}
