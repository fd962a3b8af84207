//! Address-to-function attribution for a running process: the executable
//! mappings of `/proc/PID/maps`, each ELF file's symbols through
//! [`crate::elf`], and the load bias that turns link-time addresses into
//! run-time ones.
//!
//! Sample IPs and profil histograms are attributed with it; the probe tool
//! uses the same view of a process. Module files are read the way
//! [`crate::input::read_module`] reads them: the file the process mapped
//! (device and inode checked), bounded, never blocking.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use crate::elf::ElfFile;
use crate::error::{Error, Result};
use crate::input::{self, MODULE_LIMIT};
use crate::maps::{self, Mapping};

/// One executable mapping of a file.
#[derive(Clone, Debug)]
pub struct Module {
    /// The file, as the process maps it.
    pub path: PathBuf,
    /// Run-time address range of the mapping.
    pub range: Range<u64>,
    /// Added to a link-time address, gives the run-time address.
    pub bias: u64,
    elf: Arc<ElfFile>,
    debug: Option<Arc<ElfFile>>,
}

impl Module {
    /// The mapping `range` of `elf` at file offset `offset`; `None` when no
    /// load segment of the file covers that offset.
    pub fn new(path: PathBuf, range: Range<u64>, offset: u64, elf: Arc<ElfFile>) -> Option<Module> {
        let bias = elf.load_bias(range.start, offset)?;
        Some(Module { path, range, bias, elf, debug: None })
    }

    /// Resolves names in `debug` first: the file's separate debug symbols
    /// ([`ElfFile::debug_file`]), at the same link-time addresses.
    pub fn with_debug_symbols(mut self, debug: Arc<ElfFile>) -> Module {
        self.debug = Some(debug);
        self
    }

    /// The parsed file.
    pub fn elf(&self) -> &ElfFile {
        &self.elf
    }

    /// The function containing run-time address `addr`, if it lies in this
    /// mapping and a symbol covers it.
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        if !self.range.contains(&addr) {
            return None;
        }
        let vaddr = addr.wrapping_sub(self.bias);
        let s =
            self.debug.as_ref().and_then(|d| d.function_at(vaddr)).or_else(|| self.elf.function_at(vaddr))?;
        let start = s.address.wrapping_add(self.bias);
        Some(Resolved {
            module: self.path.clone(),
            name: s.name.clone(),
            range: start..start.saturating_add(s.size),
            offset: addr - start,
        })
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

/// A file's device (major, minor) and inode.
type FileId = ((u32, u32), u64);

/// The executable modules of one process and their symbols.
#[derive(Clone, Debug, Default)]
pub struct ProcessSymbols {
    modules: Vec<Module>,
    /// Mappings whose file could not be read or parsed, with the reason.
    skipped: Vec<(PathBuf, String)>,
}

impl ProcessSymbols {
    /// The calling process.
    pub fn current() -> Result<Self> {
        Self::of_pid(std::process::id() as i32)
    }

    /// Process `pid`, its modules read through `/proc/PID/map_files`.
    pub fn of_pid(pid: i32) -> Result<Self> {
        let path = PathBuf::from(format!("/proc/{pid}/maps"));
        let mappings = maps::read(pid).map_err(|source| Error::Io { path, source })?;
        Ok(Self::from_mappings(&mappings, |m| {
            let bytes = input::read_module(pid, m, MODULE_LIMIT).map_err(|e| e.to_string())?;
            let bytes = bytes.ok_or_else(|| "not an ELF file".to_string())?;
            ElfFile::parse(&m.name, bytes).map_err(|e| e.to_string())
        }))
    }

    /// Builds the view from parsed mappings, reading each file once with
    /// `open` (given its first executable mapping).
    pub fn from_mappings(
        mappings: &[Mapping],
        mut open: impl FnMut(&Mapping) -> std::result::Result<ElfFile, String>,
    ) -> Self {
        // One read per file: keyed by (device, inode).
        let mut cache: HashMap<FileId, Option<Arc<ElfFile>>> = HashMap::new();
        let mut out = ProcessSymbols::default();
        for m in mappings {
            let Some(path) = m.file().filter(|_| m.perms.exec) else { continue };
            let elf = cache
                .entry((m.dev, m.inode))
                .or_insert_with(|| match open(m) {
                    Ok(f) => Some(Arc::new(f)),
                    Err(e) => {
                        out.skipped.push((path.clone(), e));
                        None
                    }
                })
                .clone();
            if let Some(module) = elf.and_then(|elf| Module::new(path, m.start..m.end, m.offset, elf)) {
                out.modules.push(module);
            }
        }
        out
    }

    /// The executable modules, in address order of the maps file.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Files that are mapped executable but could not be read or parsed, and why.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    /// The function containing run-time address `addr`.
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        self.modules.iter().find(|m| m.range.contains(&addr))?.resolve(addr)
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
        assert!(syms.skipped().is_empty(), "{:?}", syms.skipped());
        let addr = here as *const () as u64;
        let r = syms.resolve(addr).expect("the test binary has a symbol table");
        assert!(r.name.contains("here"), "{r:?}");
        assert_eq!(r.range.start, addr);
        assert_eq!(r.offset, 0);
        assert!(r.range.end > addr);
        assert!(syms.resolve(addr + 1).is_some_and(|r2| r2.name == r.name && r2.offset == 1));
    }

    #[test]
    fn mappings_without_files_or_exec_are_ignored() {
        let text = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
                    7f0000001000-7f0000002000 r-xp 00000000 00:00 0   [vdso]\n";
        let syms =
            ProcessSymbols::from_mappings(&maps::parse(text).unwrap(), |_| unreachable!("nothing to open"));
        assert!(syms.modules().is_empty());
        assert!(syms.resolve(0x7f0000001000).is_none());
    }

    #[test]
    fn unreadable_files_are_reported_not_fatal_and_tried_once() {
        let text = "400000-401000 r-xp 00000000 08:01 12 /nonexistent/papirus-binary\n\
                    402000-403000 r-xp 00002000 08:01 12 /nonexistent/papirus-binary\n";
        let mut tries = 0;
        let syms = ProcessSymbols::from_mappings(&maps::parse(text).unwrap(), |_| {
            tries += 1;
            Err("gone".into())
        });
        assert!(syms.modules().is_empty());
        assert_eq!((syms.skipped().len(), tries), (1, 1));
    }
}
