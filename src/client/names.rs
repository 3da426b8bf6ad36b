//! Which names from a listing a recursive transfer may use as one path component here or on
//! the server. A hostile or broken server can list `../../.bashrc`, `a/b` or a name with a
//! CR LF that would end an FTP command early; none of them may reach a path or a command.

/// Why `name` cannot be one component of a path, or None when it can.
pub fn unsafe_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("an empty name");
    }
    if name == "." || name == ".." {
        return Some("a name that means this or the parent directory");
    }
    if name.contains('/') {
        return Some("a name with a / in it (it would reach into another directory)");
    }
    if name.chars().any(char::is_control) {
        return Some(
            "a name with a control character in it (a line break would end the FTP command)",
        );
    }
    // NAME_MAX on Linux filesystems, and what most FTP servers accept.
    if name.len() > 255 {
        return Some("a name longer than 255 bytes");
    }
    None
}

/// The names that only differ from an earlier one by case, for destinations where that makes
/// them the same file (a case-insensitive filesystem): the second would overwrite the first.
pub fn case_collisions<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .filter(|n| !seen.insert(n.to_lowercase()))
        .collect()
}

/// Whether a transfer to a file that already holds `(dest_size, dest_mtime)` can be skipped by
/// `--update`: the sizes match and the destination is not older than the source (to the
/// second). Without the source's time, the size decides.
pub fn up_to_date(source: (u64, Option<i64>), dest: (u64, i64)) -> bool {
    let (size, mtime) = source;
    size == dest.0 && mtime.is_none_or(|m| dest.1 >= m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_directory_or_break_a_command_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/etc",
            "x\r\nDELE y",
            "tab\there",
            "nul\0",
        ] {
            assert!(unsafe_name(bad).is_some(), "{bad:?} was accepted");
        }
        assert!(unsafe_name(&"n".repeat(256)).is_some());
        for good in [
            "a",
            "..a",
            "a..",
            ".hidden",
            "naïve café.txt",
            "日本語",
            "a b",
            "a\\b",
        ] {
            assert_eq!(unsafe_name(good), None, "{good:?} was refused");
        }
        assert_eq!(unsafe_name(&"n".repeat(255)), None);
    }

    #[test]
    fn only_the_later_of_two_names_equal_but_for_case_collides() {
        let names = ["Readme", "data", "README", "Data", "other", "ÉTÉ", "été"];
        assert_eq!(case_collisions(names), vec!["README", "Data", "été"]);
        assert!(case_collisions(["a", "b"]).is_empty());
    }

    #[test]
    fn a_file_is_up_to_date_when_sizes_match_and_it_is_not_older() {
        assert!(up_to_date((10, Some(100)), (10, 100)));
        assert!(up_to_date((10, Some(100)), (10, 200)));
        assert!(!up_to_date((10, Some(100)), (10, 99)));
        assert!(!up_to_date((10, Some(100)), (11, 100)));
        assert!(up_to_date((10, None), (10, 0)));
        assert!(!up_to_date((10, None), (9, 0)));
    }
}
