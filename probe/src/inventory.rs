//! The function inventory: every module of a program or process, its
//! functions with run-time addresses, its PLT stubs, and a lazy first look
//! at whether each function's entry can be patched.
//!
//! Built on [`papirus_substrate::elf`], the one ELF reader of papirus. A
//! process's modules come from `/proc/PID/maps`: each file with an
//! executable mapping that is an ELF file, with its load bias computed from
//! its first mapping. A file listed without a process has bias 0, so its
//! addresses are link-time addresses (what `nm` prints).
//!
//! # Caveats
//! - A file mapped twice (`dlmopen` namespaces) is one module, placed at its
//!   first mapping.
//! - The vDSO is not a file and is not listed.

pub mod deps;
pub mod ifunc;
pub mod patchable;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use papirus_substrate::elf::{Binding, ElfFile, ElfKind, PltStub, Symbol, SymbolKind, Table};
use serde::Serialize;

use papirus_substrate::input;
use papirus_substrate::maps::{self, Mapping};
pub use patchable::{Patchability, Prologue, Reason};

/// Failures particular to building an inventory (ELF failures come as
/// [`papirus_substrate::Error`] through [`crate::Error::Substrate`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    /// A program name that is neither a file nor found on `PATH`.
    #[error(
        "program `{program}` not found (not a file, and not in any directory of PATH); give a path to the executable"
    )]
    ProgramNotFound {
        /// The name given.
        program: String,
    },
    /// No process has this id.
    #[error("no process with pid {pid}; check it with `ps -p {pid}`")]
    NoSuchProcess {
        /// The pid given.
        pid: i32,
    },
    /// `/proc/PID/maps` exists but cannot be read.
    #[error(
        "cannot read /proc/{pid}/maps: {source}; reading another user's process needs the same uid or root (ptrace access mode)"
    )]
    Maps {
        /// The pid.
        pid: i32,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file without any function symbol: no `.symtab` and no `.dynsym` functions.
    #[error("{}: no function symbols: no .symtab (stripped) and no function exported in .dynsym; no function can be named; use an unstripped build", .path.display())]
    NoSymbols {
        /// The file.
        path: PathBuf,
    },
    /// A glob the matcher cannot take (a list too large to compile).
    #[error("function globs: {0}")]
    Globs(#[from] globset::Error),
    /// A process without any mapped ELF file: a kernel thread, or a zombie.
    #[error("process {pid} maps no executable file (a kernel thread or a zombie?): nothing to list")]
    NoModules {
        /// The pid.
        pid: i32,
    },
}

/// A function of a module, at its run-time address.
#[derive(Clone, Debug, Serialize)]
pub struct Function {
    /// The symbol name as stored (mangled for C++ and Rust).
    pub name: String,
    /// The demangled name, for C++ and Rust symbols.
    pub demangled: Option<String>,
    /// The symbol version (`GLIBC_2.14`) of a versioned dynamic symbol.
    pub version: Option<String>,
    /// Whether that version is hidden (`name@VER`) rather than the default (`name@@VER`).
    pub hidden_version: bool,
    /// Run-time address: link-time address plus the module's load bias.
    pub address: u64,
    /// Link-time address (`st_value`).
    pub link_address: u64,
    /// Size in bytes, 0 when the symbol does not say.
    pub size: u64,
    /// Binding.
    pub binding: Binding,
    /// Function, ifunc resolver, or untyped code label.
    pub kind: SymbolKind,
    /// Section holding it.
    pub section: String,
    /// `.symtab`, `.dynsym` or both.
    pub table: Table,
    #[serde(skip)]
    patchability: OnceLock<Patchability>,
}

impl Function {
    fn from_symbol(s: &Symbol, bias: u64) -> Function {
        Function {
            demangled: papirus_substrate::demangle::demangle(&s.name),
            name: s.name.clone(),
            version: s.version.clone(),
            hidden_version: s.hidden_version,
            address: s.address.wrapping_add(bias),
            link_address: s.address,
            size: s.size,
            binding: s.binding,
            kind: s.kind,
            section: s.section.clone(),
            table: s.table,
            patchability: OnceLock::new(),
        }
    }

    /// The demangled name if there is one, else the stored name.
    pub fn display_name(&self) -> &str {
        self.demangled.as_deref().unwrap_or(&self.name)
    }

    /// The display name with its version as `nm -D` shows it (`memcpy@@GLIBC_2.14`).
    pub fn versioned_name(&self) -> String {
        match &self.version {
            Some(v) => format!("{}{}{v}", self.display_name(), if self.hidden_version { "@" } else { "@@" }),
            None => self.display_name().to_string(),
        }
    }
}

/// A PLT stub at its run-time address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plt {
    /// The imported function.
    pub name: String,
    /// Its required version.
    pub version: Option<String>,
    /// Run-time address of the stub.
    pub address: u64,
    /// Run-time address of the GOT slot it jumps through.
    pub got: u64,
    /// `.plt`, `.plt.sec` or `.plt.got`.
    pub section: String,
}

impl Plt {
    fn from_stub(p: &PltStub, bias: u64) -> Plt {
        Plt {
            name: p.name.clone(),
            version: p.version.clone(),
            address: p.address.wrapping_add(bias),
            got: p.got.wrapping_add(bias),
            section: p.section.clone(),
        }
    }
}

/// An executable or shared object, as loaded (or as on disk when no process is involved).
#[derive(Debug, Serialize)]
pub struct Module {
    /// The file as mapped (or as given).
    pub path: PathBuf,
    /// Whether this is the process's (or the listing's) main program.
    pub is_main: bool,
    /// Executable, PIE or shared object.
    pub kind: ElfKind,
    /// Added to a link-time address to get the run-time one; 0 when not loaded.
    pub load_bias: u64,
    /// The lowest mapped address (run-time), for loaded modules.
    pub base: Option<u64>,
    /// `.text` at run time.
    pub text: Option<Range<u64>>,
    /// No `.symtab`: only `.dynsym` functions are listed.
    pub stripped: bool,
    /// GNU build-id, hex.
    pub build_id: Option<String>,
    /// Functions sorted by address.
    pub functions: Vec<Function>,
    /// PLT stubs sorted by address.
    pub plt: Vec<Plt>,
    #[serde(skip)]
    elf: Arc<ElfFile>,
}

impl Module {
    /// Builds the module of `elf` placed with `bias`.
    pub fn new(elf: Arc<ElfFile>, path: PathBuf, bias: u64, base: Option<u64>, is_main: bool) -> Module {
        Module {
            path,
            is_main,
            kind: elf.kind(),
            load_bias: bias,
            base,
            text: elf.text_range().map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias)),
            stripped: elf.is_stripped(),
            build_id: elf.build_id_hex(),
            functions: elf.functions().map(|s| Function::from_symbol(s, bias)).collect(),
            plt: elf.plt_stubs().iter().map(|p| Plt::from_stub(p, bias)).collect(),
            elf,
        }
    }

    /// The file name without directories.
    pub fn basename(&self) -> String {
        self.path
            .file_name()
            .map_or_else(|| self.path.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// Whether `pattern` names this module: its basename equals it, or its path contains it.
    pub fn matches(&self, pattern: &str) -> bool {
        self.basename() == pattern || self.path.to_string_lossy().contains(pattern)
    }

    /// The parsed file.
    pub fn elf(&self) -> &ElfFile {
        &self.elf
    }

    /// The patchability pre-check of `func` (one of this module's
    /// functions), computed on first use and remembered.
    pub fn patchability<'a>(&self, func: &'a Function) -> &'a Patchability {
        func.patchability.get_or_init(|| patchable::check(&self.elf, func))
    }

    /// The function named `name`: stored name, demangled name, or the
    /// demangled name without its parameter list.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name).or_else(|| {
            self.functions.iter().find(|f| {
                f.demangled
                    .as_deref()
                    .is_some_and(|d| d == name || d.split_once('(').is_some_and(|(b, _)| b == name))
            })
        })
    }

    /// The function containing run-time address `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&Function> {
        self.functions
            .iter()
            .filter(|f| f.address == addr || (f.address..f.address.saturating_add(f.size)).contains(&addr))
            .min_by_key(|f| f.size)
    }
}

/// The modules of a program or process.
#[derive(Debug, Serialize)]
pub struct Inventory {
    /// The process, when listed from one.
    pub pid: Option<i32>,
    /// Modules in address order (the main program first when not loaded).
    pub modules: Vec<Module>,
    /// Modules left out, each with the reason: needed shared objects not
    /// found (`name (needed by path)`), mapped files that could not be read.
    pub unresolved: Vec<String>,
}

impl Inventory {
    /// The inventory of one file, not loaded: bias 0, link-time addresses.
    ///
    /// `program` is a path, or a bare name searched on `PATH` like a shell
    /// does. A file without any function symbol is an error
    /// ([`InventoryError::NoSymbols`]): there would be nothing to list or probe.
    pub fn of_file(program: impl AsRef<Path>) -> crate::Result<Inventory> {
        let path = resolve_program(program.as_ref())?;
        let elf = Arc::new(ElfFile::parse(&path, input::read_file(&path, input::MODULE_LIMIT)?)?);
        if elf.functions().next().is_none() {
            return Err(InventoryError::NoSymbols { path }.into());
        }
        let is_main = elf.kind() != ElfKind::SharedObject;
        Ok(Inventory {
            pid: None,
            modules: vec![Module::new(elf, path, 0, None, is_main)],
            unresolved: Vec::new(),
        })
    }

    /// The inventory of one file and every shared object it needs, found as
    /// the dynamic loader would (see [`deps`]); none is loaded, so all
    /// addresses are link-time addresses.
    pub fn of_file_with_deps(program: impl AsRef<Path>) -> crate::Result<Inventory> {
        let mut inv = Self::of_file(program)?;
        let main = inv.modules[0].elf.clone();
        let main_path = inv.modules[0].path.clone();
        for dep in deps::resolve(&main, &main_path) {
            match dep {
                deps::Dependency::Found { path, elf, .. } => {
                    inv.modules.push(Module::new(elf, path, 0, None, false))
                }
                deps::Dependency::Missing { name, needed_by } => {
                    inv.unresolved.push(format!("{name} (needed by {}): not found", needed_by.display()));
                }
            }
        }
        Ok(inv)
    }

    /// The inventory of running process `pid`: its executable and every
    /// mapped shared object, at run-time addresses.
    pub fn of_process(pid: i32) -> crate::Result<Inventory> {
        let mappings = match maps::read(pid) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || pid <= 0 => {
                return Err(InventoryError::NoSuchProcess { pid }.into());
            }
            Err(source) => return Err(InventoryError::Maps { pid, source }.into()),
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let (mut modules, mut unresolved) = (Vec::new(), Vec::new());
        for group in group_by_file(&mappings) {
            if !group.iter().any(|m| m.perms.exec) {
                continue;
            }
            let first = group[0];
            // One unreadable or malformed module must not hide the others.
            let elf = match open_mapped(pid, first) {
                Ok(Some(elf)) => elf,
                Ok(None) => continue,
                Err(e) => {
                    unresolved.push(e.to_string());
                    continue;
                }
            };
            let Some(bias) = elf.load_bias(first.start, first.offset) else {
                unresolved
                    .push(format!("{}: no PT_LOAD segment maps file offset {:#x}", first.name, first.offset));
                continue;
            };
            let name = PathBuf::from(&first.name);
            let is_main = exe.as_ref().is_some_and(|e| *e == name);
            modules.push(Module::new(Arc::new(elf), name, bias, Some(first.start), is_main));
        }
        if modules.is_empty() && unresolved.is_empty() {
            return Err(InventoryError::NoModules { pid }.into());
        }
        Ok(Inventory { pid: Some(pid), modules, unresolved })
    }

    /// The main program's module.
    pub fn main_module(&self) -> Option<&Module> {
        self.modules.iter().find(|m| m.is_main)
    }

    /// The first module `pattern` names (see [`Module::matches`]).
    pub fn module(&self, pattern: &str) -> Option<&Module> {
        self.modules.iter().find(|m| m.matches(pattern))
    }

    /// The module and function at run-time address `addr`.
    pub fn function_at(&self, addr: u64) -> Option<(&Module, &Function)> {
        self.modules.iter().find_map(|m| m.function_at(addr).map(|f| (m, f)))
    }
}

/// Mappings of each file-backed ELF candidate, grouped by file, in order of first appearance.
fn group_by_file(mappings: &[Mapping]) -> Vec<Vec<&Mapping>> {
    let mut order: Vec<Vec<&Mapping>> = Vec::new();
    let mut index: HashMap<(u64, &str), usize> = HashMap::new();
    let mut sorted: Vec<&Mapping> = mappings.iter().filter(|m| m.file().is_some()).collect();
    sorted.sort_by_key(|m| m.start);
    for m in sorted {
        let key = (m.inode, m.name.as_str());
        let i = *index.entry(key).or_insert_with(|| {
            order.push(Vec::new());
            order.len() - 1
        });
        order[i].push(m);
    }
    order
}

/// Reads the ELF file behind a mapping as the process sees it (see
/// [`papirus_substrate::input::read_module`]: `/proc/PID/map_files`, or the target's
/// root, checked against the mapping's device and inode, bounded). `None`
/// when the file is not ELF (a JIT cache, a data file).
fn open_mapped(pid: i32, first: &Mapping) -> crate::Result<Option<ElfFile>> {
    match input::read_module(pid, first, input::MODULE_LIMIT)? {
        Some(data) => Ok(Some(ElfFile::parse(&first.name, data)?)),
        None => Ok(None),
    }
}

/// A path as given when it names a file, else the first match on `PATH`.
fn resolve_program(program: &Path) -> crate::Result<PathBuf> {
    if program.exists() || program.components().count() > 1 {
        return Ok(program.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| InventoryError::ProgramNotFound { program: program.display().to_string() }.into())
}

/// Globs on names, compiled once into one matcher: `*` stands for any run,
/// `?` for any one byte (a character of an ASCII name), and every other
/// character for itself, so C++ names (`operator[]`, `{lambda()#1}`) need
/// no quoting.
#[derive(Debug, Clone)]
pub struct Globs(globset::GlobSet);

impl Globs {
    /// The matcher for `patterns` (none: it matches nothing).
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Globs, InventoryError> {
        let mut set = globset::GlobSetBuilder::new();
        for p in patterns {
            // What globset reads beyond `*` and `?` is quoted, and `**`
            // (globset's any-directories) is the `*` it means here.
            let mut quoted = String::with_capacity(p.as_ref().len());
            for c in p.as_ref().chars() {
                match c {
                    '*' if quoted.ends_with('*') => continue,
                    '[' | ']' | '{' | '}' | '\\' => quoted.push('\\'),
                    _ => {}
                }
                quoted.push(c);
            }
            set.add(globset::GlobBuilder::new(&quoted).backslash_escape(true).build()?);
        }
        Ok(Globs(set.build()?))
    }

    /// Whether one of the globs matches all of `name`.
    pub fn is_match(&self, name: &str) -> bool {
        self.0.is_match(name)
    }

    /// Whether one of the globs matches a function's stored or demangled name.
    pub fn is_match_either(&self, name: &str, demangled: Option<&str>) -> bool {
        self.is_match(name) || demangled.is_some_and(|d| self.is_match(d))
    }

    /// Whether there are no globs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's libc, which the ifunc and patchability tests read
    /// (`None`, said, where it is not at the Debian path).
    pub(super) fn system_libc() -> Option<ElfFile> {
        const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
        let elf = ElfFile::open(LIBC);
        if let Err(e) = &elf {
            papirus_testkit::skip(format!("{LIBC}: {e}"));
        }
        elf.ok()
    }

    #[test]
    fn globs() {
        let m = |p: &str, t: &str| Globs::new(&[p]).unwrap().is_match(t);
        assert!(m("*", ""));
        assert!(m("main", "main"));
        assert!(!m("main", "mainly"));
        assert!(m("mem*", "memcpy"));
        assert!(m("*cpy", "memcpy"));
        assert!(m("m?mc*y", "memcpy"));
        assert!(m("*a*b*c", "xxaxxbxxc"));
        assert!(!m("*a*b*c", "xxaxxcxxb"));
        assert!(m("ns::*(int)", "ns::foo(int)"));
        assert!(!m("?", ""));
        assert!(m("??", "é") && !m("?", "é"), "`?` is one byte of a name");
        assert!(m("a**b", "a/x/b") && m("*", "a/b"), "`*` crosses `/`");
        assert!(!m("**/", "a") && m("/**", "/a") && m("a/**/b", "a/b/b"), "`**` is `*`");
        // Only `*` and `?` are special: C++ names match as written.
        assert!(m("std::vector<int>::operator[]*", "std::vector<int>::operator[](unsigned long)"));
        assert!(!m("[ab]", "a"));
        assert!(m("f()::{lambda(int)#1}::*", "f()::{lambda(int)#1}::operator()"));
        assert!(!m("{a,b}", "a"));
        assert!(m("a\\*", "a\\b") && !m("a\\*", "a*"));
        let set = Globs::new(&["main", "fib*", "*_r"]).unwrap();
        assert!(["main", "fib", "fibonacci", "strtok_r"].iter().all(|n| set.is_match(n)));
        assert!(!set.is_match("mainly") && !set.is_match("_fib"));
        let none = Globs::new::<&str>(&[]).unwrap();
        assert!(none.is_empty() && !none.is_match(""));
    }

    #[test]
    fn grouping_keeps_files_apart() {
        let text = "\
555555554000-555555555000 r--p 00000000 08:01 100 /usr/bin/prog
555555555000-555555556000 r-xp 00001000 08:01 100 /usr/bin/prog
555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]
7ffff7dd0000-7ffff7df6000 r--p 00000000 08:01 200 /usr/lib/libc.so.6
7ffff7df6000-7ffff7f4b000 r-xp 00026000 08:01 200 /usr/lib/libc.so.6
7ffff7fc5000-7ffff7fc9000 r--p 00000000 00:00 0 [vvar]
";
        let maps = maps::parse(text).unwrap();
        let groups = group_by_file(&maps);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].len(), 2);
        assert_eq!(groups[1][0].name, "/usr/lib/libc.so.6");
    }

    #[test]
    fn program_resolution() {
        assert!(resolve_program(Path::new("sh")).unwrap().is_absolute());
        let err = resolve_program(Path::new("no-such-program-papirus")).unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
        // A path with a directory is taken as given (open reports it missing).
        assert_eq!(resolve_program(Path::new("./nope")).unwrap(), PathBuf::from("./nope"));
    }
}
