//! Address-to-function attribution for a running process: the executable
//! mappings of `/proc/PID/maps`, each ELF file's symbols through
//! [`crate::elf`], and the load bias that turns link-time addresses into
//! run-time ones.
//!
//! Sample IPs and profil histograms are attributed with it; the probe tool
//! uses the same view of a process.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::elf::ElfFile;
use crate::error::{Error, Result};

/// One executable mapping of a file.
#[derive(Clone, Debug)]
pub struct Module {
    /// The file.
    pub path: PathBuf,
    /// Run-time address range of the mapping.
    pub range: Range<u64>,
    /// Added to a link-time address, gives the run-time address.
    pub bias: u64,
    elf: Arc<ElfFile>,
}

impl Module {
    /// The parsed file.
    pub fn elf(&self) -> &ElfFile {
        &self.elf
    }
}

/// A function an address falls in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The module file.
    pub module: PathBuf,
    /// The symbol name as stored (mangled).
    pub name: String,
    /// Run-time address range of the function.
    pub range: Range<u64>,
    /// The address's offset from the function start.
    pub offset: u64,
}

/// The executable modules of one process and their symbols.
#[derive(Clone, Debug, Default)]
pub struct ProcessSymbols {
    modules: Vec<Module>,
    /// Mappings whose file could not be parsed, with the reason.
    skipped: Vec<(PathBuf, String)>,
}

impl ProcessSymbols {
    /// The calling process.
    pub fn current() -> Result<Self> {
        Self::from_maps_file(Path::new("/proc/self/maps"))
    }

    /// Process `pid`.
    pub fn of_pid(pid: i32) -> Result<Self> {
        Self::from_maps_file(&PathBuf::from(format!("/proc/{pid}/maps")))
    }

    fn from_maps_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Ok(Self::from_maps(&text, |p| ElfFile::open(p)))
    }

    /// Builds the view from the text of a maps file, opening files with `open`.
    pub fn from_maps(text: &str, mut open: impl FnMut(&Path) -> Result<ElfFile>) -> Self {
        let mut cache: HashMap<PathBuf, Option<Arc<ElfFile>>> = HashMap::new();
        let mut out = ProcessSymbols::default();
        for line in text.lines() {
            let Some(m) = MapsLine::parse(line) else { continue };
            if !m.exec || !m.path.starts_with('/') {
                continue;
            }
            let path = PathBuf::from(m.path);
            let elf = cache
                .entry(path.clone())
                .or_insert_with(|| match open(&path) {
                    Ok(f) => Some(Arc::new(f)),
                    Err(e) => {
                        out.skipped.push((path.clone(), e.to_string()));
                        None
                    }
                })
                .clone();
            let Some(elf) = elf else { continue };
            let Some(bias) = elf.load_bias(m.start, m.offset) else { continue };
            out.modules.push(Module { path, range: m.start..m.end, bias, elf });
        }
        out
    }

    /// The executable modules, in address order of the maps file.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Files that are mapped executable but could not be parsed, and why.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    /// The function containing run-time address `addr`.
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        let m = self.modules.iter().find(|m| m.range.contains(&addr))?;
        let link = addr.wrapping_sub(m.bias);
        let s = m.elf.function_at(link)?;
        let start = s.address.wrapping_add(m.bias);
        Some(Resolved {
            module: m.path.clone(),
            name: s.name.clone(),
            range: start..start.saturating_add(s.size),
            offset: addr - start,
        })
    }
}

struct MapsLine<'a> {
    start: u64,
    end: u64,
    exec: bool,
    offset: u64,
    path: &'a str,
}

impl<'a> MapsLine<'a> {
    /// `start-end perms offset dev inode   path`.
    fn parse(line: &'a str) -> Option<Self> {
        let mut it = line.splitn(6, ' ');
        let (range, perms, offset) = (it.next()?, it.next()?, it.next()?);
        let _dev = it.next()?;
        let _inode = it.next()?;
        let path = it.next().unwrap_or("").trim_start();
        let (s, e) = range.split_once('-')?;
        Some(MapsLine {
            start: u64::from_str_radix(s, 16).ok()?,
            end: u64::from_str_radix(e, 16).ok()?,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn resolves_a_function_of_this_test_binary() {
        let syms = ProcessSymbols::current().unwrap();
        let addr = here as *const () as u64;
        let r = syms.resolve(addr).expect("the test binary has a symbol table");
        assert!(r.name.contains("here"), "{r:?}");
        assert_eq!(r.range.start, addr);
        assert_eq!(r.offset, 0);
        assert!(r.range.end > addr);
        assert!(syms.resolve(addr + 1).is_some_and(|r2| r2.name == r.name && r2.offset == 1));
    }

    #[test]
    fn maps_lines_without_paths_or_exec_are_ignored() {
        let text = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
                    7f0000001000-7f0000002000 r-xp 00000000 00:00 0   [vdso]\n\
                    garbage\n";
        let syms = ProcessSymbols::from_maps(text, |_| unreachable!("nothing to open"));
        assert!(syms.modules().is_empty());
        assert!(syms.resolve(0x7f0000001000).is_none());
    }

    #[test]
    fn unreadable_files_are_reported_not_fatal() {
        let text = "400000-401000 r-xp 00000000 08:01 12 /nonexistent/papirus-binary\n";
        let syms = ProcessSymbols::from_maps(text, |p| ElfFile::open(p));
        assert!(syms.modules().is_empty());
        assert_eq!(syms.skipped().len(), 1);
    }
}
