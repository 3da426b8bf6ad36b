//! Virtual paths: what a client sees, always inside its root.
//!
//! Resolution here is lexical. It refuses `..` that would climb above the root and names no
//! file system could hold; the I/O layer then opens the result beneath the root without
//! following symlinks out of it.

/// Why a client's path was refused (reply 550 or 553).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path leads outside your root directory")]
    Escapes,
    #[error("path contains a NUL or control character")]
    BadCharacter,
    #[error("path is longer than {MAX_PATH} bytes")]
    TooLong,
    #[error("names of the form .NAME{PART_SUFFIX} are reserved for uploads in progress")]
    Reserved,
}

/// Suffix of the hidden file an upload of NAME is written to until it completes
/// (`.NAME.braid-part`). Clients cannot name such files: nobody can block, read, list or
/// replace another upload's partial.
pub const PART_SUFFIX: &str = ".braid-part";

/// Whether `name` is an upload's partial file.
pub fn is_part_name(name: &str) -> bool {
    name.len() > 1 + PART_SUFFIX.len() && name.starts_with('.') && name.ends_with(PART_SUFFIX)
}

/// Longest path accepted (Linux PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// A normalised absolute path below the user's root: a list of plain names, none of them
/// empty, `.` or `..`, none containing `/`, NUL or control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VPath {
    parts: Vec<String>,
}

/// The root, for where a path is needed by reference and none is at hand.
pub(crate) static ROOT: VPath = VPath { parts: Vec::new() };

impl VPath {
    pub fn root() -> VPath {
        VPath::default()
    }

    /// Resolves `arg` (absolute, or relative to `self`) to a new path.
    pub fn join(&self, arg: &str) -> Result<VPath, PathError> {
        if arg.len() > MAX_PATH {
            return Err(PathError::TooLong);
        }
        if arg.chars().any(char::is_control) {
            return Err(PathError::BadCharacter);
        }
        let mut parts = if arg.starts_with('/') {
            Vec::new()
        } else {
            self.parts.clone()
        };
        for part in arg.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(PathError::Escapes);
                    }
                }
                name if is_part_name(name) => return Err(PathError::Reserved),
                name => parts.push(name.to_string()),
            }
        }
        Ok(VPath { parts })
    }

    pub fn parent(&self) -> Option<VPath> {
        let mut parts = self.parts.clone();
        parts.pop()?;
        Some(VPath { parts })
    }

    /// The last name, `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        self.parts.last().map(String::as_str)
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The path relative to the root, for opening beneath a root directory handle: `.` for the
    /// root itself.
    pub fn relative(&self) -> String {
        if self.parts.is_empty() {
            ".".to_string()
        } else {
            self.parts.join("/")
        }
    }

    /// Quotes the path for a 257 reply: RFC 959 doubles embedded quotes.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.to_string().replace('"', "\"\""))
    }
}

impl std::fmt::Display for VPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("/");
        }
        for p in &self.parts {
            write!(f, "/{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn resolves_relative_absolute_and_dots() {
        let cwd = VPath::root().join("pub/docs").unwrap();
        assert_eq!(cwd.to_string(), "/pub/docs");
        assert_eq!(cwd.join("../a/./b//c").unwrap().to_string(), "/pub/a/b/c");
        assert_eq!(cwd.join("/etc/passwd").unwrap().to_string(), "/etc/passwd");
        assert_eq!(cwd.join("..").unwrap().join("..").unwrap(), VPath::root());
        assert_eq!(cwd.join("../../.."), Err(PathError::Escapes));
        assert_eq!(VPath::root().join("a/../../b"), Err(PathError::Escapes));
        assert_eq!(VPath::root().join("a\0b"), Err(PathError::BadCharacter));
        assert_eq!(VPath::root().join("a\r\nb"), Err(PathError::BadCharacter));
        assert_eq!(
            VPath::root().join("d/.f.bin.braid-part"),
            Err(PathError::Reserved)
        );
        assert_eq!(
            VPath::root().join(".braid-part").unwrap().relative(),
            ".braid-part"
        );
        assert!(VPath::root().join("f.braid-part").is_ok());
        assert_eq!(VPath::root().relative(), ".");
        assert_eq!(
            VPath::root().join("say \"hi\"").unwrap().quoted(),
            "\"/say \"\"hi\"\"\""
        );
    }

    proptest! {
        /// Whatever the input, a resolved path has only plain names in it.
        #[test]
        fn resolved_paths_are_plain(cwd in "[a-z./]{0,20}", arg in "[a-z./\\\\%]{0,40}") {
            let Ok(base) = VPath::root().join(&cwd) else { return Ok(()) };
            if let Ok(p) = base.join(&arg) {
                for part in p.parts() {
                    prop_assert!(!part.is_empty() && part != "." && part != ".." && !part.contains('/'));
                }
                prop_assert_eq!(VPath::root().join(&p.to_string()).unwrap(), p);
            }
        }
    }
}
