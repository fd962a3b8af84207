//! What the recorder does with each ring record: call chains interned as
//! raw addresses and counted per thread, and each process' executable
//! mappings tracked as they appear (MMAP2, FORK, COMM exec), with the
//! module files read while they are still mapped. Addresses become
//! function names once, at the end ([`Collector::finish`]), against the
//! mappings the process had when each sample was taken.
//!
//! Mappings of a process only ever get appended to: a sample remembers how
//! many there were when it was read, and resolves against the newest of
//! those that covers its address. A sample read before the MMAP2 record of
//! its (new) mapping, which sits in another CPU's ring, falls back to the
//! mappings added after it; one read before the FORK record of its process
//! resolves in the address space that record creates.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Unwinder as _};
use papirus_substrate::demangle::demangle;
use papirus_substrate::elf::{DEBUG_ROOT, ElfFile};
use papirus_substrate::input::{self, MODULE_LIMIT};
use papirus_substrate::maps::{self, Mapping, Perms};
use papirus_substrate::sample::{Comm, Mmap2, MmapFile, Record, Sample, Task, x86_regs};
use papirus_substrate::symbolize::Module;

use crate::recording::{Frame, SampleCount, Thread, Unreadable};

// `PERF_CONTEXT_*` markers in a call chain (negative numbers as u64).
const CONTEXT_HV: u64 = -32i64 as u64;
const CONTEXT_KERNEL: u64 = -128i64 as u64;
const CONTEXT_USER: u64 = -512i64 as u64;
const CONTEXT_GUEST: u64 = -2048i64 as u64;
const CONTEXT_GUEST_KERNEL: u64 = -2176i64 as u64;
const CONTEXT_GUEST_USER: u64 = -2560i64 as u64;
/// Entries at or above this are markers, not addresses.
const CONTEXT_MAX: u64 = -4095i64 as u64;

/// The `cpumode` bits of a record header's misc field.
const MISC_CPUMODE_MASK: u16 = 7;
const MISC_KERNEL: u16 = 1;
const MISC_USER: u16 = 2;
const MISC_HYPERVISOR: u16 = 3;

/// Largest `/proc/kallsyms` read (about 15 MB on a distribution kernel).
const KALLSYMS_LIMIT: u64 = 256 << 20;

/// One executable mapping of a process, with its file when it could be read.
#[derive(Clone, Debug)]
struct MapEntry {
    range: std::ops::Range<u64>,
    name: String,
    module: Option<Module>,
}

/// One address space: a process between its fork or exec and the next exec.
#[derive(Clone, Default)]
struct Space {
    entries: Vec<MapEntry>,
    /// The same modules for unwinding user stack copies (when asked for).
    unwinder: UnwinderX86_64<Arc<[u8]>>,
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Space").field("entries", &self.entries).finish_non_exhaustive()
    }
}

/// framehop's cache of unwind rules, kept across samples.
struct UnwindCache(CacheX86_64);

impl Default for UnwindCache {
    fn default() -> Self {
        UnwindCache(CacheX86_64::new())
    }
}

impl std::fmt::Debug for UnwindCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnwindCache")
    }
}

/// Most frames taken from one user stack copy.
const MAX_UNWOUND: usize = 512;

/// Where a sample's addresses resolve: an address space and how many of its
/// mappings were known when the sample was read.
type SpaceAt = Option<(u32, u32)>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    tid: u32,
    stack: u32,
    space: SpaceAt,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    samples: u64,
    weight: u64,
}

/// Identity of a mapped file: device (major, minor) and inode.
type FileId = (u32, u32, u64);

/// A module file: its symbols, and its unwind sections once asked for.
#[derive(Debug)]
struct File {
    elf: Arc<ElfFile>,
    unwind: Option<ExplicitModuleSectionInfo<Arc<[u8]>>>,
}

/// Consumes ring records; see the module documentation.
#[derive(Debug, Default)]
pub struct Collector {
    stack_ids: HashMap<Box<[u64]>, u32>,
    stacks: Vec<Box<[u64]>>,
    scratch: Vec<u64>,
    spaces: Vec<Space>,
    space_of: HashMap<u32, u32>,
    first_space_of: HashMap<u32, u32>,
    files: HashMap<FileId, Result<File, String>>,
    unwind: bool,
    unwind_cache: UnwindCache,
    counts: HashMap<Key, Counts>,
    threads: HashMap<u32, Thread>,
    unreadable: Vec<Unreadable>,
    /// SAMPLE records without a thread id (none, unless the layout lacks TID).
    pub anonymous_samples: u64,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Collector {
        Collector::default()
    }

    /// Unwinds the user stack copies samples carry (REGS_USER and
    /// STACK_USER) with each module's `.eh_frame`, instead of taking the
    /// user part of the kernel's call chain.
    pub fn unwind_stacks(&mut self, on: bool) {
        self.unwind = on;
    }

    /// Names thread `tid` of process `pid` (threads found at start).
    pub fn thread(&mut self, pid: u32, tid: u32, comm: &str) {
        self.threads.insert(tid, Thread { pid, tid, comm: comm.to_string() });
    }

    /// Takes the executable mappings process `pid` has now (at start), reading
    /// their files.
    pub fn process_maps(&mut self, pid: u32, mappings: &[Mapping]) {
        let space = self.new_space(pid, Space::default());
        for m in mappings.iter().filter(|m| m.perms.exec && names_something(m.name.as_bytes())) {
            let entry = self.entry(pid, space, m);
            self.spaces[space as usize].entries.push(entry);
        }
    }

    fn new_space(&mut self, pid: u32, space: Space) -> u32 {
        let id = self.spaces.len() as u32;
        self.spaces.push(space);
        self.space_of.insert(pid, id);
        self.first_space_of.entry(pid).or_insert(id);
        id
    }

    /// Consumes one parsed record.
    pub fn record(&mut self, rec: &Record<'_>) {
        match rec {
            Record::Sample(s) => self.sample(s),
            Record::Mmap2(m) => self.mmap2(m),
            Record::Comm(c) => self.comm(c),
            Record::Fork(t) => self.fork(t),
            _ => {}
        }
    }

    fn sample(&mut self, s: &Sample<'_>) {
        let Some((pid, tid)) = s.pid_tid else {
            self.anonymous_samples += 1;
            return;
        };
        self.scratch.clear();
        match s.callchain {
            Some(chain) => self.scratch.extend(chain.iter()),
            None if s.regs_user.is_some() => {}
            None => {
                let context = match s.misc & MISC_CPUMODE_MASK {
                    MISC_KERNEL => CONTEXT_KERNEL,
                    MISC_USER => CONTEXT_USER,
                    MISC_HYPERVISOR => CONTEXT_HV,
                    _ => CONTEXT_GUEST,
                };
                self.scratch.extend([context, s.ip.unwrap_or(0)]);
            }
        }
        if let (true, Some(regs), Some(stack)) = (self.unwind, s.regs_user, s.stack_user) {
            self.scratch.push(CONTEXT_USER);
            let ip = regs.get(x86_regs::IP).unwrap_or(0);
            let sp = regs.get(x86_regs::SP).unwrap_or(0);
            let bp = regs.get(x86_regs::BP).unwrap_or(0);
            let space = self.space_of.get(&pid).map(|&sp| &self.spaces[sp as usize].unwinder);
            let Some(unwinder) = space else {
                self.scratch.push(ip);
                return self.count(pid, tid, s.period);
            };
            let mut read = |addr: u64| -> Result<u64, ()> {
                let at = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
                let word = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
                Ok(u64::from_ne_bytes(word.try_into().map_err(|_| ())?))
            };
            let regs = UnwindRegsX86_64::new(ip, sp, bp);
            let mut frames = unwinder.iter_frames(ip, regs, &mut self.unwind_cache.0, &mut read);
            // An error ends the chain where unwinding could go no further.
            while let Ok(Some(f)) = frames.next() {
                if self.scratch.len() >= MAX_UNWOUND {
                    break;
                }
                self.scratch.push(f.address());
            }
        }
        self.count(pid, tid, s.period);
    }

    /// Counts the stack in `scratch` for thread `tid` of process `pid`.
    fn count(&mut self, pid: u32, tid: u32, period: Option<u64>) {
        let stack = match self.stack_ids.get(self.scratch.as_slice()) {
            Some(&id) => id,
            None => {
                let id = self.stacks.len() as u32;
                let owned: Box<[u64]> = self.scratch.as_slice().into();
                self.stacks.push(owned.clone());
                self.stack_ids.insert(owned, id);
                id
            }
        };
        let space = self.space_of.get(&pid).map(|&sp| (sp, self.spaces[sp as usize].entries.len() as u32));
        let c = self.counts.entry(Key { pid, tid, stack, space }).or_default();
        c.samples += 1;
        c.weight = c.weight.saturating_add(period.unwrap_or(1));
        if !self.threads.contains_key(&tid) {
            let comm = self.threads.get(&pid).map(|t| t.comm.clone()).unwrap_or_default();
            self.threads.insert(tid, Thread { pid, tid, comm });
        }
    }

    fn mmap2(&mut self, m: &Mmap2<'_>) {
        if !names_something(m.filename) {
            return;
        }
        let name = String::from_utf8_lossy(m.filename).into_owned();
        let (dev, inode) = match m.file {
            MmapFile::Inode { major, minor, ino, .. } => ((major, minor), ino),
            MmapFile::BuildId(_) => ((0, 0), 0),
        };
        let mapping = Mapping {
            start: m.addr,
            end: m.addr.saturating_add(m.len),
            perms: Perms { read: true, write: false, exec: true, private: true },
            offset: m.pgoff,
            dev,
            inode,
            name,
        };
        let space = match self.space_of.get(&m.pid) {
            Some(&s) => s,
            None => self.new_space(m.pid, Space::default()),
        };
        let entry = self.entry(m.pid, space, &mapping);
        self.spaces[space as usize].entries.push(entry);
    }

    fn comm(&mut self, c: &Comm<'_>) {
        let comm = String::from_utf8_lossy(c.comm).into_owned();
        self.threads.insert(c.tid, Thread { pid: c.pid, tid: c.tid, comm });
        if c.exec {
            self.new_space(c.pid, Space::default());
        }
    }

    fn fork(&mut self, t: &Task) {
        let comm = self.threads.get(&t.ptid).map(|p| p.comm.clone()).unwrap_or_default();
        // Its samples may have been read first (another CPU's ring), with no name.
        let thread =
            self.threads.entry(t.tid).or_insert(Thread { pid: t.pid, tid: t.tid, comm: String::new() });
        if thread.comm.is_empty() {
            thread.comm = comm;
        }
        if t.pid != t.ppid {
            // A new process starts with a copy of its parent's mappings.
            let parent = self.space_of.get(&t.ppid).map(|&s| self.spaces[s as usize].clone());
            self.new_space(t.pid, parent.unwrap_or_default());
        }
    }

    /// The entry for mapping `m` of process `pid`, its file read now, once
    /// per file.
    fn entry(&mut self, pid: u32, space: u32, m: &Mapping) -> MapEntry {
        let range = m.start..m.end;
        if m.file().is_none() {
            return MapEntry { range, name: m.name.clone(), module: None };
        }
        let id = (m.dev.0, m.dev.1, m.inode);
        if !self.files.contains_key(&id) {
            let read = read_module(pid, m).map(|elf| File { elf, unwind: None });
            if let Err(reason) = &read {
                self.unreadable.push(Unreadable { path: m.name.clone(), reason: reason.clone() });
            }
            self.files.insert(id, read);
        }
        let unwind = self.unwind;
        let Ok(file) = self.files.get_mut(&id).expect("inserted above") else {
            return MapEntry { range, name: m.name.clone(), module: None };
        };
        let module = Module::new(PathBuf::from(&m.name), range.clone(), m.offset, file.elf.clone());
        if let (true, Some(module)) = (unwind, &module) {
            let sections = file.unwind.get_or_insert_with(|| unwind_sections(&file.elf)).clone();
            let unwinder = framehop::Module::new(m.name.clone(), range.clone(), module.bias, sections);
            self.spaces[space as usize].unwinder.add_module(unwinder);
        }
        MapEntry { range, name: m.name.clone(), module }
    }

    /// Gives each stripped module the symbols of its separate debug file
    /// under `root`, where one is installed. Done once recording ends, so
    /// reading them never delays draining the rings.
    fn add_debug_symbols(&mut self, root: &Path) {
        let mut debug: HashMap<*const ElfFile, Option<Arc<ElfFile>>> = HashMap::new();
        for e in self.spaces.iter_mut().flat_map(|s| s.entries.iter_mut()) {
            let Some(module) = e.module.take() else { continue };
            let elf: &ElfFile = module.elf();
            let found = debug
                .entry(elf as *const ElfFile)
                .or_insert_with(|| elf.is_stripped().then(|| elf.debug_file(root).map(Arc::new)).flatten());
            e.module = Some(match found {
                Some(d) => module.with_debug_symbols(d.clone()),
                None => module,
            });
        }
    }

    /// Samples read so far.
    pub fn samples(&self) -> u64 {
        self.counts.values().map(|c| c.samples).sum()
    }

    /// Resolves every sampled address and returns what a recording keeps.
    pub fn finish(mut self) -> Symbolized {
        self.add_debug_symbols(Path::new(DEBUG_ROOT));
        let mut s = Symbolizer {
            c: &self,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            by_address: HashMap::new(),
            kallsyms: None,
        };
        let mut stacks: Vec<Vec<u32>> = Vec::new();
        let mut stack_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut merged: HashMap<(u32, u32, u32), Counts> = HashMap::new();
        let mut resolved_cache: HashMap<(u32, SpaceAt), u32> = HashMap::new();
        for (key, counts) in &self.counts {
            // A sample read before its process' FORK record (another CPU's
            // ring) resolves in the address space that record made.
            let space = key.space.or_else(|| {
                let sp = *self.first_space_of.get(&key.pid)?;
                Some((sp, self.spaces[sp as usize].entries.len() as u32))
            });
            let id = *resolved_cache.entry((key.stack, space)).or_insert_with(|| {
                let frames = s.stack(&self.stacks[key.stack as usize], space);
                let next = stack_ids.len() as u32;
                *stack_ids.entry(frames.clone()).or_insert_with(|| {
                    stacks.push(frames);
                    next
                })
            });
            let m = merged.entry((key.pid, key.tid, id)).or_default();
            m.samples += counts.samples;
            m.weight = m.weight.saturating_add(counts.weight);
        }
        let mut samples: Vec<SampleCount> = merged
            .into_iter()
            .map(|((pid, tid, stack), c)| SampleCount { pid, tid, stack, count: c.samples, weight: c.weight })
            .collect();
        samples.sort_by_key(|x| (x.pid, x.tid, x.stack));
        let frames = s.frames;
        let mut threads: Vec<Thread> = self.threads.into_values().collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        Symbolized { frames, stacks, samples, threads, unreadable: self.unreadable }
    }
}

/// Frames, stacks (frame ids, root first) and counts of a finished collection.
#[derive(Debug)]
pub struct Symbolized {
    /// Distinct frames.
    pub frames: Vec<Frame>,
    /// Distinct stacks, root first.
    pub stacks: Vec<Vec<u32>>,
    /// Counts per thread and stack.
    pub samples: Vec<SampleCount>,
    /// Every thread seen.
    pub threads: Vec<Thread>,
    /// Module files that could not be read.
    pub unreadable: Vec<Unreadable>,
}

struct Symbolizer<'a> {
    c: &'a Collector,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    /// Frames already resolved: (address space, context marker, address).
    by_address: HashMap<(SpaceAt, u64, u64), u32>,
    kallsyms: Option<Kallsyms>,
}

impl Symbolizer<'_> {
    /// The frames of raw chain `chain` (innermost first, with markers), root first.
    fn stack(&mut self, chain: &[u64], space: SpaceAt) -> Vec<u32> {
        let mut out = Vec::with_capacity(chain.len());
        let mut context = CONTEXT_USER;
        let mut first = true;
        for &a in chain {
            if a >= CONTEXT_MAX {
                context = a;
                first = true;
                continue;
            }
            // Only the first address of a context is where execution was;
            // the rest are return addresses, whose call is the byte before.
            let at = if first { a } else { a.saturating_sub(1) };
            first = false;
            let id = match self.by_address.get(&(space, context, at)) {
                Some(&id) => id,
                None => {
                    let frame = self.frame(context, at, space);
                    let id = self.intern(frame);
                    self.by_address.insert((space, context, at), id);
                    id
                }
            };
            out.push(id);
        }
        out.reverse();
        out
    }

    fn intern(&mut self, f: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    fn frame(&mut self, context: u64, addr: u64, space: SpaceAt) -> Frame {
        let other = |name: &str| Frame { name: name.into(), module: name.into(), kernel: false };
        match context {
            CONTEXT_KERNEL => self.kernel_frame(addr),
            CONTEXT_USER => self.user_frame(addr, space),
            CONTEXT_HV => other("[hypervisor]"),
            CONTEXT_GUEST | CONTEXT_GUEST_KERNEL | CONTEXT_GUEST_USER => other("[guest]"),
            _ => other("[unknown]"),
        }
    }

    fn user_frame(&self, addr: u64, space: SpaceAt) -> Frame {
        let unknown = Frame { name: "[unknown]".into(), module: "[unknown]".into(), kernel: false };
        let Some((sp, known)) = space else { return unknown };
        let entries = &self.c.spaces[sp as usize].entries;
        let (before, after) = entries.split_at((known as usize).min(entries.len()));
        // The newest mapping known at the sample, else one read after it.
        let Some(e) = before.iter().rev().chain(after).find(|e| e.range.contains(&addr)) else {
            return unknown;
        };
        // A symbol version (`__libc_start_main@@GLIBC_2.34`) is not part of the name.
        let unversioned = |n: String| match n.split_once('@') {
            Some((base, _)) if !base.is_empty() => base.to_string(),
            _ => n,
        };
        let name = e
            .module
            .as_ref()
            .and_then(|m| m.resolve(addr))
            .map(|r| unversioned(r.name))
            .map(|n| demangle(&n).unwrap_or(n));
        // `[vdso]`, or `[libfoo.so]` for a file with no symbol there.
        let base = || match Path::new(&e.name).file_name() {
            _ if e.name.starts_with('[') => e.name.clone(),
            Some(n) => format!("[{}]", n.to_string_lossy()),
            None => format!("[{}]", e.name),
        };
        Frame { name: name.unwrap_or_else(base), module: e.name.clone(), kernel: false }
    }

    fn kernel_frame(&mut self, addr: u64) -> Frame {
        let k = self.kallsyms.get_or_insert_with(Kallsyms::load);
        match k.resolve(addr) {
            Some((name, module)) => {
                Frame { name: name.to_string(), module: module.to_string(), kernel: true }
            }
            None => Frame { name: "[kernel]".into(), module: "[kernel.kallsyms]".into(), kernel: true },
        }
    }
}

/// Whether an executable mapping of this name can name its frames: a file
/// or `[vdso]`. Anonymous executable memory (JIT code, `//anon`) cannot; it
/// is left out, so a JIT that maps code all the time adds no entries.
fn names_something(name: &[u8]) -> bool {
    (name.starts_with(b"/") && !name.starts_with(b"//")) || name.starts_with(b"[")
}

/// The sections framehop unwinds with: `.eh_frame` and its header, `.text`
/// (for prologues and epilogues) and `.got`, copied out of the file once.
fn unwind_sections(elf: &ElfFile) -> ExplicitModuleSectionInfo<Arc<[u8]>> {
    let range = |name: &str| elf.section(name).map(|s| s.address..s.address + s.size);
    let data = |name: &str| -> Option<Arc<[u8]>> {
        let s = elf.section(name)?;
        let start = usize::try_from(s.file_offset).ok()?;
        elf.data().get(start..start.checked_add(usize::try_from(s.size).ok()?)?).map(Arc::from)
    };
    ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: range(".text"),
        text: data(".text"),
        got_svma: range(".got"),
        eh_frame_svma: range(".eh_frame"),
        eh_frame: data(".eh_frame"),
        eh_frame_hdr_svma: range(".eh_frame_hdr"),
        eh_frame_hdr: data(".eh_frame_hdr"),
        ..Default::default()
    }
}

/// Reads the ELF file process `pid` maps at `m`: its exact mapping, or the
/// one of the same file that covers its start (a later `mprotect` may have
/// split the mapping the MMAP2 record describes).
fn read_module(pid: u32, m: &Mapping) -> Result<Arc<ElfFile>, String> {
    let pid = pid as i32;
    let bytes = match input::read_module(pid, m, MODULE_LIMIT) {
        Ok(b) => b,
        Err(first) => {
            let now = maps::read(pid).map_err(|_| first.to_string())?;
            let same = now
                .iter()
                .find(|n| (n.dev, n.inode) == (m.dev, m.inode) && n.start <= m.start && m.start < n.end)
                .ok_or_else(|| first.to_string())?;
            input::read_module(pid, same, MODULE_LIMIT).map_err(|e| e.to_string())?
        }
    };
    let bytes = bytes.ok_or_else(|| "not an ELF file".to_string())?;
    ElfFile::parse(&m.name, bytes).map(Arc::new).map_err(|e| e.to_string())
}

/// Kernel text symbols from `/proc/kallsyms`, sorted by address; empty when
/// the kernel hides addresses (`kptr_restrict`, not root).
#[derive(Debug, Default)]
struct Kallsyms {
    syms: Vec<(u64, String, String)>,
}

impl Kallsyms {
    fn load() -> Kallsyms {
        let Ok(bytes) = input::read_file(Path::new("/proc/kallsyms"), KALLSYMS_LIMIT) else {
            return Kallsyms::default();
        };
        Kallsyms::parse(&String::from_utf8_lossy(&bytes))
    }

    fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, String, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                if addr == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
                    return None;
                }
                let module = it.next().map_or("[kernel.kallsyms]".to_string(), |m| m.to_string());
                Some((addr, name.to_string(), module))
            })
            .collect();
        syms.sort_by_key(|s| s.0);
        Kallsyms { syms }
    }

    fn resolve(&self, addr: u64) -> Option<(&str, &str)> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (_, name, module) = &self.syms[i];
        Some((name, module))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use papirus_substrate::sample::SampleLayout;

    #[inline(never)]
    fn marker() -> u64 {
        std::hint::black_box(1)
    }

    fn sample_record(pid: u32, tid: u32, period: u64, chain: &[u64]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&0u64.to_ne_bytes()); // ip
        body.extend_from_slice(&pid.to_ne_bytes());
        body.extend_from_slice(&tid.to_ne_bytes());
        body.extend_from_slice(&period.to_ne_bytes());
        body.extend_from_slice(&(chain.len() as u64).to_ne_bytes());
        for a in chain {
            body.extend_from_slice(&a.to_ne_bytes());
        }
        let mut r = Vec::new();
        r.extend_from_slice(&9u32.to_ne_bytes());
        r.extend_from_slice(&MISC_USER.to_ne_bytes());
        r.extend_from_slice(&((8 + body.len()) as u16).to_ne_bytes());
        r.extend(body);
        r
    }

    fn layout() -> SampleLayout {
        use papirus_substrate::sample::SampleType as T;
        SampleLayout { sample_type: T::IP | T::TID | T::PERIOD | T::CALLCHAIN, ..Default::default() }
    }

    #[test]
    fn resolves_this_process_functions_with_counts_and_weights() {
        let me = std::process::id();
        let mut c = Collector::new();
        c.thread(me, me, "self");
        c.process_maps(me, &maps::read(me as i32).unwrap());
        let f = marker as *const () as u64;
        // A return address just past a call at the end of `marker` resolves to it (the -1 rule).
        for (chain, period) in [(vec![CONTEXT_USER, f + 1], 10), (vec![CONTEXT_USER, f + 2, f + 1], 5)] {
            let bytes = sample_record(me, me + 1, period, &chain);
            c.record(&Record::parse(&bytes, &layout()).unwrap());
        }
        let bytes = sample_record(me, me + 1, 10, &[CONTEXT_USER, f + 1]);
        c.record(&Record::parse(&bytes, &layout()).unwrap());
        assert_eq!(c.samples(), 3);
        let s = c.finish();
        assert!(s.unreadable.is_empty(), "{:?}", s.unreadable);
        assert_eq!(s.samples.len(), 2);
        let one = s.samples.iter().find(|x| s.stacks[x.stack as usize].len() == 1).unwrap();
        assert_eq!((one.count, one.weight, one.tid), (2, 20, me + 1));
        let name = &s.frames[s.stacks[one.stack as usize][0] as usize].name;
        assert!(name.contains("marker"), "{name}");
        let thread = s.threads.iter().find(|t| t.tid == me + 1).unwrap();
        assert_eq!(thread.comm, "self", "a new thread takes its process' name");
    }

    #[test]
    fn unmapped_addresses_and_unknown_processes_are_unknown() {
        let mut c = Collector::new();
        let bytes = sample_record(1, 1, 1, &[CONTEXT_USER, 0x1000]);
        c.record(&Record::parse(&bytes, &layout()).unwrap());
        let s = c.finish();
        assert_eq!(
            s.frames,
            vec![Frame { name: "[unknown]".into(), module: "[unknown]".into(), kernel: false }]
        );
    }

    #[test]
    fn kallsyms_lines_resolve_text_symbols_only() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 D some_data\nffffffff81000200 t helper\t[ext4]\n\
             0000000000000000 T hidden\n",
        );
        assert_eq!(k.resolve(0xffffffff81000150), Some(("_stext", "[kernel.kallsyms]")));
        assert_eq!(k.resolve(0xffffffff81000300), Some(("helper", "[ext4]")));
        assert_eq!(k.resolve(0x1000), None);
    }
}
