//! The perf sample ring buffer: one control page followed by 2^n data
//! pages, shared with the kernel.
//!
//! The kernel writes records at `data_head` and never past `data_tail`;
//! papirus reads records between the two and moves `data_tail` forward when a
//! [`RecordGuard`] is dropped. Records that straddle the end of the data area
//! are copied into a scratch buffer allocated once with the ring, so reading
//! never allocates (the overflow signal handler drains rings).
//!
//! LOST, THROTTLE and UNTHROTTLE records are counted in [`RingStats`] as soon
//! as the reader reaches them, whether or not the caller looks at the record,
//! so losses are never silently dropped.
//!
//! # Safety
//!
//! This module reads kernel-shared memory through raw pointers. The
//! invariants: the mapping stays alive as long as the [`RingBuffer`] (it owns
//! it and unmaps on drop); bytes between our tail and the `data_head` we
//! loaded with Acquire are complete and the kernel will not touch them until
//! we store a later `data_tail`; `data_head`/`data_tail` are 8-byte aligned
//! u64 fields of the control page, accessed only atomically.
#![allow(unsafe_code)]

use std::mem::offset_of;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys::bindings::{self as b, perf_event_mmap_page};

use crate::error::{Error, Op, Result};
use crate::mmap::page_size;
use crate::sample::{ParseError, Record, SampleLayout};
use crate::sys::Sys;

const HEAD: usize = offset_of!(perf_event_mmap_page, data_head);
const TAIL: usize = offset_of!(perf_event_mmap_page, data_tail);
const DATA_OFFSET: usize = offset_of!(perf_event_mmap_page, data_offset);
const DATA_SIZE: usize = offset_of!(perf_event_mmap_page, data_size);
// The kernel ABI places the ring control words at fixed offsets of the first page.
const _: () = assert!(HEAD == 1024 && TAIL == 1032 && DATA_OFFSET == 1040 && DATA_SIZE == 1048);

/// The largest record the kernel writes: its size field is a u16.
const MAX_RECORD: usize = u16::MAX as usize;
/// The size of `struct perf_event_header`.
const HEADER: usize = 8;

/// What the reader has seen in the ring so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// SAMPLE records read.
    pub samples: u64,
    /// Samples the kernel reported lost (the sum over LOST and LOST_SAMPLES records).
    pub lost: u64,
    /// LOST records read (each stands for one or more lost samples).
    pub lost_records: u64,
    /// THROTTLE records: the kernel stopped sampling for exceeding
    /// `perf_event_max_sample_rate`.
    pub throttles: u64,
    /// UNTHROTTLE records.
    pub unthrottles: u64,
    /// Other records (MMAP2, COMM, …).
    pub other: u64,
    /// Bytes skipped because a record header was malformed.
    pub corrupt_bytes: u64,
}

/// The mapped pages of one event: unmapped on drop.
struct Mapping {
    sys: Arc<dyn Sys>,
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is HEAD, TAIL, DATA_OFFSET or DATA_SIZE, inside the
        // first page of a live mapping, 8-aligned (the page is page-aligned);
        // we access these words only atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len come from our own mmap call; the RingBuffer that
        // owned every reference into the mapping is being dropped.
        // An munmap failure leaves nothing to recover; the mapping would leak.
        let _ = unsafe { self.sys.munmap_ring(self.base, self.len) };
    }
}

/// A mapped perf ring buffer, read in place.
pub struct RingBuffer {
    map: Mapping,
    data_offset: usize,
    /// A power of two.
    data_size: u64,
    tail: u64,
    scratch: Box<[u8]>,
    layout: SampleLayout,
    stats: RingStats,
}

impl std::fmt::Debug for RingBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingBuffer")
            .field("data_size", &self.data_size)
            .field("tail", &self.tail)
            .field("stats", &self.stats)
            .finish()
    }
}

// SAFETY: the ring owns its mapping; nothing else in this process holds a
// pointer into it, so moving it to another thread moves sole access.
unsafe impl Send for RingBuffer {}

impl RingBuffer {
    /// Maps the control page and `data_pages` data pages of `fd` (a power of
    /// two, at least 1) and reads records laid out as `layout` says.
    pub fn map(
        sys: Arc<dyn Sys>,
        fd: BorrowedFd<'_>,
        data_pages: usize,
        layout: SampleLayout,
        event: &str,
    ) -> Result<Self> {
        if data_pages == 0 || !data_pages.is_power_of_two() {
            return Err(Error::Malformed {
                event: event.to_string(),
                reason: format!(
                    "ring buffer of {data_pages} data pages: the kernel needs a power of two ≥ 1"
                ),
            });
        }
        let page = page_size();
        let len = (data_pages + 1) * page;
        let base = sys
            .mmap_ring(fd, len)
            .map_err(|errno| match errno.0 {
                libc::EPERM | libc::ENOMEM => Error::Kernel {
                    op: Op::Mmap,
                    event: event.to_string(),
                    errno,
                    hint: format!(
                        "the ring buffer of {} KiB exceeds the locked-memory budget; use fewer data pages or raise /proc/sys/kernel/perf_event_mlock_kb",
                        len / 1024
                    ),
                },
                _ => Error::from_errno(Op::Mmap, event, errno, false, 0),
            })?;
        let map = Mapping { sys, base, len };
        // Kernels before 4.1 leave data_offset/data_size at 0: the data starts at page 1.
        // ATOMICS: Relaxed; the kernel writes these two once, at mmap time.
        let mut data_offset =
            usize::try_from(map.word(DATA_OFFSET).load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let mut data_size = map.word(DATA_SIZE).load(Ordering::Relaxed);
        if data_offset == 0 && data_size == 0 {
            data_offset = page;
            data_size = (data_pages * page) as u64;
        }
        let fits = data_offset
            .checked_add(usize::try_from(data_size).unwrap_or(usize::MAX))
            .is_some_and(|end| end <= len);
        if !fits || !data_size.is_power_of_two() || data_offset < HEAD + 8 * 4 {
            return Err(Error::Malformed {
                event: event.to_string(),
                reason: format!(
                    "the kernel's ring control page says data at {data_offset} size {data_size}, outside the {len}-byte mapping"
                ),
            });
        }
        let tail = map.word(TAIL).load(Ordering::Relaxed);
        Ok(RingBuffer {
            map,
            data_offset,
            data_size,
            tail,
            scratch: vec![0; MAX_RECORD].into_boxed_slice(),
            layout,
            stats: RingStats::default(),
        })
    }

    /// The record layout this ring was opened with.
    pub fn layout(&self) -> SampleLayout {
        self.layout
    }

    /// The size of the data area in bytes.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// What has been read so far.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Bytes written by the kernel and not yet consumed.
    pub fn pending_bytes(&self) -> u64 {
        self.head().wrapping_sub(self.tail)
    }

    fn head(&self) -> u64 {
        // ATOMICS: Acquire pairs with the kernel's smp_store_release of
        // data_head after writing records, so every byte before head is visible.
        self.map.word(HEAD).load(Ordering::Acquire)
    }

    fn data(&self, pos: u64, len: usize) -> &[u8] {
        let off = (pos & (self.data_size - 1)) as usize;
        debug_assert!(off + len <= self.data_size as usize);
        // SAFETY: off + len ≤ data_size (callers split at the wrap), and
        // data_offset + data_size ≤ the mapping length (checked in `map`); the
        // range is between tail and head, which the kernel does not write.
        unsafe { std::slice::from_raw_parts(self.map.base.as_ptr().add(self.data_offset + off), len) }
    }

    /// Copies `out.len()` bytes from ring position `pos`, across the wrap.
    fn copy_out(&self, pos: u64, out: &mut [u8]) {
        let off = (pos & (self.data_size - 1)) as usize;
        let first = out.len().min(self.data_size as usize - off);
        out[..first].copy_from_slice(self.data(pos, first));
        let rest = out.len() - first;
        if rest > 0 {
            out[first..].copy_from_slice(self.data(pos + first as u64, rest));
        }
    }

    /// The next unread record, or `None` when the ring is empty.
    ///
    /// The record stays valid until the guard is dropped; dropping it hands
    /// its bytes back to the kernel. A malformed header skips everything
    /// written so far, counts the bytes in [`RingStats::corrupt_bytes`] and
    /// returns the parse error.
    pub fn next_record(&mut self) -> Result<Option<RecordGuard<'_>>, ParseError> {
        let head = self.head();
        let avail = head.wrapping_sub(self.tail);
        if avail == 0 {
            return Ok(None);
        }
        let mut hdr = [0u8; HEADER];
        let bad = avail < HEADER as u64 || avail > self.data_size;
        let size = if bad {
            0
        } else {
            self.copy_out(self.tail, &mut hdr);
            u16::from_ne_bytes([hdr[6], hdr[7]]) as usize
        };
        if bad || size < HEADER || size as u64 > avail || size % 8 != 0 {
            self.stats.corrupt_bytes += avail.min(self.data_size);
            self.tail = head;
            // ATOMICS: Release orders our reads of the skipped bytes before the
            // kernel may overwrite them.
            self.map.word(TAIL).store(head, Ordering::Release);
            return Err(ParseError("malformed record header in the ring buffer; skipped to data_head"));
        }
        let kind = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let off = (self.tail & (self.data_size - 1)) as usize;
        let wraps = off + size > self.data_size as usize;
        if wraps {
            let (tail, scratch) = (self.tail, std::mem::take(&mut self.scratch));
            let mut scratch = scratch;
            self.copy_out(tail, &mut scratch[..size]);
            self.scratch = scratch;
        }
        let new_tail = self.tail + size as u64;
        self.count(kind, size, wraps);
        let RingBuffer { map, data_offset, data_size, tail, scratch, layout, .. } = self;
        let bytes: &[u8] = if wraps {
            &scratch[..size]
        } else {
            // SAFETY: as in `data`: the record lies whole inside the data area
            // between tail and head.
            unsafe {
                std::slice::from_raw_parts(
                    map.base.as_ptr().add(*data_offset + (*tail & (*data_size - 1)) as usize),
                    size,
                )
            }
        };
        Ok(Some(RecordGuard { map, tail, new_tail, bytes, layout: *layout }))
    }

    fn count(&mut self, kind: u32, size: usize, wraps: bool) {
        let word = |this: &Self, idx: usize| -> u64 {
            // The LOST record body is { id, lost }; LOST_SAMPLES is { lost }.
            let mut w = [0u8; 8];
            if HEADER + (idx + 1) * 8 <= size {
                if wraps {
                    w.copy_from_slice(&this.scratch[HEADER + idx * 8..HEADER + idx * 8 + 8]);
                } else {
                    this.copy_out(this.tail + (HEADER + idx * 8) as u64, &mut w);
                }
            }
            u64::from_ne_bytes(w)
        };
        match kind {
            b::PERF_RECORD_SAMPLE => self.stats.samples += 1,
            b::PERF_RECORD_LOST => {
                self.stats.lost_records += 1;
                self.stats.lost += word(self, 1);
            }
            b::PERF_RECORD_LOST_SAMPLES => {
                self.stats.lost_records += 1;
                self.stats.lost += word(self, 0);
            }
            b::PERF_RECORD_THROTTLE => self.stats.throttles += 1,
            b::PERF_RECORD_UNTHROTTLE => self.stats.unthrottles += 1,
            _ => self.stats.other += 1,
        }
    }

    /// Consumes every pending record, calling `f` on each parsed one; returns
    /// how many records were read. Parse errors are passed to `f` too.
    pub fn drain(&mut self, mut f: impl FnMut(Result<Record<'_>, ParseError>)) -> usize {
        let mut n = 0;
        loop {
            match self.next_record() {
                Ok(Some(rec)) => {
                    f(rec.record());
                    n += 1;
                }
                Ok(None) => return n,
                Err(e) => f(Err(e)),
            }
        }
    }
}

/// One record in the ring. Dropping it advances `data_tail` past it.
#[must_use = "dropping the guard consumes the record"]
pub struct RecordGuard<'a> {
    map: &'a Mapping,
    tail: &'a mut u64,
    new_tail: u64,
    bytes: &'a [u8],
    layout: SampleLayout,
}

impl std::fmt::Debug for RecordGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordGuard")
            .field("len", &self.bytes.len())
            .field("new_tail", &self.new_tail)
            .finish()
    }
}

impl RecordGuard<'_> {
    /// The raw record, header included, contiguous even if it wrapped.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// The record type (`PERF_RECORD_*`).
    pub fn kind(&self) -> u32 {
        u32::from_ne_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }

    /// The parsed record.
    pub fn record(&self) -> Result<Record<'_>, ParseError> {
        Record::parse(self.bytes, &self.layout)
    }
}

impl Drop for RecordGuard<'_> {
    fn drop(&mut self) {
        *self.tail = self.new_tail;
        // ATOMICS: Release orders every read of this record before the store
        // that lets the kernel overwrite it (pairs with the kernel's
        // smp_load_acquire-style read of data_tail in perf_output_begin).
        self.map.word(TAIL).store(self.new_tail, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    //! Replays recorded ring bytes through the scripted kernel, whose
    //! `mmap_ring` hands out heap memory, with the test playing the
    //! kernel's writer side.

    use std::os::fd::{AsFd, OwnedFd};

    use super::*;
    use crate::sample::{ReadFormat, SampleType};
    use crate::sys::mock::MockSys;

    /// The kernel's side of a fake ring: writes records at head.
    struct Writer {
        base: *mut u8,
        size: u64,
        head: u64,
    }

    impl Writer {
        fn of(sys: &MockSys) -> Writer {
            let (base, len) = sys.last_ring();
            Writer { base, size: (len - page_size()) as u64, head: 0 }
        }
        fn word(&self, off: usize) -> &AtomicU64 {
            // SAFETY: HEAD/TAIL of the live fake mapping, 8-aligned.
            unsafe { &*self.base.add(off).cast::<AtomicU64>() }
        }
        /// Moves head and tail to `pos` (an empty ring starting there).
        fn start_at(&mut self, pos: u64) {
            self.head = pos;
            self.word(TAIL).store(pos, Ordering::Release);
            self.word(HEAD).store(pos, Ordering::Release);
        }
        /// Writes `rec` if it fits before the reader's tail.
        fn push(&mut self, rec: &[u8]) -> bool {
            let tail = self.word(TAIL).load(Ordering::Acquire);
            if self.head + rec.len() as u64 - tail > self.size {
                return false;
            }
            for (i, b) in rec.iter().enumerate() {
                let off = ((self.head + i as u64) % self.size) as usize;
                // SAFETY: off < size, inside the data area of the fake mapping.
                unsafe { self.base.add(page_size() + off).write(*b) };
            }
            self.head += rec.len() as u64;
            self.word(HEAD).store(self.head, Ordering::Release);
            true
        }
        fn push_raw_head(&mut self, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                let off = ((self.head + i as u64) % self.size) as usize;
                // SAFETY: as in `push`.
                unsafe { self.base.add(page_size() + off).write(*b) };
            }
            self.head += bytes.len() as u64;
            self.word(HEAD).store(self.head, Ordering::Release);
        }
    }

    fn fixture() -> (Vec<u8>, SampleLayout, std::collections::HashMap<String, u64>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ring");
        let bytes = std::fs::read(dir.join("records.bin")).unwrap();
        let meta: std::collections::HashMap<String, u64> = std::fs::read_to_string(dir.join("records.txt"))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                let v = v
                    .strip_prefix("0x")
                    .map_or_else(|| v.parse().ok(), |h| u64::from_str_radix(h, 16).ok())?;
                Some((k.to_string(), v))
            })
            .collect();
        let layout = SampleLayout {
            sample_type: SampleType(meta["sample_type"]),
            read_format: ReadFormat(meta["read_format"]),
            regs_user: 0,
        };
        (bytes, layout, meta)
    }

    fn split_records(bytes: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while rest.len() >= 8 {
            let size = u16::from_ne_bytes([rest[6], rest[7]]) as usize;
            out.push(&rest[..size]);
            rest = &rest[size..];
        }
        assert!(rest.is_empty());
        out
    }

    fn dummy_fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn fixture_parses_into_the_recorded_records() {
        let (bytes, layout, meta) = fixture();
        let recs = split_records(&bytes);
        let (mut samples, mut lost, mut comm) = (0, 0, 0);
        for r in &recs {
            match Record::parse(r, &layout).unwrap() {
                Record::Sample(s) => {
                    samples += 1;
                    assert!(s.ip.is_some() && s.time.is_some() && s.cpu.is_some());
                    assert_eq!(s.identifier, s.id);
                    assert_eq!(s.period, Some(100_000));
                    let read = s.read.unwrap();
                    assert_eq!(read.len(), 2, "leader and page-faults member");
                    assert!(read.time_enabled.unwrap() >= read.time_running.unwrap());
                    assert_eq!(read.get(0).unwrap().id, s.id);
                    assert!(read.get(1).unwrap().lost.is_some());
                    assert!(!s.callchain.unwrap().is_empty());
                }
                Record::Lost { lost: n, .. } => lost += n,
                Record::Comm(c) => {
                    comm += 1;
                    assert_eq!(c.comm, b"papirus-fixture");
                }
                other => panic!("unexpected record in fixture: {other:?}"),
            }
        }
        assert_eq!(samples, meta["samples"]);
        assert_eq!(lost, meta["lost"]);
        assert_eq!(comm, meta["other"]);
    }

    #[test]
    fn fixture_replays_identically_across_every_wrap_offset() {
        let (bytes, layout, meta) = fixture();
        let recs = split_records(&bytes);
        let expected: Vec<String> =
            recs.iter().map(|r| format!("{:?}", Record::parse(r, &layout).unwrap())).collect();
        let sys = MockSys::new();
        let fd = dummy_fd();
        let page = page_size() as u64;
        // Every 8-byte-aligned start position of a one-page data area, so
        // every record's header and body straddle the wrap at some point.
        for start in (0..page).step_by(8) {
            let mut ring = RingBuffer::map(sys.clone(), fd.as_fd(), 1, layout, "fake").unwrap();
            let mut w = Writer::of(&sys);
            w.start_at(start);
            ring.tail = start;
            let mut got = Vec::new();
            let mut next = 0;
            while got.len() < recs.len() {
                // Write as much as fits, then read a couple: the ring fills,
                // wraps and drains in a different rhythm at each start.
                while next < recs.len() && w.push(recs[next]) {
                    next += 1;
                }
                for _ in 0..3 {
                    match ring.next_record().unwrap() {
                        Some(g) => got.push(format!("{:?}", g.record().unwrap())),
                        None => break,
                    }
                }
            }
            assert_eq!(got, expected, "start offset {start}");
            let st = ring.stats();
            assert_eq!(
                (st.samples, st.lost, st.other, st.corrupt_bytes),
                (meta["samples"], meta["lost"], 1, 0)
            );
            assert_eq!(ring.pending_bytes(), 0);
        }
        assert_eq!(sys.live_rings(), 0, "every mapping unmapped on drop");
        assert_eq!(sys.rings_unmapped(), page as usize / 8);
    }

    #[test]
    fn tail_advances_only_when_the_guard_drops() {
        let (bytes, layout, _) = fixture();
        let recs = split_records(&bytes);
        let sys = MockSys::new();
        let fd = dummy_fd();
        let mut ring = RingBuffer::map(sys.clone(), fd.as_fd(), 1, layout, "fake").unwrap();
        let mut w = Writer::of(&sys);
        assert!(w.push(recs[0]) && w.push(recs[1]));
        let g = ring.next_record().unwrap().unwrap();
        assert_eq!(w.word(TAIL).load(Ordering::Acquire), 0, "not consumed while borrowed");
        drop(g);
        assert_eq!(w.word(TAIL).load(Ordering::Acquire), recs[0].len() as u64);
    }

    #[test]
    fn malformed_header_is_skipped_counted_and_never_panics() {
        let layout = SampleLayout::default();
        let sys = MockSys::new();
        let fd = dummy_fd();
        let mut ring = RingBuffer::map(sys.clone(), fd.as_fd(), 1, layout, "fake").unwrap();
        let mut w = Writer::of(&sys);
        // size 4 (< header), then a size beyond what was written.
        for bad in [[9u8, 0, 0, 0, 0, 0, 4, 0], [9, 0, 0, 0, 0, 0, 0, 1]] {
            w.push_raw_head(&bad);
            assert!(ring.next_record().is_err());
            assert!(ring.next_record().unwrap().is_none(), "skipped to head");
        }
        assert_eq!(ring.stats().corrupt_bytes, 16);
        // A head that ran more than a ring ahead (a broken kernel or a bug).
        w.push_raw_head(&vec![0; 2 * page_size()]);
        assert!(ring.next_record().is_err());
        assert_eq!(ring.stats().corrupt_bytes, 16 + page_size() as u64);
    }

    #[test]
    fn truncated_records_are_errors() {
        let (bytes, layout, _) = fixture();
        let recs = split_records(&bytes);
        let sample = recs.iter().find(|r| r[0] == 9).unwrap();
        for cut in (8..sample.len()).step_by(8) {
            let mut v = sample[..cut].to_vec();
            v[6..8].copy_from_slice(&(cut as u16).to_ne_bytes());
            assert!(Record::parse(&v, &layout).is_err(), "cut at {cut}");
        }
        assert!(Record::parse(&[1, 2, 3], &layout).is_err());
    }

    #[test]
    fn bad_page_counts_are_refused_before_mapping() {
        let sys = MockSys::new();
        let fd = dummy_fd();
        for pages in [0, 3, 6] {
            let e =
                RingBuffer::map(sys.clone(), fd.as_fd(), pages, SampleLayout::default(), "x").unwrap_err();
            assert!(e.to_string().contains("power of two"), "{e}");
        }
        assert_eq!(sys.live_rings(), 0);
    }
}
