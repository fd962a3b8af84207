//! The shared objects a program needs, found the way the dynamic loader
//! finds them (ld.so(8)), without running it.
//!
//! Search order for each `DT_NEEDED` name without a slash: `DT_RPATH` of
//! the requesting object and of the executable (only when the requester has
//! no `DT_RUNPATH`), `LD_LIBRARY_PATH`, the requester's `DT_RUNPATH`, the
//! directories of `/etc/ld.so.conf` (standing in for `ld.so.cache`, which
//! is built from them), then the default directories. `$ORIGIN` expands to
//! the requester's directory. Candidates that are not x86-64 ELF files are
//! skipped, as the loader skips them.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use papirus_substrate::elf::ElfFile;

/// Directories the loader searches last on x86-64 Debian and Fedora layouts.
const DEFAULT_DIRS: [&str; 6] =
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];
const LD_SO_CONF: &str = "/etc/ld.so.conf";
/// `include` nesting beyond which ld.so.conf is assumed to loop.
const MAX_CONF_DEPTH: usize = 8;
/// `e_machine` of x86-64.
const EM_X86_64: u16 = 62;

/// A needed object, found or not.
#[derive(Debug)]
pub enum Dependency {
    /// Found at this path.
    Found {
        /// The `DT_NEEDED` name (or the interpreter path).
        name: String,
        /// Where the search found it.
        path: PathBuf,
        /// The parsed file.
        elf: Arc<ElfFile>,
    },
    /// Not found in any searched directory.
    Missing {
        /// The `DT_NEEDED` name.
        name: String,
        /// The object that asked for it.
        needed_by: PathBuf,
    },
}

/// Every object `main` (at `main_path`) needs, breadth-first as the loader
/// loads them, then its interpreter; each name once.
pub fn resolve(main: &ElfFile, main_path: &Path) -> Vec<Dependency> {
    let conf_dirs = ld_so_conf_dirs(Path::new(LD_SO_CONF), 0);
    let env_dirs: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let main_rpath = search_list(main.rpath(), main_path);
    let mut out = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut queue: VecDeque<(String, PathBuf, Option<Arc<ElfFile>>)> =
        main.needed().iter().map(|n| (n.clone(), main_path.to_path_buf(), None)).collect();
    // The requester of each queued name is kept as (path, parsed file) so
    // its RPATH/RUNPATH apply; None means the main program.
    while let Some((name, requester_path, requester)) = queue.pop_front() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let req: &ElfFile = requester.as_deref().unwrap_or(main);
        let mut dirs: Vec<PathBuf> = Vec::new();
        if req.runpath().is_none() {
            dirs.extend(search_list(req.rpath(), &requester_path));
            if main.runpath().is_none() {
                dirs.extend(main_rpath.iter().cloned());
            }
        }
        dirs.extend(env_dirs.iter().cloned());
        dirs.extend(search_list(req.runpath(), &requester_path));
        dirs.extend(conf_dirs.iter().cloned());
        dirs.extend(DEFAULT_DIRS.iter().map(PathBuf::from));
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![PathBuf::from(&name)]
        } else {
            dirs.iter().map(|d| d.join(&name)).collect()
        };
        match candidates.into_iter().find_map(|p| open_x86_64(&p).map(|elf| (p, elf))) {
            Some((path, elf)) => {
                let elf = Arc::new(elf);
                queue.extend(elf.needed().iter().map(|n| (n.clone(), path.clone(), Some(elf.clone()))));
                out.push(Dependency::Found { name, path, elf });
            }
            None => out.push(Dependency::Missing { name, needed_by: requester_path }),
        }
    }
    if let Some(interp) = main.interpreter()
        && !out
            .iter()
            .any(|d| matches!(d, Dependency::Found { path, .. } if same_file(path, Path::new(interp))))
    {
        match open_x86_64(Path::new(interp)) {
            Some(elf) => out.push(Dependency::Found {
                name: interp.to_string(),
                path: PathBuf::from(interp),
                elf: Arc::new(elf),
            }),
            None => {
                out.push(Dependency::Missing { name: interp.to_string(), needed_by: main_path.to_path_buf() })
            }
        }
    }
    out
}

fn open_x86_64(path: &Path) -> Option<ElfFile> {
    let data = papirus_substrate::input::read_file(path, papirus_substrate::input::MODULE_LIMIT).ok()?;
    ElfFile::parse(path, data).ok().filter(|e| e.machine() == EM_X86_64)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A colon-separated RPATH/RUNPATH with `$ORIGIN` expanded to the directory of `origin_file`.
fn search_list(list: Option<&str>, origin_file: &Path) -> Vec<PathBuf> {
    let origin = origin_file.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|| ".".into());
    list.map(|l| {
        l.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin)))
            .collect()
    })
    .unwrap_or_default()
}

/// The directories an ld.so.conf names, following `include` globs (`*` in the file name).
fn ld_so_conf_dirs(conf: &Path, depth: usize) -> Vec<PathBuf> {
    let Ok(bytes) = papirus_substrate::input::read_file(conf, papirus_substrate::input::CONFIG_LIMIT) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut out = Vec::new();
    for line in text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()) {
        if let Some(pattern) = line.strip_prefix("include").map(str::trim) {
            if depth >= MAX_CONF_DEPTH {
                continue;
            }
            let pattern = if pattern.starts_with('/') {
                PathBuf::from(pattern)
            } else {
                conf.parent().unwrap_or(Path::new("/")).join(pattern)
            };
            let (Some(dir), Some(file_glob)) = (pattern.parent(), pattern.file_name()) else { continue };
            let Ok(file_glob) = super::Globs::new(&[file_glob.to_string_lossy()]) else { continue };
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.file_name().is_some_and(|n| file_glob.is_match(&n.to_string_lossy())))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            for f in files {
                out.extend(ld_so_conf_dirs(&f, depth + 1));
            }
        } else if !line.starts_with("hwcap") {
            out.push(PathBuf::from(line));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_expansion() {
        let dirs = search_list(Some("$ORIGIN/lib:${ORIGIN}/../x::/opt/y"), Path::new("/a/b/prog"));
        assert_eq!(dirs, [PathBuf::from("/a/b/lib"), PathBuf::from("/a/b/../x"), PathBuf::from("/opt/y")]);
        assert!(search_list(None, Path::new("/a/prog")).is_empty());
    }

    #[test]
    fn ld_so_conf_includes() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        std::fs::create_dir_all(dir.join("conf.d")).unwrap();
        std::fs::write(dir.join("ld.so.conf"), "# comment\n/opt/first\ninclude conf.d/*.conf\n").unwrap();
        std::fs::write(dir.join("conf.d/b.conf"), "/opt/b\n").unwrap();
        std::fs::write(dir.join("conf.d/a.conf"), "/opt/a # trailing\ninclude ../ld.so.conf\n").unwrap();
        std::fs::write(dir.join("conf.d/ignored.txt"), "/opt/no\n").unwrap();
        let dirs = ld_so_conf_dirs(&dir.join("ld.so.conf"), 0);
        // The self-include loops until the depth limit, then stops.
        assert_eq!(dirs[0], PathBuf::from("/opt/first"));
        assert_eq!(dirs[1], PathBuf::from("/opt/a"));
        assert!(dirs.contains(&PathBuf::from("/opt/b")));
        assert!(!dirs.contains(&PathBuf::from("/opt/no")));
        assert!(dirs.len() < 100, "include loop bounded: {} dirs", dirs.len());
    }
}
