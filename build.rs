//! Records the git commit braid is built from, for `braid --version`.
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    let text = match commit {
        Some(c) if dirty => format!("commit {c}, with local changes"),
        Some(c) => format!("commit {c}"),
        None => "commit unknown: not built from a git checkout".into(),
    };
    println!("cargo:rustc-env=BRAID_COMMIT={text}");
    // A new commit or checkout changes HEAD or the ref it names; an edit changes the index.
    for f in [".git/HEAD", ".git/index", ".git/refs/heads"] {
        println!("cargo:rerun-if-changed={f}");
    }
}
