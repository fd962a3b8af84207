//! Trampoline arenas: executable memory within a rel32's reach of the
//! functions whose trampolines it holds (one arena serves every function
//! within its 2 GiB window).

/// The name of the memfd a target's arenas are mapped from: `/proc/PID/maps`
/// shows them as `/memfd:papirus-probe-trampolines (deleted)`.
pub const ARENA_NAME: &str = "papirus-probe-trampolines";

/// Bytes mapped per arena.
pub const ARENA_LEN: u64 = 1 << 20;
/// Upper bound of one trampoline's size (register saves, up to 15 displaced
/// instructions grown by relocation, the jump back, the hook pointer).
pub const TRAMPOLINE_MAX: u64 = 512;
/// Distance kept below rel32's ±2 GiB so that data a displaced instruction
/// refers to near the function stays in reach too.
const MARGIN: u64 = 64 << 20;
const REACH: u64 = (1 << 31) - MARGIN;

/// One arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arena {
    /// First address.
    pub base: u64,
    /// Bytes mapped.
    pub len: u64,
    /// Bytes handed out.
    pub used: u64,
}

impl Arena {
    /// Whether a trampoline of up to [`TRAMPOLINE_MAX`] bytes for the function at `addr` fits here.
    pub fn serves(&self, addr: u64) -> bool {
        self.used + TRAMPOLINE_MAX <= self.len
            && self.base.abs_diff(addr) < REACH
            && (self.base + self.len).abs_diff(addr) < REACH
    }

    /// Where the next trampoline goes.
    pub fn next(&self) -> u64 {
        self.base + self.used
    }

    /// Hands out `len` bytes at [`Arena::next`], keeping 16-byte alignment.
    pub fn commit(&mut self, len: u64) {
        self.used += len.next_multiple_of(16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_and_space() {
        let mut a = Arena { base: 0x5555_0000_0000, len: ARENA_LEN, used: 0 };
        assert!(a.serves(0x5555_4000_0000));
        assert!(!a.serves(0x7fff_0000_0000));
        a.commit(100);
        assert_eq!(a.next(), a.base + 112);
        a.used = ARENA_LEN - 100;
        assert!(!a.serves(a.base));
    }
}
