//! Sampling events: what a sample carries, how records are laid out, and an
//! opened sampling event with its ring buffer.
//!
//! [`Sampling`] describes the sampling half of a `perf_event_attr` (period or
//! frequency, sample fields, wakeups); [`Sampler`] opens an [`EventAttr`] with
//! it, optionally with counting group members whose values each sample
//! carries ([`SampleType::READ`]); [`Record::parse`] turns ring bytes into
//! typed records without allocating, so it can run in a signal handler.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use perf_event_open_sys::bindings as b;

use crate::attr::EventAttr;
use crate::error::{Error, Op, Result};
use crate::ring::{RingBuffer, RingStats};
use crate::sys::{Ioctl, Sys, kernel, perf_event_attr};

/// A record that does not have the shape its header and layout promise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed perf record: {0}")]
pub struct ParseError(pub &'static str);

macro_rules! flag_set {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $val:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub u64);
        impl $name {
            $($(#[$fm])* pub const $flag: $name = $name($val as u64);)*
            /// Every flag above.
            pub const ALL: $name = $name(0 $(| $val as u64)*);
            /// Whether every bit of `other` is set.
            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }
        }
        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }
        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }
    };
}

flag_set! {
    /// `PERF_SAMPLE_*`: the fields each SAMPLE record carries.
    SampleType {
        /// The interrupted instruction pointer.
        IP = b::PERF_SAMPLE_IP;
        /// Process and thread id.
        TID = b::PERF_SAMPLE_TID;
        /// perf clock timestamp (ns).
        TIME = b::PERF_SAMPLE_TIME;
        /// The data address (breakpoints on data, precise memory events).
        ADDR = b::PERF_SAMPLE_ADDR;
        /// Counter values of the event or its group.
        READ = b::PERF_SAMPLE_READ;
        /// The call chain.
        CALLCHAIN = b::PERF_SAMPLE_CALLCHAIN;
        /// The event id (`PERF_EVENT_IOC_ID`).
        ID = b::PERF_SAMPLE_ID;
        /// The CPU.
        CPU = b::PERF_SAMPLE_CPU;
        /// The period of this sample. Beware: on software events counted
        /// per occurrence (page-faults, context-switches, …) in period mode
        /// the kernel then samples *every* occurrence, with period = its
        /// weight, whatever `sample_period` says.
        PERIOD = b::PERF_SAMPLE_PERIOD;
        /// The id of the event that opened the ring (differs under inherit).
        STREAM_ID = b::PERF_SAMPLE_STREAM_ID;
        /// Raw tracepoint data.
        RAW = b::PERF_SAMPLE_RAW;
        /// The event id, first in the record.
        IDENTIFIER = b::PERF_SAMPLE_IDENTIFIER;
        /// The user-space registers named by [`Sampling::user_regs`], as
        /// they were when the thread last left user space.
        REGS_USER = b::PERF_SAMPLE_REGS_USER;
        /// A copy of the top of the user stack ([`Sampling::user_stack`]
        /// bytes), for unwinding without frame pointers.
        STACK_USER = b::PERF_SAMPLE_STACK_USER;
    }
}

flag_set! {
    /// `PERF_FORMAT_*`: the layout of counter values in `read(2)` and samples.
    ReadFormat {
        /// Time enabled.
        TOTAL_TIME_ENABLED = b::PERF_FORMAT_TOTAL_TIME_ENABLED;
        /// Time running.
        TOTAL_TIME_RUNNING = b::PERF_FORMAT_TOTAL_TIME_RUNNING;
        /// Event ids.
        ID = b::PERF_FORMAT_ID;
        /// All values of the group.
        GROUP = b::PERF_FORMAT_GROUP;
        /// Samples lost by the kernel (Linux 6.0).
        LOST = b::PERF_FORMAT_LOST;
    }
}

/// Everything needed to parse records of one ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleLayout {
    /// The `sample_type` the event was opened with.
    pub sample_type: SampleType,
    /// The `read_format` the event was opened with.
    pub read_format: ReadFormat,
    /// The `sample_regs_user` mask: which registers [`SampleType::REGS_USER`] carries.
    pub regs_user: u64,
}

/// Values a sample read from the event or its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadValues<'a> {
    format: ReadFormat,
    /// Time enabled, if asked for.
    pub time_enabled: Option<u64>,
    /// Time running, if asked for.
    pub time_running: Option<u64>,
    entries: &'a [u8],
    nr: usize,
    single: Option<ReadValue>,
}

/// One counter in [`ReadValues`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadValue {
    /// The count.
    pub value: u64,
    /// The event id, with [`ReadFormat::ID`].
    pub id: Option<u64>,
    /// Lost samples, with [`ReadFormat::LOST`].
    pub lost: Option<u64>,
}

impl ReadValues<'_> {
    /// Number of counters (1 without [`ReadFormat::GROUP`]).
    pub fn len(&self) -> usize {
        self.nr
    }
    /// Whether there are none (a group read of an empty group).
    pub fn is_empty(&self) -> bool {
        self.nr == 0
    }
    /// The `i`th counter, leader first.
    pub fn get(&self, i: usize) -> Option<ReadValue> {
        if i >= self.nr {
            return None;
        }
        if let Some(v) = self.single {
            return Some(v);
        }
        let mut c = Cursor(self.entries.get(i * stride(self.format)..)?);
        let value = c.u64().ok()?;
        let id = if self.format.contains(ReadFormat::ID) { Some(c.u64().ok()?) } else { None };
        let lost = if self.format.contains(ReadFormat::LOST) { Some(c.u64().ok()?) } else { None };
        Some(ReadValue { value, id, lost })
    }
    /// The counters, leader first.
    pub fn iter(&self) -> impl Iterator<Item = ReadValue> + '_ {
        (0..self.nr).filter_map(|i| self.get(i))
    }
}

/// A call chain: instruction pointers, innermost first, with the kernel's
/// `PERF_CONTEXT_*` markers left in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Callchain<'a>(&'a [u8]);

impl Callchain<'_> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }
    /// Whether the chain is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
    }
}

/// A SAMPLE record; each field is present when its [`SampleType`] bit was set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample<'a> {
    /// The header's misc field (`PERF_RECORD_MISC_*`: cpu mode, exact IP).
    pub misc: u16,
    /// [`SampleType::IDENTIFIER`].
    pub identifier: Option<u64>,
    /// [`SampleType::IP`].
    pub ip: Option<u64>,
    /// [`SampleType::TID`]: (pid, tid).
    pub pid_tid: Option<(u32, u32)>,
    /// [`SampleType::TIME`].
    pub time: Option<u64>,
    /// [`SampleType::ADDR`].
    pub addr: Option<u64>,
    /// [`SampleType::ID`].
    pub id: Option<u64>,
    /// [`SampleType::STREAM_ID`].
    pub stream_id: Option<u64>,
    /// [`SampleType::CPU`].
    pub cpu: Option<u32>,
    /// [`SampleType::PERIOD`].
    pub period: Option<u64>,
    /// [`SampleType::READ`].
    pub read: Option<ReadValues<'a>>,
    /// [`SampleType::CALLCHAIN`].
    pub callchain: Option<Callchain<'a>>,
    /// [`SampleType::RAW`].
    pub raw: Option<&'a [u8]>,
    /// [`SampleType::REGS_USER`]; `None` also when the thread had no user
    /// state to report (a kernel thread).
    pub regs_user: Option<UserRegs<'a>>,
    /// [`SampleType::STACK_USER`]: the bytes copied from the user stack
    /// pointer upward (the kernel's `dyn_size`; empty when none could be).
    pub stack_user: Option<&'a [u8]>,
}

/// User registers of a sample, in `sample_regs_user` bit order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs<'a> {
    mask: u64,
    values: &'a [u8],
}

/// Register numbers of `sample_regs_user` on x86-64 (`enum perf_event_x86_regs`).
pub mod x86_regs {
    /// `rbp`
    pub const BP: u32 = 6;
    /// `rsp`
    pub const SP: u32 = 7;
    /// `rip`
    pub const IP: u32 = 8;
}

impl UserRegs<'_> {
    /// The value of register `reg` (a bit number of the mask), if sampled.
    pub fn get(&self, reg: u32) -> Option<u64> {
        if reg >= 64 || self.mask & (1 << reg) == 0 {
            return None;
        }
        let i = (self.mask & ((1u64 << reg) - 1)).count_ones() as usize;
        let b = self.values.get(i * 8..i * 8 + 8)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }
}

/// THROTTLE and UNTHROTTLE bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// perf clock time.
    pub time: u64,
    /// Event id.
    pub id: u64,
    /// Stream id.
    pub stream_id: u64,
}

/// An MMAP2 record: a new executable (or data) mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mmap2<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// File offset.
    pub pgoff: u64,
    /// The file: its device and inode, or the build id the kernel read
    /// from it (`PERF_RECORD_MISC_MMAP_BUILD_ID`).
    pub file: MmapFile<'a>,
    /// Protection bits.
    pub prot: u32,
    /// Mapping flags.
    pub flags: u32,
    /// The file name (NUL padding stripped).
    pub filename: &'a [u8],
}

/// How an [`Mmap2`] record identifies the mapped file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmapFile<'a> {
    /// Device (major, minor), inode and inode generation; all 0 for anonymous memory.
    Inode {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
        /// Inode number.
        ino: u64,
        /// Inode generation.
        generation: u64,
    },
    /// The file's GNU build id.
    BuildId(&'a [u8]),
}

/// A FORK or EXIT record: a thread or process was created or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Process id.
    pub pid: u32,
    /// Parent's process id.
    pub ppid: u32,
    /// Thread id.
    pub tid: u32,
    /// Parent's thread id.
    pub ptid: u32,
    /// perf clock time.
    pub time: u64,
}

/// A COMM record: a thread was renamed or exec'd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The new name (NUL padding stripped).
    pub comm: &'a [u8],
    /// Set when the rename comes from exec.
    pub exec: bool,
}

/// A parsed ring record.
// Records are parsed inside signal handlers, where boxing (allocating) is not allowed.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A sample.
    Sample(Sample<'a>),
    /// The kernel dropped `lost` records because the ring was full.
    Lost {
        /// Event id.
        id: u64,
        /// Number of records lost.
        lost: u64,
    },
    /// Sampling stopped: the event exceeded the maximum sample rate.
    Throttle(Throttle),
    /// Sampling resumed.
    Unthrottle(Throttle),
    /// A new mapping.
    Mmap2(Mmap2<'a>),
    /// A thread name change.
    Comm(Comm<'a>),
    /// A new thread or process (`clone`, `fork`).
    Fork(Task),
    /// A thread or process ended.
    Exit(Task),
    /// Samples lost before they reached the ring (`PERF_RECORD_LOST_SAMPLES`).
    LostSamples {
        /// Number lost.
        lost: u64,
    },
    /// Any other record type, unparsed.
    Other {
        /// `PERF_RECORD_*`.
        kind: u32,
        /// The header's misc field.
        misc: u16,
        /// The body after the header.
        body: &'a [u8],
    },
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if self.0.len() < n {
            return Err(ParseError("record shorter than its fields"));
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    fn u64(&mut self) -> Result<u64, ParseError> {
        let s = self.take(8)?;
        Ok(u64::from_ne_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
    }
    fn u32(&mut self) -> Result<u32, ParseError> {
        let s = self.take(4)?;
        Ok(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn count(&mut self, what_size: usize) -> Result<usize, ParseError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| ParseError("count does not fit"))?;
        if n.checked_mul(what_size).is_none_or(|bytes| bytes > self.0.len()) {
            return Err(ParseError("count larger than the record"));
        }
        Ok(n)
    }
}

fn cstr(bytes: &[u8]) -> &[u8] {
    bytes.split(|&c| c == 0).next().unwrap_or(&[])
}

impl<'a> Record<'a> {
    /// Parses one record (header included) laid out as `layout` says.
    pub fn parse(bytes: &'a [u8], layout: &SampleLayout) -> Result<Record<'a>, ParseError> {
        let mut c = Cursor(bytes);
        let kind = c.u32()?;
        let head = c.take(4)?;
        let misc = u16::from_ne_bytes([head[0], head[1]]);
        let size = u16::from_ne_bytes([head[2], head[3]]) as usize;
        if size > bytes.len() || size < 8 {
            return Err(ParseError("header size disagrees with the record length"));
        }
        let mut c = Cursor(&bytes[8..size]);
        Ok(match kind {
            b::PERF_RECORD_SAMPLE => Record::Sample(parse_sample(&mut c, misc, layout)?),
            b::PERF_RECORD_LOST => Record::Lost { id: c.u64()?, lost: c.u64()? },
            b::PERF_RECORD_LOST_SAMPLES => Record::LostSamples { lost: c.u64()? },
            b::PERF_RECORD_THROTTLE | b::PERF_RECORD_UNTHROTTLE => {
                let t = Throttle { time: c.u64()?, id: c.u64()?, stream_id: c.u64()? };
                if kind == b::PERF_RECORD_THROTTLE { Record::Throttle(t) } else { Record::Unthrottle(t) }
            }
            b::PERF_RECORD_MMAP2 => {
                let pid = c.u32()?;
                let tid = c.u32()?;
                let addr = c.u64()?;
                let len = c.u64()?;
                let pgoff = c.u64()?;
                let file = if u32::from(misc) & b::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    let id = c.take(24)?;
                    let n = usize::from(id[0]).min(20);
                    MmapFile::BuildId(&id[4..4 + n])
                } else {
                    let (major, minor) = (c.u32()?, c.u32()?);
                    MmapFile::Inode { major, minor, ino: c.u64()?, generation: c.u64()? }
                };
                let prot = c.u32()?;
                let flags = c.u32()?;
                Record::Mmap2(Mmap2 { pid, tid, addr, len, pgoff, file, prot, flags, filename: cstr(c.0) })
            }
            b::PERF_RECORD_COMM => {
                let pid = c.u32()?;
                let tid = c.u32()?;
                let exec = u32::from(misc) & b::PERF_RECORD_MISC_COMM_EXEC != 0;
                Record::Comm(Comm { pid, tid, comm: cstr(c.0), exec })
            }
            b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
                let t = Task { pid: c.u32()?, ppid: c.u32()?, tid: c.u32()?, ptid: c.u32()?, time: c.u64()? };
                if kind == b::PERF_RECORD_FORK { Record::Fork(t) } else { Record::Exit(t) }
            }
            _ => Record::Other { kind, misc, body: c.0 },
        })
    }
}

fn parse_sample<'a>(c: &mut Cursor<'a>, misc: u16, layout: &SampleLayout) -> Result<Sample<'a>, ParseError> {
    let t = layout.sample_type;
    let has = |f: SampleType| t.contains(f);
    let mut s = Sample { misc, ..Sample::default() };
    if has(SampleType::IDENTIFIER) {
        s.identifier = Some(c.u64()?);
    }
    if has(SampleType::IP) {
        s.ip = Some(c.u64()?);
    }
    if has(SampleType::TID) {
        s.pid_tid = Some((c.u32()?, c.u32()?));
    }
    if has(SampleType::TIME) {
        s.time = Some(c.u64()?);
    }
    if has(SampleType::ADDR) {
        s.addr = Some(c.u64()?);
    }
    if has(SampleType::ID) {
        s.id = Some(c.u64()?);
    }
    if has(SampleType::STREAM_ID) {
        s.stream_id = Some(c.u64()?);
    }
    if has(SampleType::CPU) {
        let cpu = c.u32()?;
        c.u32()?;
        s.cpu = Some(cpu);
    }
    if has(SampleType::PERIOD) {
        s.period = Some(c.u64()?);
    }
    if has(SampleType::READ) {
        s.read = Some(parse_read(c, layout.read_format)?);
    }
    if has(SampleType::CALLCHAIN) {
        let n = c.count(8)?;
        s.callchain = Some(Callchain(c.take(n * 8)?));
    }
    if has(SampleType::RAW) {
        let n = c.u32()? as usize;
        s.raw = Some(c.take(n)?);
    }
    if has(SampleType::REGS_USER) {
        // abi 0 (PERF_SAMPLE_REGS_ABI_NONE): no registers follow.
        if c.u64()? != 0 {
            let n = layout.regs_user.count_ones() as usize;
            s.regs_user = Some(UserRegs { mask: layout.regs_user, values: c.take(n * 8)? });
        }
    }
    if has(SampleType::STACK_USER) {
        let size = c.count(1)?;
        let data = c.take(size)?;
        // dyn_size follows only a non-empty copy: how much of it is valid.
        let valid = if size == 0 { 0 } else { usize::try_from(c.u64()?).unwrap_or(usize::MAX).min(size) };
        s.stack_user = Some(&data[..valid]);
    }
    Ok(s)
}

fn parse_read<'a>(c: &mut Cursor<'a>, f: ReadFormat) -> Result<ReadValues<'a>, ParseError> {
    let stride = stride(f);
    let times = |c: &mut Cursor<'a>| -> Result<(Option<u64>, Option<u64>), ParseError> {
        let e = if f.contains(ReadFormat::TOTAL_TIME_ENABLED) { Some(c.u64()?) } else { None };
        let r = if f.contains(ReadFormat::TOTAL_TIME_RUNNING) { Some(c.u64()?) } else { None };
        Ok((e, r))
    };
    if f.contains(ReadFormat::GROUP) {
        let nr = c.count(stride)?;
        let (time_enabled, time_running) = times(c)?;
        let entries = c.take(nr * stride)?;
        Ok(ReadValues { format: f, time_enabled, time_running, entries, nr, single: None })
    } else {
        // A single read puts the times between the value and id/lost.
        let value = c.u64()?;
        let (time_enabled, time_running) = times(c)?;
        let id = if f.contains(ReadFormat::ID) { Some(c.u64()?) } else { None };
        let lost = if f.contains(ReadFormat::LOST) { Some(c.u64()?) } else { None };
        let single = Some(ReadValue { value, id, lost });
        Ok(ReadValues { format: f, time_enabled, time_running, entries: &[], nr: 1, single })
    }
}

fn stride(f: ReadFormat) -> usize {
    8 * (1 + usize::from(f.contains(ReadFormat::ID)) + usize::from(f.contains(ReadFormat::LOST)))
}

/// When an event samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Every `n` events (the PAPI overflow threshold).
    Period(u64),
    /// About `hz` times a second; the kernel adapts the period. At most
    /// `/proc/sys/kernel/perf_event_max_sample_rate`.
    Frequency(u64),
}

/// The sampling half of a `perf_event_attr`.
///
/// Defaults: `sample_type` IP|TID, no read values, a wakeup (and so a
/// signal, when one is routed) on every sample, `precise_ip` 0, no MMAP2 or
/// COMM records, no FORK or EXIT records, 8 data pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampling {
    trigger: Trigger,
    sample_type: SampleType,
    read_format: ReadFormat,
    wakeup_events: u32,
    precise_ip: u8,
    regs_user: u64,
    stack_user: u32,
    exclude_callchain_user: bool,
    mmap_records: bool,
    task_records: bool,
    data_pages: usize,
}

impl Sampling {
    /// Samples every `period` events.
    pub fn period(period: u64) -> Self {
        Self::with(Trigger::Period(period))
    }
    /// Samples about `hz` times a second.
    pub fn frequency(hz: u64) -> Self {
        Self::with(Trigger::Frequency(hz))
    }
    fn with(trigger: Trigger) -> Self {
        Sampling {
            trigger,
            sample_type: SampleType::IP | SampleType::TID,
            read_format: ReadFormat::default(),
            wakeup_events: 1,
            precise_ip: 0,
            regs_user: 0,
            stack_user: 0,
            exclude_callchain_user: false,
            mmap_records: false,
            task_records: false,
            data_pages: 8,
        }
    }
    /// Replaces the sample fields. RAW needs a tracepoint; IDENTIFIER, ID and
    /// STREAM_ID are always accepted; other `PERF_SAMPLE_*` bits are refused
    /// at open because papirus cannot parse them.
    pub fn sample_type(&mut self, t: SampleType) -> &mut Self {
        self.sample_type = t;
        self
    }
    /// Sets the `read_format` used for [`SampleType::READ`] and `read(2)`.
    pub fn read_format(&mut self, f: ReadFormat) -> &mut Self {
        self.read_format = f;
        self
    }
    /// Wakes the reader (and raises the routed signal) every `n` samples; 0
    /// leaves the kernel's default (a wakeup when the ring is half full).
    pub fn wakeup_events(&mut self, n: u32) -> &mut Self {
        self.wakeup_events = n;
        self
    }
    /// The user registers (`1 << x86_regs::IP | …`) each sample carries
    /// with [`SampleType::REGS_USER`].
    pub fn user_regs(&mut self, mask: u64) -> &mut Self {
        self.regs_user = mask;
        self
    }
    /// Bytes of user stack each sample copies with [`SampleType::STACK_USER`]
    /// (a multiple of 8; a record must stay under 64 KiB).
    pub fn user_stack(&mut self, bytes: u32) -> &mut Self {
        self.stack_user = bytes;
        self
    }
    /// Leaves the user part out of [`SampleType::CALLCHAIN`] (when user
    /// frames come from [`SampleType::STACK_USER`] instead).
    pub fn exclude_callchain_user(&mut self, on: bool) -> &mut Self {
        self.exclude_callchain_user = on;
        self
    }
    /// Skid constraint, 0 (arbitrary skid) to 3 (zero skid); PMU dependent.
    pub fn precise_ip(&mut self, level: u8) -> &mut Self {
        self.precise_ip = level.min(3);
        self
    }
    /// Also records MMAP2 and COMM records (new mappings, thread names).
    pub fn mmap_records(&mut self, on: bool) -> &mut Self {
        self.mmap_records = on;
        self
    }
    /// Also records FORK and EXIT records (new and ended threads and processes).
    pub fn task_records(&mut self, on: bool) -> &mut Self {
        self.task_records = on;
        self
    }
    /// Data pages of the ring buffer: a power of two.
    pub fn data_pages(&mut self, n: usize) -> &mut Self {
        self.data_pages = n;
        self
    }
    /// The trigger.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }
    /// The data pages asked for.
    pub fn data_pages_value(&self) -> usize {
        self.data_pages
    }
    /// The record layout this configuration produces.
    pub fn layout(&self) -> SampleLayout {
        SampleLayout {
            sample_type: self.sample_type,
            read_format: self.read_format,
            regs_user: self.regs_user,
        }
    }

    /// Checks what the kernel would refuse with a bare EINVAL, or what
    /// papirus could not parse.
    pub fn validate(&self, event: &str) -> Result<()> {
        let bad = |reason: String| Err(Error::Malformed { event: event.to_string(), reason });
        match self.trigger {
            Trigger::Period(0) => {
                return bad("a sample period of 0 never samples; use a threshold ≥ 1".into());
            }
            Trigger::Frequency(0) => return bad("a sample frequency of 0 never samples".into()),
            _ => {}
        }
        // Every bit SampleType names is parsed.
        let unknown = self.sample_type.0 & !SampleType::ALL.0;
        if unknown != 0 {
            return bad(format!("sample_type bits {unknown:#x} are not parsed by papirus"));
        }
        if self.sample_type.contains(SampleType::REGS_USER) && self.regs_user == 0 {
            return bad("REGS_USER needs a register mask (Sampling::user_regs)".into());
        }
        if self.sample_type.contains(SampleType::STACK_USER)
            && (self.stack_user == 0
                || !self.stack_user.is_multiple_of(8)
                || self.stack_user >= u32::from(u16::MAX))
        {
            return bad(format!(
                "a user stack copy of {} bytes: give a multiple of 8 between 8 and 65528",
                self.stack_user
            ));
        }
        if self.data_pages == 0 || !self.data_pages.is_power_of_two() {
            return bad(format!("{} data pages: the ring needs a power of two ≥ 1", self.data_pages));
        }
        Ok(())
    }

    /// Writes the sampling fields into a raw attr.
    pub fn apply(&self, a: &mut perf_event_attr) {
        match self.trigger {
            Trigger::Period(p) => {
                a.__bindgen_anon_1.sample_period = p;
                a.set_freq(0);
            }
            Trigger::Frequency(hz) => {
                a.__bindgen_anon_1.sample_freq = hz;
                a.set_freq(1);
            }
        }
        a.sample_type = self.sample_type.0;
        a.read_format = self.read_format.0;
        if self.wakeup_events > 0 {
            a.__bindgen_anon_2.wakeup_events = self.wakeup_events;
            a.set_watermark(0);
        }
        a.set_precise_ip(u64::from(self.precise_ip));
        a.sample_regs_user = self.regs_user;
        a.sample_stack_user = self.stack_user;
        a.set_exclude_callchain_user(u64::from(self.exclude_callchain_user));
        a.set_mmap2(u64::from(self.mmap_records));
        a.set_mmap(u64::from(self.mmap_records));
        a.set_comm(u64::from(self.mmap_records));
        a.set_comm_exec(u64::from(self.mmap_records));
        a.set_task(u64::from(self.task_records));
    }
}

/// The descriptors of a sampling event and its counting group members.
#[derive(Debug)]
pub struct SamplingEvents {
    sys: Arc<dyn Sys>,
    name: String,
    leader: OwnedFd,
    id: u64,
    members: Vec<(String, OwnedFd, u64)>,
    read_format: ReadFormat,
}

/// A sampling event with its ring buffer.
#[derive(Debug)]
pub struct Sampler {
    events: SamplingEvents,
    ring: RingBuffer,
}

/// A `read(2)` of the sampling event alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampledCount {
    /// The count.
    pub value: u64,
    /// Samples the kernel could not write to the ring, with [`ReadFormat::LOST`].
    pub lost: Option<u64>,
}

impl Sampler {
    /// Opens `attr` sampling per `sampling` on thread `pid` (0: the caller)
    /// and `cpu` (-1: any), disabled, and maps its ring.
    pub fn open(attr: &EventAttr, sampling: &Sampling, pid: i32, cpu: i32) -> Result<Self> {
        Self::map(SamplingEvents::open(kernel(), attr, sampling, &[], pid, cpu)?, sampling)
    }

    /// Maps the ring of `events`, opened with `sampling` (its data pages
    /// and layout); with counting members, [`SampleType::READ`] and
    /// [`ReadFormat::GROUP`] put their values in each sample.
    pub fn map(events: SamplingEvents, sampling: &Sampling) -> Result<Self> {
        let ring = RingBuffer::map(
            events.sys.clone(),
            events.leader.as_fd(),
            sampling.data_pages,
            sampling.layout(),
            &events.name,
        )?;
        Ok(Sampler { events, ring })
    }

    /// The ring.
    pub fn ring(&mut self) -> &mut RingBuffer {
        &mut self.ring
    }
    /// What the ring reader has seen.
    pub fn stats(&self) -> RingStats {
        self.ring.stats()
    }
    /// The descriptors.
    pub fn events(&self) -> &SamplingEvents {
        &self.events
    }
    /// Splits into descriptors and ring, for readers on other threads or in signal handlers.
    pub fn into_parts(self) -> (SamplingEvents, RingBuffer) {
        (self.events, self.ring)
    }
}

fn open_one(
    sys: &dyn Sys,
    raw: &mut perf_event_attr,
    attr: &EventAttr,
    pid: i32,
    cpu: i32,
    group: Option<BorrowedFd<'_>>,
) -> Result<OwnedFd> {
    let flags = u64::from(b::PERF_FLAG_FD_CLOEXEC);
    sys.perf_event_open(raw, pid, cpu, group, flags).map_err(|errno| {
        let hw = attr.kind() == crate::attr::Kind::Hardware;
        match errno.0 {
            libc::EINVAL if raw.freq() == 1 => Error::Kernel {
                op: Op::Open,
                event: attr.name().to_string(),
                errno,
                hint: "the sample frequency may exceed /proc/sys/kernel/perf_event_max_sample_rate".into(),
            },
            libc::E2BIG => {
                Error::AttrSize { op: Op::Open, event: attr.name().to_string(), errno, expected: raw.size }
            }
            _ => Error::from_errno(Op::Open, attr.name(), errno, hw, pid),
        }
    })
}

impl SamplingEvents {
    /// Opens `attr` sampling per `sampling` on thread `pid` and `cpu`,
    /// disabled, with counting `members` in its group, and no ring: map one
    /// ([`Sampler::map`]) or send its records to another event's
    /// ([`SamplingEvents::output_to`]).
    pub fn open(
        sys: Arc<dyn Sys>,
        attr: &EventAttr,
        sampling: &Sampling,
        members: &[EventAttr],
        pid: i32,
        cpu: i32,
    ) -> Result<Self> {
        let name = attr.name().to_string();
        sampling.validate(&name)?;
        let mut raw = attr.to_raw();
        sampling.apply(&mut raw);
        let leader = open_one(&*sys, &mut raw, attr, pid, cpu, None)?;
        let id =
            sys.event_id(leader.as_fd()).map_err(|e| Error::from_errno(Op::Ioctl, &name, e, false, pid))?;
        let mut opened = Vec::with_capacity(members.len());
        for m in members {
            let mut mraw = m.to_raw();
            mraw.read_format = sampling.read_format.0;
            // Members count inside the leader's group; the leader enables them.
            mraw.set_disabled(0);
            let fd = open_one(&*sys, &mut mraw, m, pid, cpu, Some(leader.as_fd()))?;
            let mid = sys
                .event_id(fd.as_fd())
                .map_err(|e| Error::from_errno(Op::Ioctl, m.name(), e, false, pid))?;
            opened.push((m.name().to_string(), fd, mid));
        }
        Ok(SamplingEvents { sys, name, leader, id, members: opened, read_format: sampling.read_format })
    }

    /// Sends this event's records to the ring of `other` (an event on the
    /// same CPU, or of the same thread when both are on any CPU), as perf
    /// record does to keep one ring per CPU (`PERF_EVENT_IOC_SET_OUTPUT`).
    pub fn output_to(&self, other: &SamplingEvents) -> Result<()> {
        self.ioctl(Ioctl::SetOutput(other.leader.as_raw_fd()), Op::Ioctl)
    }

    fn ioctl(&self, op: Ioctl, what: Op) -> Result<()> {
        self.sys.ioctl(self.leader.as_fd(), op).map_err(|e| Error::from_errno(what, &self.name, e, false, 0))
    }
    /// Starts the group counting and sampling.
    pub fn enable(&self) -> Result<()> {
        self.ioctl(Ioctl::Enable { group: false }, Op::Enable)
    }
    /// Stops it.
    pub fn disable(&self) -> Result<()> {
        self.ioctl(Ioctl::Disable { group: false }, Op::Disable)
    }
    /// Zeroes the counts.
    pub fn reset(&self) -> Result<()> {
        self.ioctl(Ioctl::Reset { group: true }, Op::Reset)
    }
    /// The event's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The leader's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.leader.as_fd()
    }
    /// The kernel id of the sampling event.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Names and kernel ids of the counting members, in order.
    pub fn members(&self) -> impl Iterator<Item = (&str, u64)> {
        self.members.iter().map(|(n, _, id)| (n.as_str(), *id))
    }
    /// The handle to the kernel.
    pub fn sys(&self) -> &Arc<dyn Sys> {
        &self.sys
    }

    /// Reads the sampling event's own count (and lost samples when the
    /// read format has [`ReadFormat::LOST`]).
    pub fn read_count(&self) -> Result<SampledCount> {
        let mut buf = [0u8; 8 * 64];
        let n = self
            .sys
            .read(self.leader.as_fd(), &mut buf)
            .map_err(|e| Error::from_errno(Op::Read, &self.name, e, false, 0))?;
        let short = |expected| Error::ShortRead { op: Op::Read, event: self.name.clone(), got: n, expected };
        let mut c = Cursor(&buf[..n]);
        let vals = parse_read(&mut c, self.read_format).map_err(|_| short(8))?;
        let v = vals.get(0).ok_or_else(|| short(8))?;
        Ok(SampledCount { value: v.value, lost: v.lost })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&misc.to_ne_bytes());
        v.extend_from_slice(&((8 + body.len()) as u16).to_ne_bytes());
        v.extend_from_slice(body);
        v
    }

    fn words(ws: &[u64]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn mmap2_record() {
        let mut body = Vec::new();
        body.extend_from_slice(&7u32.to_ne_bytes());
        body.extend_from_slice(&8u32.to_ne_bytes());
        body.extend(words(&[0x7f00_0000_0000, 0x2000, 0x1000]));
        body.extend_from_slice(&0xfeu32.to_ne_bytes());
        body.extend_from_slice(&1u32.to_ne_bytes());
        body.extend(words(&[4242, 3]));
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&2u32.to_ne_bytes());
        body.extend_from_slice(b"/usr/lib/libm.so.6\0\0\0\0\0\0");
        let r = record(b::PERF_RECORD_MMAP2, 0, &body);
        match Record::parse(&r, &SampleLayout::default()).unwrap() {
            Record::Mmap2(m) => {
                assert_eq!(
                    (m.pid, m.tid, m.addr, m.len, m.pgoff, m.prot, m.flags),
                    (7, 8, 0x7f00_0000_0000, 0x2000, 0x1000, 5, 2)
                );
                assert_eq!(m.filename, b"/usr/lib/libm.so.6");
                assert_eq!(m.file, MmapFile::Inode { major: 0xfe, minor: 1, ino: 4242, generation: 3 });
            }
            other => panic!("{other:?}"),
        }
        // The same record as the kernel writes it with attr.build_id: a
        // length byte, padding and 20 id bytes in place of the inode.
        let mut with_id = body.clone();
        with_id[32..56].copy_from_slice(&[[3u8, 0, 0, 0].as_slice(), &[0xab; 20]].concat());
        let r = record(b::PERF_RECORD_MMAP2, b::PERF_RECORD_MISC_MMAP_BUILD_ID as u16, &with_id);
        let Record::Mmap2(m) = Record::parse(&r, &SampleLayout::default()).unwrap() else { panic!() };
        assert_eq!(m.file, MmapFile::BuildId(&[0xab; 3]));
    }

    #[test]
    fn user_registers_and_stack() {
        use x86_regs::{BP, IP, SP};
        let mask = 1 << BP | 1 << SP | 1 << IP;
        let layout = SampleLayout {
            sample_type: SampleType::IP | SampleType::REGS_USER | SampleType::STACK_USER,
            regs_user: mask,
            ..SampleLayout::default()
        };
        // ip; abi 2 (64-bit), bp, sp, ip; 16 bytes of stack of which 8 valid.
        let body = words(&[0x401000, 2, 0x7ff0, 0x7fe0, 0x401000, 16, 0xaa, 0xbb, 8]);
        let r = record(b::PERF_RECORD_SAMPLE, 2, &body);
        let Record::Sample(s) = Record::parse(&r, &layout).unwrap() else { panic!() };
        let regs = s.regs_user.unwrap();
        assert_eq!(
            (regs.get(BP), regs.get(SP), regs.get(IP), regs.get(0)),
            (Some(0x7ff0), Some(0x7fe0), Some(0x401000), None)
        );
        assert_eq!(s.stack_user, Some(&0xaau64.to_ne_bytes()[..]));
        // A kernel thread: abi 0 and no registers; an empty copy has no dyn_size.
        let r = record(b::PERF_RECORD_SAMPLE, 1, &words(&[0xffff_ffff_8100_0000, 0, 0]));
        let Record::Sample(s) = Record::parse(&r, &layout).unwrap() else { panic!() };
        assert_eq!((s.regs_user, s.stack_user), (None, Some(&[][..])));
        // A stack size beyond the record is an error, not a panic.
        let r = record(b::PERF_RECORD_SAMPLE, 2, &words(&[1, 0, 4096, 1]));
        assert!(Record::parse(&r, &layout).is_err());
        let mut bad = Sampling::period(1);
        bad.sample_type(SampleType::STACK_USER).user_stack(12);
        assert!(bad.validate("x").is_err());
        bad.sample_type(SampleType::REGS_USER);
        assert!(bad.validate("x").is_err(), "no register mask");
    }

    #[test]
    fn fork_and_exit_records() {
        let mut body = Vec::new();
        for v in [10u32, 1, 11, 10] {
            body.extend_from_slice(&v.to_ne_bytes());
        }
        body.extend(words(&[99]));
        let t = Task { pid: 10, ppid: 1, tid: 11, ptid: 10, time: 99 };
        let l = SampleLayout::default();
        assert_eq!(Record::parse(&record(b::PERF_RECORD_FORK, 0, &body), &l).unwrap(), Record::Fork(t));
        assert_eq!(Record::parse(&record(b::PERF_RECORD_EXIT, 0, &body), &l).unwrap(), Record::Exit(t));
        assert!(Record::parse(&record(b::PERF_RECORD_FORK, 0, &body[..20]), &l).is_err());
    }

    #[test]
    fn single_read_with_times_id_and_lost() {
        let layout = SampleLayout {
            sample_type: SampleType::IP | SampleType::READ,
            read_format: ReadFormat::TOTAL_TIME_ENABLED
                | ReadFormat::TOTAL_TIME_RUNNING
                | ReadFormat::ID
                | ReadFormat::LOST,
            regs_user: 0,
        };
        let r = record(b::PERF_RECORD_SAMPLE, 2, &words(&[0x401000, 42, 100, 90, 9, 3]));
        let Record::Sample(s) = Record::parse(&r, &layout).unwrap() else { panic!() };
        let rv = s.read.unwrap();
        assert_eq!((rv.time_enabled, rv.time_running, rv.len()), (Some(100), Some(90), 1));
        assert_eq!(rv.get(0), Some(ReadValue { value: 42, id: Some(9), lost: Some(3) }));
        assert_eq!(rv.get(1), None);
        assert_eq!(s.ip, Some(0x401000));
        assert_eq!(s.misc, 2);
    }

    #[test]
    fn throttle_lost_and_unknown_records() {
        let l = SampleLayout::default();
        let t = record(b::PERF_RECORD_THROTTLE, 0, &words(&[5, 6, 7]));
        assert_eq!(
            Record::parse(&t, &l).unwrap(),
            Record::Throttle(Throttle { time: 5, id: 6, stream_id: 7 })
        );
        let u = record(b::PERF_RECORD_UNTHROTTLE, 0, &words(&[5, 6, 7]));
        assert!(matches!(Record::parse(&u, &l).unwrap(), Record::Unthrottle(_)));
        let lost = record(b::PERF_RECORD_LOST, 0, &words(&[1, 99]));
        assert_eq!(Record::parse(&lost, &l).unwrap(), Record::Lost { id: 1, lost: 99 });
        let odd = record(77, 3, &words(&[1]));
        assert!(matches!(Record::parse(&odd, &l).unwrap(), Record::Other { kind: 77, misc: 3, .. }));
        // A callchain whose count exceeds the record.
        let cl = SampleLayout { sample_type: SampleType::CALLCHAIN, ..SampleLayout::default() };
        let bad = record(b::PERF_RECORD_SAMPLE, 0, &words(&[1000, 1]));
        assert!(Record::parse(&bad, &cl).is_err());
    }

    #[test]
    fn sampling_validates_and_applies() {
        assert!(Sampling::period(0).validate("x").is_err());
        assert!(Sampling::frequency(0).validate("x").is_err());
        assert!(
            Sampling::period(1)
                .sample_type(SampleType(b::PERF_SAMPLE_BRANCH_STACK as u64))
                .validate("x")
                .is_err()
        );
        assert!(Sampling::period(1).data_pages(3).validate("x").is_err());
        let mut a = perf_event_attr::default();
        let mut s = Sampling::frequency(4000);
        s.sample_type(SampleType::IP | SampleType::CALLCHAIN)
            .precise_ip(9)
            .mmap_records(true)
            .task_records(true);
        s.apply(&mut a);
        assert_eq!((a.freq(), a.precise_ip(), a.mmap2(), a.comm(), a.task()), (1, 3, 1, 1, 1));
        assert_eq!(a.sample_type, (SampleType::IP | SampleType::CALLCHAIN).0);
        let mut p = perf_event_attr::default();
        Sampling::period(100).apply(&mut p);
        assert_eq!(p.freq(), 0);
    }
}
