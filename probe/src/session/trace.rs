//! Traces: the tool drains the target's per-thread rings ([`layout`]'s trace
//! rings) while it runs, and at the end, into a trace file of its own.
//!
//! # File format (version [`TRACE_VERSION`])
//!
//! Little-endian. The magic `PAPIRTRC`, a `u32` version, a `u32` 0, then
//! blocks, each a `u32` kind, a `u32` payload length in bytes, and the payload:
//!
//! | kind | payload |
//! | --- | --- |
//! | [`HEADER`] | JSON [`TraceHeader`] (always the first block) |
//! | [`THREAD`] | `pid u32, tid u32, start u64`: a thread took a ring at `start` (TSC ticks) |
//! | [`CALLS`] | `pid u32, tid u32, words u32, n u32`, then `n` calls of `words` `u64`s each |
//! | [`LOST`] | `pid u32, tid u32, n u64`: `n` calls overwritten in the ring before the tool read them (tid 0: their thread is unknown) |
//! | [`FOOTER`] | JSON [`TraceFooter`] (the last block; a file without it was cut short) |
//!
//! A call is `start, end, info` and, with the counters probe, the counter
//! values at entry then at exit: `info` is `kind << 48 | depth << 32 |
//! function`, kind [`record::RETURNED`], [`record::UNWOUND`] or [`OPEN`]
//! (still running when the trace ended: `end` is the trace's end), depth the
//! call's shadow-stack depth (0: outermost). Times are TSC ticks; the header
//! gives the rate and the tick the trace starts at. Blocks of one thread are
//! in the order the thread closed its calls (children before parents).
//!
//! # Memory
//!
//! The target holds one ring per thread slot ([`TraceHeader::ring`] records
//! of [`TraceHeader::record_words`] words: 6 MiB per thread by default,
//! backed once written); the tool holds one copy buffer and writes through a
//! buffered file, so a trace of any length needs no more.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use papirus_probe_abi::layout::record;
use papirus_probe_abi::segment::{Segment, TraceRecord};
use papirus_probe_abi::{ProcessReport, Window};
use serde::{Deserialize, Serialize};

use super::ProbeError;

/// `PAPIRTRC`.
pub const TRACE_MAGIC: [u8; 8] = *b"PAPIRTRC";
/// Version of the trace file format; a reader refuses any other.
pub const TRACE_VERSION: u32 = 1;
/// Block kind: the header.
pub const HEADER: u32 = 1;
/// Block kind: a thread took a ring.
pub const THREAD: u32 = 2;
/// Block kind: closed calls of one thread.
pub const CALLS: u32 = 3;
/// Block kind: calls lost to ring overwrites.
pub const LOST: u32 = 4;
/// Block kind: the footer.
pub const FOOTER: u32 = 5;
/// Call kind in a trace file: still running when the trace ended.
pub const OPEN: u64 = 3;
/// Largest block payload a reader accepts.
const MAX_BLOCK: u32 = 64 << 20;
/// Largest trace file read, in bytes.
pub const TRACE_LIMIT: u64 = 4 << 30;

/// What a trace file says about itself first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// [`TRACE_VERSION`].
    pub format_version: u32,
    /// The target's process id.
    pub pid: u32,
    /// The probe.
    pub probe: String,
    /// The program (its file name for `run`, its `comm` for `attach`).
    #[serde(default)]
    pub command: String,
    /// Every instrumented function by id; the traced ones are ids below [`TraceHeader::traced`].
    pub functions: Vec<String>,
    /// Functions traced.
    pub traced: u64,
    /// Counter events, in the order of a call's counter words.
    pub events: Vec<String>,
    /// The tick the trace starts at (the session's set-up).
    pub start_tsc: u64,
    /// TSC ticks per second (the footer's figure wins when it differs).
    pub ticks_per_second: f64,
    /// Records per thread's ring.
    pub ring: u64,
    /// Words per ring record.
    pub record_words: u64,
    /// Calls shorter than this were not traced.
    pub min_duration_ns: u64,
    /// Calls this deep or deeper were not traced (`None`: no limit).
    pub max_depth: Option<u64>,
}

/// What a trace file says about itself last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceFooter {
    /// TSC ticks per second.
    pub ticks_per_second: f64,
    /// The tick the trace ends at (calls still open end there).
    pub end_tsc: u64,
    /// Calls written.
    pub calls: u64,
    /// Calls lost to ring overwrites (the tool drained too late).
    pub lost: u64,
    /// The measurement window.
    pub window: Window,
    /// Every process of the measured tree, as the report lists them.
    pub processes: Vec<ProcessReport>,
}

/// A trace being written: a fresh file beside the destination, renamed over
/// it by [`TraceWriter::finish`] (never opened through a planted name).
#[derive(Debug)]
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<tempfile::NamedTempFile>,
    calls: u64,
    lost: u64,
    bytes: u64,
    /// A block being encoded (kept for the next).
    scratch: Vec<u8>,
}

fn io_err(path: &Path, e: std::io::Error) -> ProbeError {
    ProbeError::Io { op: "write trace", path: path.to_path_buf(), source: e }
}

impl TraceWriter {
    /// Starts the trace file at `path` with its header.
    pub fn create(path: &Path, header: &TraceHeader) -> Result<TraceWriter, ProbeError> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".papirus-trace-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|e| io_err(path, e))?;
        let mut w = TraceWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, tmp),
            calls: 0,
            lost: 0,
            bytes: 0,
            scratch: Vec::new(),
        };
        let mut start = TRACE_MAGIC.to_vec();
        start.extend(TRACE_VERSION.to_le_bytes());
        start.extend(0u32.to_le_bytes());
        w.put(&start)?;
        let json = serde_json::to_vec(header).map_err(|e| io_err(path, e.into()))?;
        w.block(HEADER, &[&json])?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> Result<(), ProbeError> {
        self.bytes += b.len() as u64;
        self.out.write_all(b).map_err(|e| io_err(&self.path, e))
    }

    fn block(&mut self, kind: u32, parts: &[&[u8]]) -> Result<(), ProbeError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut head = kind.to_le_bytes().to_vec();
        head.extend((len as u32).to_le_bytes());
        self.put(&head)?;
        for p in parts {
            self.put(p)?;
        }
        Ok(())
    }

    /// A thread took a ring at tick `start`.
    pub fn thread(&mut self, pid: u32, tid: u32, start: u64) -> Result<(), ProbeError> {
        let mut b = pid.to_le_bytes().to_vec();
        b.extend(tid.to_le_bytes());
        b.extend(start.to_le_bytes());
        self.block(THREAD, &[&b])
    }

    /// Calls of one thread, `words` words each (split into blocks under the reader's bound).
    pub fn calls(&mut self, pid: u32, tid: u32, words: u64, data: &[u64]) -> Result<(), ProbeError> {
        let per_block = (MAX_BLOCK as usize / 8 / words as usize).max(1) * words as usize;
        let mut bytes = std::mem::take(&mut self.scratch);
        for chunk in data.chunks(per_block) {
            let n = chunk.len() as u64 / words;
            bytes.clear();
            for v in [pid, tid, words as u32, n as u32] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            for w in chunk {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
            self.block(CALLS, &[&bytes])?;
            self.calls += n;
        }
        self.scratch = bytes;
        Ok(())
    }

    /// `n` calls of a thread lost to ring overwrites.
    pub fn lost(&mut self, pid: u32, tid: u32, n: u64) -> Result<(), ProbeError> {
        let mut b = pid.to_le_bytes().to_vec();
        b.extend(tid.to_le_bytes());
        b.extend(n.to_le_bytes());
        self.lost += n;
        self.block(LOST, &[&b])
    }

    /// Calls written so far, calls lost so far, bytes written so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.calls, self.lost, self.bytes)
    }

    /// Writes the footer, then puts the file in place atomically (renamed
    /// over the destination, not `fsync`ed: see `papirus_formats::output`).
    pub fn finish(mut self, mut footer: TraceFooter) -> Result<(u64, u64, u64), ProbeError> {
        footer.calls = self.calls;
        footer.lost = self.lost;
        let json = serde_json::to_vec(&footer).map_err(|e| io_err(&self.path, e.into()))?;
        self.block(FOOTER, &[&json])?;
        let counts = self.counts();
        let path = self.path.clone();
        let tmp = self.out.into_inner().map_err(|e| io_err(&path, e.into_error()))?;
        tmp.persist(&path).map_err(|e| io_err(&path, e.error))?;
        Ok(counts)
    }
}

/// The slot owners a drainer has seen: generation → (pid, tid).
#[derive(Debug, Default, Clone)]
struct SlotState {
    next: u64,
    owners: Vec<(u64, u32, u32)>,
}

/// Drains a segment's trace rings into a [`TraceWriter`].
#[derive(Debug)]
pub struct Drainer {
    slots: Vec<SlotState>,
    words: u64,
    buf: Vec<u64>,
    /// Process record index → pid, for threads whose start record was lost.
    pids: BTreeMap<u64, u32>,
}

/// Generations kept per slot (the newest); older threads' records are long drained.
const OWNERS_KEPT: usize = 8;

impl Drainer {
    /// A drainer for `seg`'s rings.
    pub fn new(seg: &Segment<'_>) -> Drainer {
        let g = seg.geometry();
        Drainer {
            slots: vec![SlotState::default(); g.shape.slots as usize],
            words: g.shape.record_words,
            buf: Vec::new(),
            pids: BTreeMap::new(),
        }
    }

    /// Copies every record written since the last drain into `w`; returns
    /// the calls copied.
    pub fn drain(&mut self, seg: &Segment<'_>, w: &mut TraceWriter) -> Result<u64, ProbeError> {
        let mut copied = 0;
        let rw = self.words as usize;
        for i in 0..(seg.slots_used() as usize).min(self.slots.len()) {
            self.buf.clear();
            let d = seg.drain(i as u64, self.slots[i].next, &mut self.buf);
            self.slots[i].next = d.next;
            if d.lost > 0 {
                let (pid, tid) = self.current_owner(seg, i);
                w.lost(pid, tid, d.lost)?;
            }
            let mut owner: Option<(u32, u32)> = None;
            let mut chunk_start = 0;
            let mut buf = std::mem::take(&mut self.buf);
            // The file's calls carry no generation bits.
            let keep = (1u64 << 50) - 1;
            let mut generation = None;
            for k in 0..buf.len() / rw {
                let rec = TraceRecord::decode(&buf[k * rw..(k + 1) * rw]);
                if rec.kind == record::THREAD {
                    self.flush_run(w, owner, &buf[chunk_start * rw..k * rw])?;
                    chunk_start = k + 1;
                    let (pid, tid) = ((rec.end >> 32) as u32, rec.end as u32);
                    let s = &mut self.slots[i];
                    s.owners.push((rec.generation, pid, tid));
                    if s.owners.len() > OWNERS_KEPT {
                        s.owners.remove(0);
                    }
                    w.thread(pid, tid, rec.start)?;
                    (owner, generation) = (None, None);
                    continue;
                }
                buf[k * rw + record::INFO] &= keep;
                if generation != Some(rec.generation) {
                    generation = Some(rec.generation);
                    let o = self.owner_of(seg, i, rec.generation);
                    if owner != Some(o) {
                        self.flush_run(w, owner, &buf[chunk_start * rw..k * rw])?;
                        chunk_start = k;
                        owner = Some(o);
                    }
                }
                copied += 1;
            }
            self.flush_run(w, owner, &buf[chunk_start * rw..])?;
            self.buf = buf;
        }
        Ok(copied)
    }

    /// Writes a run of one owner's records (their generation bits cleared).
    fn flush_run(
        &self,
        w: &mut TraceWriter,
        owner: Option<(u32, u32)>,
        run: &[u64],
    ) -> Result<(), ProbeError> {
        match owner {
            Some((pid, tid)) if !run.is_empty() => w.calls(pid, tid, self.words, run),
            _ => Ok(()),
        }
    }

    /// The thread of generation `generation` of slot `i`: from its start
    /// record, else the slot's owner now when the generation matches, else unknown (tid 0).
    fn owner_of(&mut self, seg: &Segment<'_>, i: usize, generation: u64) -> (u32, u32) {
        if let Some(&(_, pid, tid)) = self.slots[i].owners.iter().rev().find(|o| o.0 == generation) {
            return (pid, tid);
        }
        let mask = (1u64 << record::GEN_BITS) - 1;
        match seg.slot_owner(i as u64) {
            Some((tid, g)) if g & mask == generation => (self.pid_of(seg, i), tid),
            _ => (self.pid_of(seg, i), 0),
        }
    }

    fn current_owner(&mut self, seg: &Segment<'_>, i: usize) -> (u32, u32) {
        let tid = seg.slot_owner(i as u64).map_or(0, |o| o.0);
        (self.pid_of(seg, i), tid)
    }

    fn pid_of(&mut self, seg: &Segment<'_>, i: usize) -> u32 {
        let record = seg.slot_process(i as u64);
        if let Some(&pid) = self.pids.get(&record) {
            return pid;
        }
        let pid = seg.process_pid(record);
        if pid != 0 {
            self.pids.insert(record, pid);
        }
        pid
    }

    /// Writes the calls still open at tick `end` (threads alive when the
    /// trace ends, e.g. `main` at detach) that the filters let through.
    pub fn open_calls(
        &mut self,
        seg: &Segment<'_>,
        w: &mut TraceWriter,
        end: u64,
        filter: &Filter,
    ) -> Result<(), ProbeError> {
        let mut by_thread: BTreeMap<(u32, u32), Vec<u64>> = BTreeMap::new();
        for f in seg.open_frames() {
            let dur = end.saturating_sub(f.start);
            if !filter.keeps(f.function, f.depth, dur) {
                continue;
            }
            let pid = seg.process_pid(u64::from(f.process));
            let r = by_thread.entry((pid, f.tid)).or_default();
            r.extend([f.start, end, (OPEN << 48) | (f.depth.min(0xffff) << 32) | f.function]);
            r.resize(r.len() + self.words as usize - 3, 0);
        }
        for ((pid, tid), data) in by_thread {
            w.calls(pid, tid, self.words, &data)?;
        }
        Ok(())
    }
}

/// How often the tool drains the rings while the target runs.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(2);

/// A trace in the making: the writer, the drainer and the filters.
#[derive(Debug)]
pub struct Tracing {
    writer: TraceWriter,
    drainer: Drainer,
    filter: Filter,
    /// The first write error; draining stops there and the end reports it.
    failed: Option<ProbeError>,
}

/// What a finished trace holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSummary {
    /// The file.
    pub path: PathBuf,
    /// Calls written.
    pub calls: u64,
    /// Calls lost to ring overwrites.
    pub lost: u64,
    /// Bytes of the file.
    pub bytes: u64,
}

impl Tracing {
    /// Starts the trace file for `seg`'s session.
    pub fn start(
        path: &Path,
        seg: &Segment<'_>,
        header: &TraceHeader,
        filter: Filter,
    ) -> Result<Tracing, ProbeError> {
        Ok(Tracing {
            writer: TraceWriter::create(path, header)?,
            drainer: Drainer::new(seg),
            filter,
            failed: None,
        })
    }

    /// One drain of every ring (nothing after a write error).
    pub fn drain(&mut self, seg: &Segment<'_>) {
        if self.failed.is_none()
            && let Err(e) = self.drainer.drain(seg, &mut self.writer)
        {
            self.failed = Some(e);
        }
    }

    /// Drains every [`DRAIN_INTERVAL`] until `stop` is set.
    pub fn drain_until(&mut self, seg: &Segment<'_>, stop: &std::sync::atomic::AtomicBool) {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            self.drain(seg);
            std::thread::sleep(DRAIN_INTERVAL);
        }
    }

    /// The last drain, the calls still open at tick `end`, the footer; the
    /// file then replaces whatever was at its path.
    pub fn finish(
        mut self,
        seg: &Segment<'_>,
        end: u64,
        footer: TraceFooter,
    ) -> Result<TraceSummary, ProbeError> {
        self.drain(seg);
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.drainer.open_calls(seg, &mut self.writer, end, &self.filter)?;
        let path = self.writer.path.clone();
        let (calls, lost, bytes) = self.writer.finish(TraceFooter { end_tsc: end, ..footer })?;
        Ok(TraceSummary { path, calls, lost, bytes })
    }
}

/// What a session traces, in ticks (the runtime's filters, for calls the tool adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// Functions with ids below this.
    pub functions: u64,
    /// Calls shallower than this.
    pub depth: u64,
    /// Calls lasting at least this many ticks.
    pub min_ticks: u64,
}

impl Filter {
    /// Whether a call passes.
    pub fn keeps(&self, function: u64, depth: u64, ticks: u64) -> bool {
        function < self.functions && depth < self.depth && ticks >= self.min_ticks
    }
}

/// One traced call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Function id.
    pub function: u32,
    /// Shadow-stack depth (0: outermost).
    pub depth: u32,
    /// [`record::RETURNED`], [`record::UNWOUND`] or [`OPEN`].
    pub kind: u64,
    /// Entry tick.
    pub start: u64,
    /// Exit tick.
    pub end: u64,
}

/// One thread's calls, as the file lists them (children before parents).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadTrace {
    /// Process id.
    pub pid: u32,
    /// Thread id (0: a thread whose start was lost).
    pub tid: u32,
    /// When it took its ring (tick), if known.
    pub started: Option<u64>,
    /// Its calls.
    pub calls: Vec<Call>,
    /// Counter values per call: at entry then at exit, `counters_per_call` words each.
    pub counters: Vec<u64>,
    /// Words of `counters` per call.
    pub counters_per_call: usize,
    /// Calls lost to ring overwrites.
    pub lost: u64,
}

/// A trace file, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Its header.
    pub header: TraceHeader,
    /// Its footer (`None`: the file was cut short).
    pub footer: Option<TraceFooter>,
    /// Threads in order of appearance.
    pub threads: Vec<ThreadTrace>,
}

impl Trace {
    /// TSC ticks per second.
    pub fn ticks_per_second(&self) -> f64 {
        self.footer.as_ref().map_or(self.header.ticks_per_second, |f| f.ticks_per_second)
    }

    /// Nanoseconds since the trace's start for tick `t`.
    pub fn ns(&self, t: u64) -> f64 {
        let hz = self.ticks_per_second();
        if hz > 0.0 { t.saturating_sub(self.header.start_tsc) as f64 * 1e9 / hz } else { 0.0 }
    }

    /// Calls lost, all threads.
    pub fn lost(&self) -> u64 {
        self.threads.iter().map(|t| t.lost).sum()
    }

    /// Calls traced, all threads.
    pub fn calls(&self) -> usize {
        self.threads.iter().map(|t| t.calls.len()).sum()
    }

    /// A function's name (its id when the header has none).
    pub fn name(&self, function: u32) -> String {
        self.header
            .functions
            .get(function as usize)
            .cloned()
            .unwrap_or_else(|| format!("function {function}"))
    }
}

/// Whether `bytes` begin like a trace file.
pub fn is_trace(bytes: &[u8]) -> bool {
    bytes.starts_with(&TRACE_MAGIC)
}

/// Reads a trace file (a regular file of at most [`TRACE_LIMIT`] bytes).
pub fn read_trace(path: &Path) -> Result<Trace, ProbeError> {
    let bytes = papirus_substrate::input::read_file_if(path, &TRACE_MAGIC, TRACE_LIMIT)
        .map_err(crate::Error::from)?
        .ok_or_else(|| ProbeError::BadTrace {
            path: path.to_path_buf(),
            reason: "not a papirus trace (bad magic)".into(),
        })?;
    parse_trace(&bytes).map_err(|why| ProbeError::BadTrace { path: path.to_path_buf(), reason: why })
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// Parses a trace file's bytes; `Err` says what is wrong with them.
pub fn parse_trace(b: &[u8]) -> Result<Trace, String> {
    if b.len() < 16 || !is_trace(b) {
        return Err("not a papirus trace (bad magic)".into());
    }
    let version = u32_at(b, 8);
    if version != TRACE_VERSION {
        return Err(format!("trace format {version}; this papirus reads format {TRACE_VERSION}"));
    }
    let mut at = 16;
    let mut header: Option<TraceHeader> = None;
    let mut footer = None;
    let mut threads: Vec<ThreadTrace> = Vec::new();
    let mut index: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    let mut thread = |pid: u32, tid: u32, threads: &mut Vec<ThreadTrace>| -> usize {
        *index.entry((pid, tid)).or_insert_with(|| {
            threads.push(ThreadTrace { pid, tid, ..Default::default() });
            threads.len() - 1
        })
    };
    while at < b.len() {
        if b.len() - at < 8 {
            return Err(format!("a block header is cut short at byte {at}"));
        }
        let (kind, len) = (u32_at(b, at), u32_at(b, at + 4));
        let body = at + 8;
        if len > MAX_BLOCK || b.len() - body < len as usize {
            return Err(format!("block at byte {at} claims {len} bytes; the file has {}", b.len() - body));
        }
        let p = &b[body..body + len as usize];
        at = body + len as usize;
        if header.is_none() && kind != HEADER {
            return Err("the first block is not the header".into());
        }
        let need = |n: usize| {
            if p.len() < n { Err(format!("block at byte {} is too short", body - 8)) } else { Ok(()) }
        };
        match kind {
            HEADER => {
                let h: TraceHeader =
                    serde_json::from_slice(p).map_err(|e| format!("the header does not parse: {e}"))?;
                header = Some(h);
            }
            THREAD => {
                need(16)?;
                let i = thread(u32_at(p, 0), u32_at(p, 4), &mut threads);
                threads[i].started = Some(u64_at(p, 8));
            }
            CALLS => {
                need(16)?;
                let (words, n) = (u32_at(p, 8) as usize, u32_at(p, 12) as usize);
                if !(3..=3 + 2 * papirus_probe_abi::layout::MAX_EVENTS).contains(&words)
                    || p.len() != 16 + n * words * 8
                {
                    return Err(format!("calls block at byte {} has the wrong size", body - 8));
                }
                let i = thread(u32_at(p, 0), u32_at(p, 4), &mut threads);
                let t = &mut threads[i];
                if !t.calls.is_empty() && t.counters_per_call != words - 3 {
                    return Err(format!("calls block at byte {} changes the thread's record size", body - 8));
                }
                t.counters_per_call = words - 3;
                for c in p[16..].chunks_exact(words * 8) {
                    let info = u64_at(c, 16);
                    t.calls.push(Call {
                        function: info as u32,
                        depth: ((info >> 32) & 0xffff) as u32,
                        kind: (info >> 48) & 3,
                        start: u64_at(c, 0),
                        end: u64_at(c, 8),
                    });
                    t.counters.extend((3..words).map(|k| u64_at(c, k * 8)));
                }
            }
            LOST => {
                need(16)?;
                let i = thread(u32_at(p, 0), u32_at(p, 4), &mut threads);
                threads[i].lost = threads[i].lost.saturating_add(u64_at(p, 8));
            }
            FOOTER => {
                footer =
                    Some(serde_json::from_slice(p).map_err(|e| format!("the footer does not parse: {e}"))?);
            }
            other => return Err(format!("unknown block kind {other} at byte {}", body - 8)),
        }
    }
    let header = header.ok_or("no header")?;
    Ok(Trace { header, footer, threads })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TraceHeader {
        TraceHeader {
            format_version: TRACE_VERSION,
            pid: 7,
            probe: "wallclock".into(),
            command: "demo".into(),
            functions: vec!["main".into(), "f".into()],
            traced: 2,
            events: vec![],
            start_tsc: 1000,
            ticks_per_second: 1e9,
            ring: 16,
            record_words: 3,
            min_duration_ns: 0,
            max_depth: None,
        }
    }

    #[test]
    fn writes_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.ptrace");
        let mut w = TraceWriter::create(&path, &header()).unwrap();
        w.thread(7, 8, 1000).unwrap();
        let info = |kind: u64, depth: u64, f: u64| (kind << 48) | (depth << 32) | f;
        w.calls(
            7,
            8,
            3,
            &[1100, 1200, info(record::RETURNED, 1, 1), 1010, 1300, info(record::UNWOUND, 0, 0)],
        )
        .unwrap();
        w.lost(7, 0, 5).unwrap();
        w.finish(TraceFooter { ticks_per_second: 2e9, end_tsc: 2000, ..Default::default() }).unwrap();
        let t = read_trace(&path).unwrap();
        assert_eq!(t.header, header());
        let f = t.footer.as_ref().unwrap();
        assert_eq!((f.calls, f.lost, t.ticks_per_second()), (2, 5, 2e9));
        assert_eq!(t.threads.len(), 2);
        let th = &t.threads[0];
        assert_eq!((th.pid, th.tid, th.started), (7, 8, Some(1000)));
        assert_eq!(
            th.calls[0],
            Call { function: 1, depth: 1, kind: record::RETURNED, start: 1100, end: 1200 }
        );
        assert_eq!(th.calls[1].kind, record::UNWOUND);
        assert_eq!((t.threads[1].tid, t.threads[1].lost), (0, 5));
        assert_eq!(t.ns(1100), 50.0);
        // Cut short anywhere: an error or a trace without its footer, never a panic.
        let bytes = std::fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            if let Ok(t) = parse_trace(&bytes[..cut]) {
                assert!(t.footer.is_none());
            }
        }
        let mut bad = bytes.clone();
        bad[8] = 9;
        assert!(parse_trace(&bad).unwrap_err().contains("format 9"));
    }
}
