//! The one ELF reader of papirus: symbols, sections, load segments and PLT
//! stubs of an x86-64 executable or shared object.
//!
//! [`ElfFile::open`] reads the whole file once and extracts everything the
//! rest of papirus asks about (symbols for `uprobe:PATH:SYMBOL` and
//! `mem:SYMBOL:x`, file offsets for the uprobe PMU, the function inventory
//! of the probe tool), keeping the bytes so instructions can be decoded
//! later. Addresses are link-time addresses (`st_value`); a running process
//! adds its load bias, see [`ElfFile::load_bias`].

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{Dyn as _, FileHeader, ProgramHeader as _, Rela as _, SectionHeader as _, Sym as _};
use object::{Endianness, FileKind, Object as _};
use serde::Serialize;

use crate::error::{Error, Result};

type Parsed<'a> = object::read::elf::ElfFile64<'a, Endianness>;

/// What kind of object file this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ElfKind {
    /// `ET_EXEC`: a position-dependent executable, loaded at its link addresses.
    Executable,
    /// `ET_DYN` flagged `DF_1_PIE`: a position-independent executable.
    PieExecutable,
    /// `ET_DYN` without the PIE flag: a shared object.
    SharedObject,
    /// `ET_REL`: an object file before linking.
    Relocatable,
    /// Any other `e_type` (core files, processor-specific types).
    Other(u16),
}

impl std::fmt::Display for ElfKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElfKind::Executable => f.write_str("executable"),
            ElfKind::PieExecutable => f.write_str("PIE executable"),
            ElfKind::SharedObject => f.write_str("shared object"),
            ElfKind::Relocatable => f.write_str("relocatable object"),
            ElfKind::Other(t) => write!(f, "ELF type {t:#x}"),
        }
    }
}

/// Symbol binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    /// `STB_GLOBAL`
    Global,
    /// `STB_LOCAL`
    Local,
    /// `STB_WEAK`
    Weak,
    /// `STB_GNU_UNIQUE`
    Unique,
}

/// What a symbol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SymbolKind {
    /// `STT_FUNC`: code.
    Function,
    /// `STT_GNU_IFUNC`: a resolver whose result the loader binds (e.g. libc's `memcpy`);
    /// the address is the resolver's.
    Ifunc,
    /// `STT_OBJECT`: data.
    Object,
    /// `STT_NOTYPE` in an executable section: an untyped code label, as
    /// hand-written assembly leaves them (`nm` shows these as code too).
    Label,
}

impl SymbolKind {
    /// Whether the symbol is code.
    pub fn is_code(self) -> bool {
        matches!(self, SymbolKind::Function | SymbolKind::Ifunc | SymbolKind::Label)
    }
}

/// Which symbol table(s) a symbol was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    /// `.symtab` only (removed by `strip`).
    Symtab,
    /// `.dynsym` only (what the dynamic loader sees).
    Dynsym,
    /// Both, at the same address.
    Both,
}

impl Table {
    /// Whether `.symtab` lists the symbol.
    pub fn in_symtab(self) -> bool {
        matches!(self, Table::Symtab | Table::Both)
    }

    /// Whether `.dynsym` lists the symbol.
    pub fn in_dynsym(self) -> bool {
        matches!(self, Table::Dynsym | Table::Both)
    }
}

/// A defined symbol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Symbol {
    /// The name as stored (mangled for C++ and Rust), without version.
    pub name: String,
    /// The symbol version from `.gnu.version_d` (`GLIBC_2.14`), for versioned dynamic symbols.
    pub version: Option<String>,
    /// Whether the version is hidden (`name@VER`, not the default `name@@VER`).
    pub hidden_version: bool,
    /// Link-time address (`st_value`).
    pub address: u64,
    /// Size in bytes (`st_size`), 0 when unknown.
    pub size: u64,
    /// Binding.
    pub binding: Binding,
    /// Kind.
    pub kind: SymbolKind,
    /// Name of the section holding it (`.text`, `.init`, …), `*ABS*` for absolute symbols.
    pub section: String,
    /// The table(s) that list it.
    pub table: Table,
}

impl Symbol {
    /// `name`, `name@VER` or `name@@VER`, as `nm -D` prints it.
    pub fn versioned_name(&self) -> String {
        match &self.version {
            Some(v) if self.hidden_version => format!("{}@{v}", self.name),
            Some(v) => format!("{}@@{v}", self.name),
            None => self.name.clone(),
        }
    }

    /// The address range `[address, address + size)`.
    pub fn range(&self) -> Range<u64> {
        self.address..self.address.saturating_add(self.size)
    }
}

/// A section header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Section {
    /// Name (`.text`).
    pub name: String,
    /// Link-time address, 0 when not allocated.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Offset in the file (meaningless for `SHT_NOBITS`).
    pub file_offset: u64,
    /// `SHF_EXECINSTR`
    pub executable: bool,
    /// `SHF_ALLOC`: present in memory at run time.
    pub allocated: bool,
    /// `sh_entsize`
    pub entry_size: u64,
}

/// A `PT_LOAD` program header: what the loader maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// `p_vaddr`
    pub vaddr: u64,
    /// `p_memsz`
    pub mem_size: u64,
    /// `p_offset`
    pub file_offset: u64,
    /// `p_filesz`
    pub file_size: u64,
    /// `p_align`
    pub align: u64,
    /// `PF_R`
    pub read: bool,
    /// `PF_W`
    pub write: bool,
    /// `PF_X`
    pub exec: bool,
}

/// A PLT stub: the code a call to an imported function goes through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PltStub {
    /// The imported function.
    pub name: String,
    /// Its required version (`GLIBC_2.2.5`), when versioned.
    pub version: Option<String>,
    /// Link-time address of the stub (what `objdump -d` labels `name@plt`).
    pub address: u64,
    /// Link-time address of the GOT slot the stub jumps through.
    pub got: u64,
    /// The section holding the stub: `.plt` (lazy, no IBT), `.plt.sec` (lazy
    /// with IBT) or `.plt.got` (bound at load time).
    pub section: String,
}

/// A parsed ELF file. Cheap to query; holds the file's bytes.
#[derive(Clone)]
pub struct ElfFile {
    path: PathBuf,
    data: Vec<u8>,
    kind: ElfKind,
    machine: u16,
    entry: u64,
    symbols: Vec<Symbol>,
    sections: Vec<Section>,
    segments: Vec<Segment>,
    plt: Vec<PltStub>,
    has_symtab: bool,
    build_id: Option<Vec<u8>>,
    interpreter: Option<String>,
    soname: Option<String>,
    needed: Vec<String>,
    runpath: Option<String>,
    rpath: Option<String>,
}

impl std::fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfFile")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("symbols", &self.symbols.len())
            .field("stripped", &!self.has_symtab)
            .finish_non_exhaustive()
    }
}

impl ElfFile {
    /// Reads and parses `path`.
    ///
    /// A missing or unreadable file gives [`Error::Io`]; anything that is not
    /// a 64-bit ELF file, or is truncated or malformed, gives [`Error::Elf`].
    /// Only a regular file of at most [`MAX_FILE_BYTES`] is read, opened
    /// without blocking: a FIFO, a device or a huge sparse file named here is
    /// refused at once rather than hang or fill memory.
    pub fn open(path: impl AsRef<Path>) -> Result<ElfFile> {
        let path = path.as_ref();
        let data = read_bounded(path)?;
        Self::parse(path, data)
    }

    /// Parses the bytes of an ELF file; `path` names it in errors.
    pub fn parse(path: impl AsRef<Path>, data: Vec<u8>) -> Result<ElfFile> {
        let path = path.as_ref().to_path_buf();
        let bad = |reason: String| Error::Elf { path: path.clone(), reason };
        match FileKind::parse(&*data) {
            Ok(FileKind::Elf64) => {}
            Ok(FileKind::Elf32) => {
                return Err(bad("a 32-bit ELF file; papirus handles x86-64 (64-bit) only".into()));
            }
            Ok(other) => return Err(bad(format!("a {other:?} file, not ELF"))),
            Err(_) => return Err(bad("not an ELF file (no ELF magic)".into())),
        }
        let file = Parsed::parse(&*data).map_err(|e| bad(e.to_string()))?;
        let built =
            Builder::new(&file).map_err(|e| bad(e.to_string()))?.build().map_err(|e| bad(e.to_string()))?;
        Ok(ElfFile { path, data, ..built })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Executable, PIE or shared object.
    pub fn kind(&self) -> ElfKind {
        self.kind
    }

    /// `e_machine` (62 = x86-64).
    pub fn machine(&self) -> u16 {
        self.machine
    }

    /// The entry point (`e_entry`), link-time.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// `DT_SONAME`, for shared objects that have one.
    pub fn soname(&self) -> Option<&str> {
        self.soname.as_deref()
    }

    /// `DT_NEEDED`: the shared objects this file asks the loader for, in order.
    pub fn needed(&self) -> &[String] {
        &self.needed
    }

    /// `DT_RUNPATH`, unexpanded (`$ORIGIN` left as is).
    pub fn runpath(&self) -> Option<&str> {
        self.runpath.as_deref()
    }

    /// `DT_RPATH` (the older, LD_LIBRARY_PATH-overriding form), unexpanded.
    pub fn rpath(&self) -> Option<&str> {
        self.rpath.as_deref()
    }

    /// `PT_INTERP`: the dynamic loader an executable names.
    pub fn interpreter(&self) -> Option<&str> {
        self.interpreter.as_deref()
    }

    /// The GNU build-id note, when present.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The build-id as lowercase hex.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id.as_ref().map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// This file's separate debug file under `root` (normally
    /// [`DEBUG_ROOT`]): `ROOT/.build-id/ab/cdef….debug`, where gdb and perf
    /// find the symbols Debian's `-dbg` and `-dbgsym` packages install for
    /// stripped files. `None` unless it is there and has the same build-id.
    pub fn debug_file(&self, root: &Path) -> Option<ElfFile> {
        let id = self.build_id_hex().filter(|h| h.len() > 2)?;
        let path = root.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
        let debug = ElfFile::open(path).ok()?;
        (debug.build_id() == self.build_id()).then_some(debug)
    }

    /// Whether `.symtab` is absent (`strip`ped): only `.dynsym` symbols are known.
    pub fn is_stripped(&self) -> bool {
        !self.has_symtab
    }

    /// Every defined function, data and ifunc symbol, sorted by address then name.
    /// A symbol in both `.symtab` and `.dynsym` appears once, with [`Table::Both`].
    pub fn symbols(&self) -> &[Symbol] {
        &self.symbols
    }

    /// The defined functions (`STT_FUNC` and `STT_GNU_IFUNC`), sorted by address.
    pub fn functions(&self) -> impl Iterator<Item = &Symbol> {
        self.symbols.iter().filter(|s| s.kind.is_code())
    }

    /// Section headers, in file order.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The first section named `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The `PT_LOAD` segments, in program-header order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// PLT stubs, sorted by address.
    pub fn plt_stubs(&self) -> &[PltStub] {
        &self.plt
    }

    /// The `.text` section's link-time range, or the span of the executable
    /// segments when there are no section headers.
    pub fn text_range(&self) -> Option<Range<u64>> {
        if let Some(t) = self.section(".text") {
            return Some(t.address..t.address + t.size);
        }
        let exec = self.segments.iter().filter(|s| s.exec);
        let start = exec.clone().map(|s| s.vaddr).min()?;
        let end = exec.map(|s| s.vaddr + s.mem_size).max()?;
        Some(start..end)
    }

    /// The file offset of link-time address `vaddr`, through the `PT_LOAD`
    /// segments; `None` when no segment maps it from the file (e.g. `.bss`).
    pub fn vaddr_to_file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.file_size)
            .map(|s| s.file_offset + (vaddr - s.vaddr))
    }

    /// The link-time address of file offset `offset`, when a `PT_LOAD` segment maps it.
    pub fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.file_offset && offset - s.file_offset < s.file_size)
            .map(|s| s.vaddr + (offset - s.file_offset))
    }

    /// Up to `len` bytes of the file image at link-time address `vaddr`,
    /// cut at the end of the segment; `None` when the address is not file-backed.
    pub fn bytes_at(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let seg = self.segments.iter().find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.file_size)?;
        let start = usize::try_from(seg.file_offset + (vaddr - seg.vaddr)).ok()?;
        let seg_end = usize::try_from(seg.file_offset + seg.file_size).ok()?;
        let end = start.saturating_add(len).min(seg_end).min(self.data.len());
        self.data.get(start..end)
    }

    /// The load bias of this file in a process that maps file offset
    /// `map_offset` at `map_start` (one line of `/proc/PID/maps`): add it
    /// to a link-time address to get the run-time address. `None` when no
    /// segment covers that offset.
    pub fn load_bias(&self, map_start: u64, map_offset: u64) -> Option<u64> {
        // The kernel maps each segment from its page-aligned file offset;
        // a later piece of a split mapping (RELRO) has an offset inside it.
        // Segments can share a file page, so take the last one that starts
        // at or before this offset.
        let seg = self
            .segments
            .iter()
            .filter(|s| {
                align_down(s.file_offset, s.align) <= map_offset
                    && map_offset < s.file_offset + s.file_size.max(1)
            })
            .max_by_key(|s| align_down(s.file_offset, s.align))?;
        // p_vaddr ≡ p_offset modulo the page size, so this mapping's start
        // corresponds to link-time address p_vaddr + (map_offset - p_offset).
        let link = seg.vaddr.wrapping_add(map_offset).wrapping_sub(seg.file_offset);
        Some(map_start.wrapping_sub(link))
    }

    /// The function named `name` (the stored, mangled name).
    ///
    /// `name@VER` and `name@@VER` select a version. Without a version, the
    /// default version wins, then global over weak over local bindings.
    /// Not found: [`Error::SymbolNotFound`] with the three closest names.
    pub fn lookup_function(&self, name: &str) -> Result<Symbol> {
        self.lookup(name, true)
    }

    /// Like [`lookup_function`](Self::lookup_function), but data symbols match too.
    pub fn lookup_symbol(&self, name: &str) -> Result<Symbol> {
        self.lookup(name, false)
    }

    fn lookup(&self, name: &str, code_only: bool) -> Result<Symbol> {
        let (base, version) = match name.split_once('@') {
            Some((b, v)) => (b, Some(v.trim_start_matches('@'))),
            None => (name, None),
        };
        let rank = |s: &Symbol| {
            let binding = match s.binding {
                Binding::Global | Binding::Unique => 0,
                Binding::Weak => 1,
                Binding::Local => 2,
            };
            (s.hidden_version, binding)
        };
        let best = self
            .symbols
            .iter()
            .filter(|s| (!code_only || s.kind.is_code()) && s.name == base)
            .filter(|s| version.is_none_or(|v| s.version.as_deref() == Some(v)))
            .min_by_key(|s| rank(s));
        match best {
            Some(s) => Ok(s.clone()),
            None => Err(Error::SymbolNotFound {
                path: self.path.clone(),
                symbol: name.to_string(),
                suggestions: closest(
                    base,
                    self.symbols.iter().filter(|s| !code_only || s.kind.is_code()).map(|s| s.name.as_str()),
                    3,
                ),
            }),
        }
    }

    /// The function whose range contains link-time address `vaddr` (or that
    /// starts exactly there, for size-0 symbols).
    pub fn function_at(&self, vaddr: u64) -> Option<&Symbol> {
        self.functions()
            .filter(|s| s.address == vaddr || s.range().contains(&vaddr))
            .min_by_key(|s| (s.size, alias_rank(s)))
    }
}

/// Orders aliases of one function as perf does, the best first: strong
/// before weak, global before local, fewer leading underscores, longer
/// name (`malloc`, not `__GI___libc_malloc` or `__libc_malloc`).
fn alias_rank(s: &Symbol) -> (bool, bool, usize, std::cmp::Reverse<usize>) {
    let underscores = s.name.len() - s.name.trim_start_matches('_').len();
    (s.binding == Binding::Weak, s.binding == Binding::Local, underscores, std::cmp::Reverse(s.name.len()))
}

/// Where distributions install separate debug files, by build-id.
pub const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Largest file [`ElfFile::open`] reads: far above any real executable or
/// library, far below what a sparse file can claim.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// The bytes of regular file `path`, at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let bad = |reason: String| Error::Elf { path: path.to_path_buf(), reason };
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let md = file.metadata().map_err(io)?;
    if !md.is_file() {
        return Err(bad(format!(
            "not a regular file ({:?}): only regular files of at most {MAX_FILE_BYTES} bytes are read",
            md.file_type()
        )));
    }
    if md.len() > MAX_FILE_BYTES {
        return Err(bad(format!(
            "{} bytes, over the {MAX_FILE_BYTES}-byte bound of ELF files read",
            md.len()
        )));
    }
    let mut data = Vec::with_capacity(md.len() as usize);
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut data).map_err(io)?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(bad(format!("grew past the {MAX_FILE_BYTES}-byte bound of ELF files read")));
    }
    Ok(data)
}

fn align_down(x: u64, align: u64) -> u64 {
    if align.is_power_of_two() { x & !(align - 1) } else { x }
}

/// The `n` names closest to `target` by Levenshtein distance, ties broken
/// by name.
///
/// Cheap on large symbol tables: once `n` candidates are held, a name is
/// skipped when its length alone puts it farther than the worst of them.
pub fn closest<'a>(target: &str, names: impl Iterator<Item = &'a str>, n: usize) -> Vec<String> {
    let mut best: Vec<(usize, &str)> = Vec::with_capacity(n + 1);
    for name in names {
        let bound = if n > 0 && best.len() == n { best[n - 1].0 } else { usize::MAX };
        if n == 0 || target.len().abs_diff(name.len()) > bound || best.iter().any(|(_, b)| *b == name) {
            continue;
        }
        let d = strsim::levenshtein(target, name);
        if d > bound {
            continue;
        }
        let pos = best.partition_point(|e| *e < (d, name));
        if pos < n {
            best.insert(pos, (d, name));
            best.truncate(n);
        }
    }
    best.into_iter().map(|(_, s)| s.to_string()).collect()
}

/// Extracts owned tables from the borrowed parse.
struct Builder<'a, 'f> {
    file: &'f Parsed<'a>,
    endian: Endianness,
    data: &'a [u8],
}

impl<'a, 'f> Builder<'a, 'f> {
    fn new(file: &'f Parsed<'a>) -> object::Result<Self> {
        Ok(Builder { file, endian: file.endian(), data: file.data() })
    }

    fn build(self) -> object::Result<ElfFile> {
        let (e, header) = (self.endian, self.file.elf_header());
        let sections = self.sections()?;
        let segments = self.segments();
        let dynamic = self.dynamic_info()?;
        let kind = match header.e_type(e) {
            elf::ET_EXEC => ElfKind::Executable,
            elf::ET_DYN if dynamic.pie => ElfKind::PieExecutable,
            elf::ET_DYN => ElfKind::SharedObject,
            elf::ET_REL => ElfKind::Relocatable,
            other => ElfKind::Other(other.0),
        };
        let has_symtab = !self.file.elf_symbol_table().is_empty();
        let symbols = self.symbols(&sections)?;
        let plt = if header.e_machine(e) == elf::EM_X86_64 { self.plt_stubs(&sections)? } else { Vec::new() };
        Ok(ElfFile {
            path: PathBuf::new(),
            data: Vec::new(),
            kind,
            machine: header.e_machine(e).0,
            entry: header.e_entry(e),
            symbols,
            sections,
            segments,
            plt,
            has_symtab,
            build_id: self.file.build_id()?.map(<[u8]>::to_vec),
            interpreter: self.interpreter(),
            soname: dynamic.soname,
            needed: dynamic.needed,
            runpath: dynamic.runpath,
            rpath: dynamic.rpath,
        })
    }

    fn sections(&self) -> object::Result<Vec<Section>> {
        let table = self.file.elf_section_table();
        table
            .iter()
            .map(|sh| {
                let e = self.endian;
                let flags = sh.sh_flags(e);
                Ok(Section {
                    name: String::from_utf8_lossy(table.section_name(e, sh)?).into_owned(),
                    address: sh.sh_addr(e),
                    size: sh.sh_size(e),
                    file_offset: sh.sh_offset(e),
                    executable: flags.contains(elf::SHF_EXECINSTR),
                    allocated: flags.contains(elf::SHF_ALLOC),
                    entry_size: sh.sh_entsize(e),
                })
            })
            .collect()
    }

    fn segments(&self) -> Vec<Segment> {
        let e = self.endian;
        self.file
            .elf_program_headers()
            .iter()
            .filter(|p| p.p_type(e) == elf::PT_LOAD)
            .map(|p| {
                let f = p.p_flags(e);
                Segment {
                    vaddr: p.p_vaddr(e),
                    mem_size: p.p_memsz(e),
                    file_offset: p.p_offset(e),
                    file_size: p.p_filesz(e),
                    align: p.p_align(e),
                    read: f.contains(elf::PF_R),
                    write: f.contains(elf::PF_W),
                    exec: f.contains(elf::PF_X),
                }
            })
            .collect()
    }

    fn interpreter(&self) -> Option<String> {
        let e = self.endian;
        let p = self.file.elf_program_headers().iter().find(|p| p.p_type(e) == elf::PT_INTERP)?;
        let bytes = p.data(e, self.data).ok()?;
        let bytes = bytes.split(|&b| b == 0).next()?;
        Some(String::from_utf8_lossy(bytes).into_owned())
    }

    fn dynamic_info(&self) -> object::Result<DynamicInfo> {
        let e = self.endian;
        let mut info = DynamicInfo::default();
        let table = self.file.elf_section_table();
        let Some((entries, strtab)) = table.dynamic(e, self.data)? else {
            return Ok(info);
        };
        let strings = table.strings(e, self.data, strtab).ok();
        for d in entries {
            match d.tag(e) {
                elf::DT_FLAGS_1 => info.pie |= elf::DynamicFlags1(d.d_val(e)).contains(elf::DF_1_PIE),
                tag @ (elf::DT_SONAME | elf::DT_NEEDED | elf::DT_RUNPATH | elf::DT_RPATH) => {
                    let Some(s) = strings.and_then(|s| s.get(d.d_val(e) as u32).ok()) else { continue };
                    let s = String::from_utf8_lossy(s).into_owned();
                    match tag {
                        elf::DT_SONAME => info.soname = Some(s),
                        elf::DT_NEEDED => info.needed.push(s),
                        elf::DT_RUNPATH => info.runpath = Some(s),
                        _ => info.rpath = Some(s),
                    }
                }
                _ => {}
            }
        }
        Ok(info)
    }

    fn symbols(&self, sections: &[Section]) -> object::Result<Vec<Symbol>> {
        let e = self.endian;
        let versions = self.file.elf_section_table().versions(e, self.data)?;
        let mut out: Vec<Symbol> = Vec::new();
        let mut seen: HashMap<(&[u8], u64), usize> = HashMap::new();
        for (table, symtab) in [
            (Table::Symtab, self.file.elf_symbol_table()),
            (Table::Dynsym, self.file.elf_dynamic_symbol_table()),
        ] {
            for (index, sym) in symtab.enumerate() {
                if sym.is_undefined(e) || sym.st_shndx(e) == elf::SHN_COMMON {
                    continue;
                }
                let section = if sym.st_shndx(e) == elf::SHN_ABS {
                    None
                } else {
                    symtab.symbol_section(e, sym, index)?.and_then(|i| sections.get(i.0))
                };
                let kind = match sym.st_type() {
                    elf::STT_FUNC => SymbolKind::Function,
                    elf::STT_GNU_IFUNC => SymbolKind::Ifunc,
                    elf::STT_OBJECT => SymbolKind::Object,
                    elf::STT_NOTYPE if section.is_some_and(|s| s.executable) => SymbolKind::Label,
                    _ => continue,
                };
                let binding = match sym.st_bind() {
                    elf::STB_GLOBAL => Binding::Global,
                    elf::STB_LOCAL => Binding::Local,
                    elf::STB_WEAK => Binding::Weak,
                    elf::STB_GNU_UNIQUE => Binding::Unique,
                    _ => continue,
                };
                let raw_name = symtab.symbol_name(e, sym)?;
                let name = String::from_utf8_lossy(raw_name).into_owned();
                if name.is_empty() {
                    continue;
                }
                let (mut version, mut hidden_version) = (None, false);
                if table == Table::Dynsym
                    && let Some(v) = &versions
                {
                    let vi = v.version_index(e, index);
                    hidden_version = vi.is_hidden();
                    version = v.version(vi.index())?.map(|v| String::from_utf8_lossy(v.name()).into_owned());
                }
                let section = match section {
                    Some(s) => s.name.clone(),
                    None if sym.st_shndx(e) == elf::SHN_ABS => "*ABS*".to_string(),
                    None => String::new(),
                };
                let address = sym.st_value(e);
                // .symtab carries no versions, so a dynsym entry matches the
                // unversioned symtab entry of the same name and address.
                let merge_key = (raw_name, address);
                if table == Table::Dynsym
                    && let Some(&i) = seen.get(&merge_key)
                    && out[i].table == Table::Symtab
                {
                    out[i].table = Table::Both;
                    out[i].version = version;
                    out[i].hidden_version = hidden_version;
                    continue;
                }
                if table == Table::Symtab {
                    seen.entry(merge_key).or_insert(out.len());
                }
                out.push(Symbol {
                    name,
                    version,
                    hidden_version,
                    address,
                    size: sym.st_size(e),
                    binding,
                    kind,
                    section,
                    table,
                });
            }
        }
        out.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
        Ok(out)
    }

    /// GOT slot → import, from the dynamic relocations, then every PLT
    /// entry decoded to find the slot it jumps through. Decoding the stubs
    /// (rather than assuming entry i belongs to relocation i) covers the
    /// lazy layout, the IBT layout with `.plt.sec`, and `.plt.got`.
    fn plt_stubs(&self, sections: &[Section]) -> object::Result<Vec<PltStub>> {
        let e = self.endian;
        let table = self.file.elf_section_table();
        let dynsym = self.file.elf_dynamic_symbol_table();
        if dynsym.is_empty() {
            return Ok(Vec::new());
        }
        let versions = table.versions(e, self.data)?;
        let mut slots: HashMap<u64, (String, Option<String>)> = HashMap::new();
        for sh in table.iter() {
            if sh.sh_link(e) as usize != dynsym.section().0 {
                continue;
            }
            let Some((relas, _)) = sh.rela(e, self.data)? else { continue };
            for r in relas {
                let ty = r.r_type(e, false);
                if ty != elf::R_X86_64_JUMP_SLOT && ty != elf::R_X86_64_GLOB_DAT {
                    continue;
                }
                let Some(index) = r.symbol(e, false) else { continue };
                let sym = dynsym.symbol(index)?;
                if sym.st_type() != elf::STT_FUNC && sym.st_type() != elf::STT_NOTYPE
                    || (ty == elf::R_X86_64_GLOB_DAT && sym.st_type() != elf::STT_FUNC)
                {
                    continue;
                }
                let name = String::from_utf8_lossy(dynsym.symbol_name(e, sym)?).into_owned();
                let version = match &versions {
                    Some(v) => v
                        .version(v.version_index(e, index).index())?
                        .map(|v| String::from_utf8_lossy(v.name()).into_owned()),
                    None => None,
                };
                slots.insert(r.r_offset(e), (name, version));
            }
        }
        let mut stubs = Vec::new();
        for s in sections.iter().filter(|s| matches!(s.name.as_str(), ".plt" | ".plt.sec" | ".plt.got")) {
            let Some(bytes) = usize::try_from(s.file_offset)
                .ok()
                .and_then(|o| self.data.get(o..o.checked_add(usize::try_from(s.size).ok()?)?))
            else {
                continue;
            };
            let step = if s.entry_size >= 8 { s.entry_size as usize } else { 16 };
            for (i, entry) in bytes.chunks(step).enumerate() {
                let address = s.address + (i * step) as u64;
                let Some(got) = indirect_jump_slot(entry, address) else { continue };
                if let Some((name, version)) = slots.get(&got) {
                    stubs.push(PltStub {
                        name: name.clone(),
                        version: version.clone(),
                        address,
                        got,
                        section: s.name.clone(),
                    });
                }
            }
        }
        stubs.sort_by_key(|s| s.address);
        Ok(stubs)
    }
}

#[derive(Default)]
struct DynamicInfo {
    pie: bool,
    soname: Option<String>,
    needed: Vec<String>,
    runpath: Option<String>,
    rpath: Option<String>,
}

/// The memory slot of a PLT entry's `jmp *slot(%rip)`, allowing a leading
/// `endbr64` and a `bnd` prefix; `None` for any other entry shape (PLT0,
/// the lazy push/jmp half of an IBT PLT).
fn indirect_jump_slot(entry: &[u8], address: u64) -> Option<u64> {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let mut at = 0;
    if entry.starts_with(&ENDBR64) {
        at = 4;
    }
    if entry.get(at) == Some(&0xf2) {
        at += 1;
    }
    if entry.get(at..at + 2)? != [0xff, 0x25] {
        return None;
    }
    let disp = i32::from_le_bytes(entry.get(at + 2..at + 6)?.try_into().ok()?);
    let next = address + at as u64 + 6;
    Some(next.wrapping_add_signed(i64::from(disp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debug_file_is_found_by_build_id_and_must_carry_it() {
        // Debian builds its binaries with a build-id.
        let exe = ElfFile::open("/bin/true").unwrap();
        let id = exe.build_id_hex().unwrap();
        let root = tempfile::tempdir().unwrap();
        assert!(exe.debug_file(root.path()).is_none(), "nothing installed");
        let dir = root.path().join(".build-id").join(&id[..2]);
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join(format!("{}.debug", &id[2..]));
        std::fs::copy("/bin/true", &at).unwrap();
        assert_eq!(exe.debug_file(root.path()).unwrap().build_id(), exe.build_id());
        // Another file at that name (another build) is not taken.
        std::fs::copy("/bin/false", &at).unwrap();
        assert!(exe.debug_file(root.path()).is_none());
    }

    #[test]
    fn closest_names() {
        assert_eq!(closest("mian", ["main", "zzzz", "mainly", "maim"].into_iter(), 2), vec!["main", "maim"]);
        assert!(closest("x", ["a", "b"].into_iter(), 0).is_empty());
        // The pruned search agrees with sorting every distance.
        let names: Vec<String> = (0..400u32)
            .map(|i| format!("fn_{}_{}", i * 7919 % 1000, "ab".repeat((i % 5) as usize)))
            .collect();
        for target in ["fn_12_ab", "fn_9", "zzzz", "fn_123_abababab", ""] {
            let mut all: Vec<(usize, &str)> =
                names.iter().map(|n| (strsim::levenshtein(target, n), n.as_str())).collect();
            all.sort_unstable();
            all.dedup();
            let brute: Vec<String> = all.iter().take(3).map(|(_, n)| n.to_string()).collect();
            assert_eq!(closest(target, names.iter().map(String::as_str), 3), brute, "{target}");
        }
    }

    #[test]
    fn plt_entry_shapes() {
        // jmp *0x2fe2(%rip) at 0x1030: slot = 0x1036 + 0x2fe2.
        let lazy = [0xff, 0x25, 0xe2, 0x2f, 0, 0, 0x68, 0, 0, 0, 0, 0xe9, 0xe0, 0xff, 0xff, 0xff];
        assert_eq!(indirect_jump_slot(&lazy, 0x1030), Some(0x1036 + 0x2fe2));
        // endbr64; bnd jmp *disp(%rip)
        let ibt = [0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x10, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0];
        assert_eq!(indirect_jump_slot(&ibt, 0x1050), Some(0x1050 + 11 + 0x10));
        // PLT0 starts with push; IBT lazy half is endbr64; push; bnd jmp rel32.
        let plt0 = [0xff, 0x35, 1, 0, 0, 0, 0xff, 0x25, 2, 0, 0, 0, 0x0f, 0x1f, 0x40, 0];
        assert_eq!(indirect_jump_slot(&plt0, 0x1020), None);
        let ibt_lazy = [0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x90];
        assert_eq!(indirect_jump_slot(&ibt_lazy, 0x1030), None);
        assert_eq!(indirect_jump_slot(&[0xff, 0x25, 0], 0), None);
    }

    #[test]
    fn non_elf_and_missing_files() {
        let err = ElfFile::parse("x.txt", b"hello, not an elf file\n".to_vec()).unwrap_err();
        assert!(matches!(err, Error::Elf { .. }), "{err}");
        assert!(err.to_string().contains("not an ELF file"), "{err}");
        let mut truncated = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        truncated.truncate(100);
        let err = ElfFile::parse("trunc", truncated).unwrap_err();
        assert!(matches!(err, Error::Elf { .. }), "{err}");
        let err = ElfFile::open("/nonexistent/papirus/file").unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        assert_eq!(err.errno(), Some(crate::sys::Errno(libc::ENOENT)));
        // Not regular, or too large: refused at once, without reading.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let sparse = dir.path().join("sparse");
        std::fs::File::create(&sparse).unwrap().set_len(3 << 30).unwrap();
        for path in [Path::new("/dev/zero"), dir.path(), &fifo, &sparse] {
            let err = ElfFile::open(path).unwrap_err();
            assert!(err.to_string().contains(&MAX_FILE_BYTES.to_string()), "{}: {err}", path.display());
        }
    }

    #[inline(never)]
    fn elf_self_marker(x: u64) -> u64 {
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17)
    }

    /// The test binary itself: its symbols, segments, and the run-time
    /// address of a function matched through the load bias.
    #[test]
    fn parse_self() {
        let exe = std::env::current_exe().unwrap();
        let f = ElfFile::open(&exe).unwrap();
        assert_eq!(f.machine(), elf::EM_X86_64.0);
        assert!(!f.is_stripped());
        let text = f.text_range().unwrap();
        let main = f.lookup_function("main").unwrap();
        assert!(text.contains(&main.address), "{main:?} outside {text:?}");
        assert_eq!(main.binding, Binding::Global);
        assert_eq!(main.section, ".text");
        assert_eq!(f.function_at(main.address + 1).map(|s| s.name.as_str()), Some("main"));
        let off = f.vaddr_to_file_offset(main.address).unwrap();
        assert_eq!(f.file_offset_to_vaddr(off), Some(main.address));
        assert_eq!(f.bytes_at(main.address, 8).unwrap(), &f.data()[off as usize..off as usize + 8]);

        // Rust mangles `elf_self_marker` into a name holding its length-prefixed ident.
        let marker = f
            .functions()
            .find(|s| s.name.contains("15elf_self_marker"))
            .unwrap_or_else(|| panic!("no marker symbol in {}", exe.display()));
        assert!(marker.size > 0);
        let runtime = elf_self_marker as fn(u64) -> u64 as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let canon = std::fs::canonicalize(&exe).unwrap();
        let own: Vec<(u64, u64)> = maps
            .lines()
            .filter(|l| l.ends_with(&*canon.to_string_lossy()))
            .map(|l| {
                let mut fields = l.split_whitespace();
                let start =
                    u64::from_str_radix(fields.next().unwrap().split('-').next().unwrap(), 16).unwrap();
                (start, u64::from_str_radix(fields.nth(1).unwrap(), 16).unwrap())
            })
            .collect();
        assert!(own.len() >= 2, "{} mapped in pieces: {own:x?}", canon.display());
        let bias = f.load_bias(own[0].0, own[0].1).unwrap();
        assert_eq!(marker.address.wrapping_add(bias), runtime, "bias {bias:#x}");
        for (start, offset) in &own {
            assert_eq!(f.load_bias(*start, *offset), Some(bias), "mapping at {start:#x} offset {offset:#x}");
        }
        if f.kind() == ElfKind::Executable {
            assert_eq!(bias, 0);
        }

        let err = f.lookup_function("mian").unwrap_err();
        match &err {
            Error::SymbolNotFound { suggestions, symbol, .. } => {
                assert_eq!(symbol, "mian");
                assert_eq!(suggestions.len(), 3);
                assert!(suggestions.contains(&"main".to_string()), "{err}");
            }
            other => panic!("{other}"),
        }
    }
    const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) static int helper(int x) { return x * 3; }
__attribute__((weak)) int weakfn(int x) { return x + 1; }
int counter;
int main(int argc, char **argv) {
    char *p = malloc(16);
    strcpy(p, argv[0]);
    printf("%s %d\n", p, argc);
    free(p);
    counter = helper(argc) + weakfn(argc);
    return counter & 1;
}
"#;

    /// Builds C_SOURCE with `flags`.
    fn build_c(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
        papirus_testkit::Cc::from_text(dir, "t.c", C_SOURCE).opt("-O1").args(flags).build(dir, name)
    }

    fn tool_output(cmd: &str, args: &[&str], file: &Path) -> Option<String> {
        match std::process::Command::new(cmd).args(args).arg(file).output() {
            Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
            Ok(o) => panic!("{cmd} {args:?} failed: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                eprintln!("skipping the {cmd} comparison: cannot run {cmd}: {e}");
                None
            }
        }
    }

    /// PLT stubs agree with the `name@plt` labels objdump prints, in every
    /// layout gcc and ld produce here: lazy, `-z now`, IBT (`.plt.sec`), non-PIE.
    #[test]
    fn plt_layouts_match_objdump() {
        let dir = tempfile::tempdir().unwrap();
        let layouts: [(&str, &[&str]); 5] = [
            ("lazy", &[]),
            ("now", &["-Wl,-z,now"]),
            ("ibt", &["-Wl,-z,ibtplt"]),
            ("ibt_now", &["-Wl,-z,ibtplt", "-Wl,-z,now"]),
            ("nopie_ibt", &["-no-pie", "-Wl,-z,ibtplt"]),
        ];
        for (name, flags) in layouts {
            let exe = build_c(dir.path(), name, flags);
            let f = ElfFile::open(&exe).unwrap();
            let Some(dump) = tool_output("objdump", &["-d"], &exe) else { return };
            let mut expected: Vec<(String, u64)> = dump
                .lines()
                .filter_map(|l| {
                    let (addr, rest) = l.split_once(" <")?;
                    let label = rest.strip_suffix(">:")?.strip_suffix("@plt")?;
                    Some((label.to_string(), u64::from_str_radix(addr, 16).ok()?))
                })
                .collect();
            let mut got: Vec<(String, u64)> =
                f.plt_stubs().iter().map(|s| (s.name.clone(), s.address)).collect();
            expected.sort();
            got.sort();
            assert_eq!(got, expected, "{name}: {flags:?}");
            for import in ["malloc", "free", "printf"] {
                assert!(got.iter().any(|(n, _)| n == import), "{name}: no stub for {import}");
            }
            let printf = f.plt_stubs().iter().find(|s| s.name == "printf").unwrap();
            let want_section = if name.contains("ibt") { ".plt.sec" } else { ".plt" };
            assert_eq!(printf.section, want_section, "{name}");
            assert!(f.section(".got").unwrap().address <= printf.got || f.section(".got.plt").is_some());
            assert_eq!(printf.version.as_deref(), Some("GLIBC_2.2.5"));
            let kind = if name.starts_with("nopie") { ElfKind::Executable } else { ElfKind::PieExecutable };
            assert_eq!(f.kind(), kind, "{name}");
        }
    }

    /// Functions agree with `nm` (T, t, W: name, address, size) both ways;
    /// after `strip`, only dynamic symbols remain and the file says so.
    #[test]
    fn c_program_matches_nm_and_strip() {
        let dir = tempfile::tempdir().unwrap();
        let exe = build_c(dir.path(), "prog", &["-rdynamic"]);
        let f = ElfFile::open(&exe).unwrap();
        assert!(!f.is_stripped());
        let Some(nm) = papirus_testkit::nm(&exe, &["--defined-only", "-S"]) else { return };
        // `W` also covers weak untyped data symbols (`data_start`): keep code only.
        let in_code = |a: u64| {
            f.sections().iter().any(|s| s.executable && (s.address..s.address + s.size).contains(&a))
        };
        let mut expected: Vec<(String, u64, u64)> = nm
            .into_iter()
            .filter(|s| matches!(s.kind.as_str(), "T" | "t" | "W") && in_code(s.address))
            .map(|s| (s.name, s.address, s.size))
            .collect();
        let mut got: Vec<(String, u64, u64)> = f
            .functions()
            .filter(|s| s.table.in_symtab())
            .map(|s| (s.name.clone(), s.address, s.size))
            .collect();
        expected.sort();
        got.sort();
        assert_eq!(got, expected);
        assert_eq!(f.lookup_function("helper").unwrap().binding, Binding::Local);
        assert_eq!(f.lookup_function("weakfn").unwrap().binding, Binding::Weak);
        assert_eq!(f.lookup_function("main").unwrap().table, Table::Both, "-rdynamic exports main");
        assert_eq!(f.needed(), ["libc.so.6"]);
        assert_eq!(f.interpreter(), Some("/lib64/ld-linux-x86-64.so.2"));
        match ElfFile::open("/lib/x86_64-linux-gnu/libc.so.6") {
            Ok(libc) => {
                assert_eq!(libc.soname(), Some("libc.so.6"));
                assert_eq!(libc.kind(), ElfKind::SharedObject);
                // memcpy has two versions; the default one wins unless one is named.
                let default = libc.lookup_function("memcpy").unwrap();
                assert_eq!(default.versioned_name(), "memcpy@@GLIBC_2.14");
                let old = libc.lookup_function("memcpy@GLIBC_2.2.5").unwrap();
                assert!(old.hidden_version && old.address != default.address);
                assert_eq!(libc.lookup_function("memcpy@@GLIBC_2.14").unwrap(), default);
                assert!(libc.lookup_function("memcpy@GLIBC_9.9").is_err());
            }
            Err(e) => eprintln!("skipping the libc checks: {e}"),
        }
        assert!(f.lookup_function("counter").is_err(), "data is not a function");
        assert_eq!(f.lookup_symbol("counter").unwrap().kind, SymbolKind::Object);

        let stripped = dir.path().join("prog.stripped");
        match std::process::Command::new("strip").arg("-o").arg(&stripped).arg(&exe).status() {
            Ok(s) => assert!(s.success(), "strip failed"),
            Err(e) => {
                eprintln!("skipping the stripped check: cannot run strip: {e}");
                return;
            }
        }
        let s = ElfFile::open(&stripped).unwrap();
        assert!(s.is_stripped());
        assert!(s.lookup_function("helper").is_err(), "locals vanish with .symtab");
        let main = s.lookup_function("main").unwrap();
        assert_eq!(main.table, Table::Dynsym);
        assert_eq!(main.address, f.lookup_function("main").unwrap().address);
        assert_eq!(s.build_id(), f.build_id());
        assert!(s.plt_stubs().iter().any(|p| p.name == "printf"));
    }
}
