//! The house has no circles: no two source files of a crate import each other, directly or
//! through others (`crate::` and `super::` paths, in `use` and inline; unit tests at a file's
//! end left out). A circle means two modules can only be understood together; the fix is
//! usually to move the shared vocabulary down a floor.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every module of the crate whose source is under `src`, by path, with its file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut m: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    m.pop();
                }
                out.insert(m, p);
            }
        }
    }
    out
}

/// The text a file's imports are read from: without comments and without a unit-test module
/// at its end.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths a `crate::`/`super::` path at `at` in `text` names (several for a group).
fn paths_at(text: &str, at: usize) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let rest = &text[at..];
    let mut parts = Vec::new();
    let mut i = 0;
    loop {
        let word: String = rest[i..].chars().take_while(|&c| ident(c)).collect();
        if word.is_empty() {
            break;
        }
        i += word.len();
        parts.push(word);
        if rest[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    let mut out = vec![parts.clone()];
    if rest[i..].starts_with('{') {
        let mut depth = 0;
        let mut end = i;
        for (k, c) in rest[i..].char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                end = i + k;
                break;
            }
        }
        for item in rest[i + 1..end].split(',') {
            let item = item.split('{').next().unwrap_or("").trim();
            if !item.is_empty() && item != "self" {
                let mut p = parts.clone();
                p.extend(item.split("::").map(|s| s.trim().to_string()));
                out.push(p);
            }
        }
    }
    out
}

fn graph(
    src: &Path,
) -> (
    BTreeMap<Module, PathBuf>,
    BTreeMap<Module, BTreeSet<Module>>,
) {
    let mods = modules(src);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, file) in &mods {
        let text = code(file);
        let mut targets = Vec::new();
        for (at, _) in text.match_indices("crate::") {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // braid_proto::... is another crate's path
            }
            targets.extend(paths_at(&text, at + "crate::".len()));
        }
        for (at, _) in text.match_indices("super::") {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // the second `super` of super::super:: is counted with the first
            }
            // `super` of a/mod.rs (module a) and of a/c.rs (module a::c) alike: the module
            // above the one the file is.
            let mut base: Module = m[..m.len().saturating_sub(1)].to_vec();
            let mut parts_at = at + "super::".len();
            while text[parts_at..].starts_with("super::") {
                base.pop();
                parts_at += "super::".len();
            }
            for p in paths_at(&text, parts_at) {
                let mut t = base.clone();
                t.extend(p);
                targets.push(t);
            }
        }
        for t in targets {
            let hit = (1..=t.len())
                .rev()
                .map(|k| t[..k].to_vec())
                .find(|k| mods.contains_key(k));
            if let Some(r) = hit {
                // A parent named alone (a `use super::X` of an item in mod.rs) is an import;
                // the parent that declares a child is not one of the child's.
                let own_parent_item =
                    r.len() < m.len() && m[..r.len()] == r[..] && t.len() == r.len();
                if r != *m && !own_parent_item {
                    edges.entry(m.clone()).or_default().insert(r);
                }
            }
        }
    }
    (mods, edges)
}

/// The groups of modules that import each other (Tarjan's strongly connected components of
/// more than one module).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>, all: &[Module]) -> Vec<Vec<Module>> {
    struct T<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on: BTreeSet<Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit(t: &mut T<'_>, v: &Module) {
        t.index.insert(v.clone(), t.next);
        t.low.insert(v.clone(), t.next);
        t.next += 1;
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let next: Vec<Module> = t.edges.get(v).into_iter().flatten().cloned().collect();
        for w in next {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let l = t.low[v].min(t.low[&w]);
                t.low.insert(v.clone(), l);
            } else if t.on.contains(&w) {
                let l = t.low[v].min(t.index[&w]);
                t.low.insert(v.clone(), l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == *v;
                c.push(w);
                if done {
                    break;
                }
            }
            if c.len() > 1 {
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in all {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut srcs = vec![top.join("src")];
    for e in std::fs::read_dir(top.join("crates")).unwrap() {
        srcs.push(e.unwrap().path().join("src"));
    }
    let mut found = Vec::new();
    for src in &srcs {
        let (mods, edges) = graph(src);
        assert!(!mods.is_empty(), "no modules under {}", src.display());
        let all: Vec<Module> = mods.keys().cloned().collect();
        for c in circles(&edges, &all) {
            let mut files: Vec<String> = c.iter().map(|m| mods[m].display().to_string()).collect();
            files.sort();
            found.push(files.join(", "));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The check finds a circle where there is one (so that its silence means something).
#[test]
fn the_layering_check_sees_a_circle() {
    let dir = crate::util::tempdir();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "use crate::b::Thing;\npub mod c;\n").unwrap();
    std::fs::write(src.join("a/c.rs"), "use super::super::b;\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing;\nuse crate::{a::c, a};\n",
    )
    .unwrap();
    let (mods, edges) = graph(src);
    let all: Vec<Module> = mods.keys().cloned().collect();
    let found = circles(&edges, &all);
    assert_eq!(found.len(), 1, "{edges:?}");
    let mut names: Vec<String> = found[0].iter().map(|m| m.join("/")).collect();
    names.sort();
    assert_eq!(names, ["a", "a/c", "b"]);
}
