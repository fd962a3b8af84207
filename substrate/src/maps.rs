//! `/proc/PID/maps`: the memory map of a process, and the gaps in it.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// Access rights of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub struct Perms {
    /// `r`
    pub read: bool,
    /// `w`
    pub write: bool,
    /// `x`
    pub exec: bool,
    /// `p` (private, copy-on-write) rather than `s` (shared).
    pub private: bool,
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Access rights.
    pub perms: Perms,
    /// Offset in the mapped file.
    pub offset: u64,
    /// Device of the mapped file, `(major, minor)`; `(0, 0)` when anonymous.
    pub dev: (u32, u32),
    /// Inode of the mapped file, 0 for anonymous memory.
    pub inode: u64,
    /// The file, or a pseudo-name such as `[heap]`, `[stack]`, `[vdso]`; empty when anonymous.
    pub name: String,
}

impl Mapping {
    /// The mapped file, when the mapping is backed by one.
    pub fn file(&self) -> Option<PathBuf> {
        (self.inode != 0 && self.name.starts_with('/')).then(|| PathBuf::from(&self.name))
    }
}

/// A line that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine(pub String);

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unparsable /proc/PID/maps line: {:?}", self.0)
    }
}

impl std::error::Error for BadLine {}

/// Parses the text of a maps file.
pub fn parse(text: &str) -> Result<Vec<Mapping>, BadLine> {
    text.lines().filter(|l| !l.trim().is_empty()).map(parse_line).collect()
}

fn parse_line(line: &str) -> Result<Mapping, BadLine> {
    let bad = || BadLine(line.to_string());
    let mut fields = line.splitn(6, ' ');
    let mut next = || fields.next().ok_or_else(bad);
    let (range, perms, offset, dev, inode) = (next()?, next()?, next()?, next()?, next()?);
    let name = fields.next().unwrap_or("").trim_start().to_string();
    let (start, end) = range.split_once('-').ok_or_else(bad)?;
    let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
    let (major, minor) = dev.split_once(':').ok_or_else(bad)?;
    let dev_part = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
    let p = perms.as_bytes();
    if p.len() != 4 {
        return Err(bad());
    }
    Ok(Mapping {
        start: hex(start)?,
        end: hex(end)?,
        perms: Perms { read: p[0] == b'r', write: p[1] == b'w', exec: p[2] == b'x', private: p[3] == b'p' },
        offset: hex(offset)?,
        dev: (dev_part(major)?, dev_part(minor)?),
        inode: inode.parse().map_err(|_| bad())?,
        name,
    })
}

/// Reads `/proc/PID/maps`.
pub fn read(pid: i32) -> std::io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    parse(&text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The lowest page-aligned address usable by user space (vm.mmap_min_addr's usual value).
const MIN_ADDR: u64 = 0x10000;
/// The top of the x86-64 lower half with 4-level paging, where user mappings end.
const USER_TOP: u64 = 0x7fff_ffff_f000;

/// Free ranges between mappings, as `(start, end)`, in address order.
pub fn gaps(maps: &[Mapping]) -> Vec<(u64, u64)> {
    let mut sorted: Vec<(u64, u64)> = maps.iter().map(|m| (m.start, m.end)).collect();
    sorted.sort_unstable();
    let mut out = Vec::new();
    let mut cursor = MIN_ADDR;
    for (start, end) in sorted {
        if start > cursor {
            out.push((cursor, start.min(USER_TOP)));
        }
        cursor = cursor.max(end);
        if cursor >= USER_TOP {
            break;
        }
    }
    if cursor < USER_TOP {
        out.push((cursor, USER_TOP));
    }
    out.retain(|(s, e)| s < e);
    out
}

/// A free, page-aligned range of `len` bytes whose every byte lies within
/// ±2 GiB (minus `len`) of `near`, closest first; `None` when there is none.
pub fn free_near(maps: &[Mapping], near: u64, len: u64) -> Option<u64> {
    const REACH: u64 = (1 << 31) - 1;
    let page = 4096;
    let len = len.div_ceil(page) * page;
    let lo = near.saturating_sub(REACH - len);
    let hi = near.saturating_add(REACH - len);
    let mut best: Option<(u64, u64)> = None;
    for (s, e) in gaps(maps) {
        if e < s + len {
            continue;
        }
        // The candidate start closest to `near` inside [s, e - len].
        let first = s.div_ceil(page) * page;
        let last = (e - len) / page * page;
        if first > last {
            continue;
        }
        let cand = (near.clamp(first, last) / page * page).max(first);
        if cand < lo || cand > hi {
            continue;
        }
        let dist = cand.abs_diff(near);
        if best.is_none_or(|(_, d)| dist < d) {
            best = Some((cand, dist));
        }
    }
    best.map(|(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
555555554000-555555556000 r--p 00000000 fe:01 1234                       /usr/bin/cat
555555556000-55555555a000 r-xp 00002000 fe:01 1234                       /usr/bin/cat
7ffff7dd3000-7ffff7df9000 r-xp 00000000 fe:01 99   /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7ff9000-7ffff7ffd000 r--p 00000000 00:00 0                          [vvar]
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_lines() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].start, 0x555555556000);
        assert!(m[1].perms.exec && m[1].perms.private && !m[1].perms.write);
        assert_eq!(m[1].offset, 0x2000);
        assert_eq!(m[1].dev, (0xfe, 0x01));
        assert_eq!(m[2].file().unwrap(), PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(m[3].file(), None);
        assert_eq!(m[4].name, "[stack]");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("not a maps line").is_err());
        assert!(parse("1000-zz r-xp 0 0 0").is_err());
        assert!(parse("1000-2000 r-xp 0 fe 0").is_err(), "a device without minor");
    }

    #[test]
    fn gaps_and_near() {
        let m = parse(SAMPLE).unwrap();
        let g = gaps(&m);
        assert_eq!(g[0], (MIN_ADDR, 0x555555554000));
        assert!(g.contains(&(0x55555555a000, 0x7ffff7dd3000)));
        let a = free_near(&m, 0x555555556000, 1 << 20).unwrap();
        assert!(a.abs_diff(0x555555556000) < (1 << 31));
        assert!(m.iter().all(|x| a + (1 << 20) <= x.start || a >= x.end));
    }

    #[test]
    fn reads_own_maps() {
        let m = read(std::process::id() as i32).unwrap();
        assert!(m.iter().any(|x| x.perms.exec));
    }
}
