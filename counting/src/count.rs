//! What a reading of an event is ([`Count`]) and the one estimator that turns
//! two readings into the count between them ([`Count::since`]).
//!
//! # The estimator
//!
//! Every reader of papirus (event sets, regions, the probe runtime) reports
//! the count of an interval the same way: subtract, then scale.
//!
//! - The increase of the value and of the enabled and running times is
//!   taken between the two readings. A value that went *down* by less than
//!   half of its 64-bit range stepped back (a user-space value extrapolated
//!   a little ahead of the kernel's, then a kernel read): nothing was counted.
//!   Going down by more than that is a wrap past the top, counted as the
//!   wrapped difference. Times follow the same rule.
//! - When the event ran for part of the interval it was enabled (the kernel
//!   multiplexed it), the increase is scaled by `enabled / running`, exactly
//!   in 128 bits and saturating at `u64::MAX`.
//! - When it was enabled but never ran, nothing can be extrapolated: the
//!   value is 0 and [`Scaling::NeverRan`] says so. This is the only
//!   "never ran" state.
//! - `running > enabled`, which the kernel does report (its two clocks are
//!   updated at slightly different moments), is taken as exact, never a
//!   panic.
//!
//! Scaling the interval rather than each reading keeps an interval's
//! estimate independent of what the event did before it (scaling two
//! cumulative readings and subtracting can even go negative). The probe
//! runtime adds the estimates of the intervals between its reads, so an
//! activation's count is the sum of its intervals' estimates.
//!
//! The estimator uses no floating point and no vector instruction: the
//! probe runtime's hooks call it.

use std::sync::atomic::{Ordering, compiler_fence};

/// One reading of an event: its value and the times the kernel reported
/// with it, all cumulative since the event was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// The counter value.
    pub raw: u64,
    /// Nanoseconds the event was enabled.
    pub time_enabled: u64,
    /// Nanoseconds the event was actually counting (on the PMU).
    pub time_running: u64,
}

/// How an estimate relates to the true count of its interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    /// The event ran the whole time it was enabled (or was not enabled at
    /// all): the increase is the count.
    Exact,
    /// The event ran for part of the time it was enabled; the estimate is
    /// the increase times `factor` (enabled / running, > 1).
    Scaled {
        /// `enabled / running` over the interval.
        factor: f64,
    },
    /// Enabled but never on a counter in the interval: no estimate is
    /// possible, the value is 0.
    NeverRan,
    /// The running time grew more than the enabled time (the kernel's two
    /// clocks disagree a little): taken as exact.
    RunningExceedsEnabled,
}

/// The count of one interval, estimated from two readings ([`Count::since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// The estimated count (0 when the event never ran).
    pub value: u64,
    /// The increase of the counter value, unscaled.
    pub raw: u64,
    /// Nanoseconds the event was enabled in the interval.
    pub enabled: u64,
    /// Nanoseconds it was running in the interval.
    pub running: u64,
}

/// The increase from `then` to `now` of a 64-bit count: a step back (down
/// by less than half the range) is no increase, a wrap past the top is the
/// wrapped difference.
#[inline(always)]
pub fn increase(then: u64, now: u64) -> u64 {
    let d = now.wrapping_sub(then);
    if d > u64::MAX / 2 { 0 } else { d }
}

impl Count {
    /// Nothing counted, never enabled.
    pub const ZERO: Count = Count { raw: 0, time_enabled: 0, time_running: 0 };

    /// Stores `c` word by word. The read paths write counts with it: the
    /// probe runtime's hooks must use no vector register, and the compiler
    /// merges adjacent word stores (and loads) into vector moves unless a
    /// fence separates them (a compiler fence emits no instruction).
    #[inline(always)]
    pub fn store(&mut self, c: Count) {
        self.raw = c.raw;
        compiler_fence(Ordering::SeqCst);
        self.time_enabled = c.time_enabled;
        compiler_fence(Ordering::SeqCst);
        self.time_running = c.time_running;
        compiler_fence(Ordering::SeqCst);
    }

    /// This count, loaded word by word (see [`store`](Self::store)).
    #[inline(always)]
    pub fn load(&self) -> Count {
        let raw = self.raw;
        compiler_fence(Ordering::SeqCst);
        let time_enabled = self.time_enabled;
        compiler_fence(Ordering::SeqCst);
        let time_running = self.time_running;
        compiler_fence(Ordering::SeqCst);
        Count { raw, time_enabled, time_running }
    }

    /// The count between `earlier` and this reading, by the estimator of the
    /// [module documentation](self). `Count::ZERO` as `earlier` gives the
    /// count since the event was opened.
    #[inline(always)]
    pub fn since(&self, earlier: &Count) -> Estimate {
        let raw = increase(earlier.raw, self.raw);
        let enabled = increase(earlier.time_enabled, self.time_enabled);
        let running = increase(earlier.time_running, self.time_running);
        let value = if running >= enabled {
            raw
        } else if running == 0 {
            0
        } else {
            crate::arch::mul_div(raw, enabled, running)
        };
        Estimate { value, raw, enabled, running }
    }
}

impl Estimate {
    /// How [`value`](Self::value) relates to the true count.
    pub fn scaling(&self) -> Scaling {
        let (enabled, running) = (self.enabled, self.running);
        if running == enabled {
            Scaling::Exact
        } else if running > enabled {
            Scaling::RunningExceedsEnabled
        } else if running == 0 {
            Scaling::NeverRan
        } else {
            Scaling::Scaled { factor: enabled as f64 / running as f64 }
        }
    }

    /// The value, or `None` when the event never ran (nothing to report).
    pub fn counted(&self) -> Option<u64> {
        (self.scaling() != Scaling::NeverRan).then_some(self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(raw: u64, time_enabled: u64, time_running: u64) -> Count {
        Count { raw, time_enabled, time_running }
    }

    #[test]
    fn exact_when_running_equals_enabled() {
        let e = c(1500, 900, 900).since(&c(500, 400, 400));
        assert_eq!(e, Estimate { value: 1000, raw: 1000, enabled: 500, running: 500 });
        assert_eq!(e.scaling(), Scaling::Exact);
        // Not enabled in the interval: whatever was counted is exact.
        assert_eq!(c(7, 0, 0).since(&Count::ZERO).scaling(), Scaling::Exact);
    }

    #[test]
    fn multiplexed_intervals_are_scaled_by_their_own_times() {
        // Cumulatively the event ran half the time, in this interval a quarter.
        let then = c(1000, 1000, 500);
        let now = c(1100, 1400, 600);
        let e = now.since(&then);
        assert_eq!((e.value, e.raw), (400, 100));
        assert_eq!(e.scaling(), Scaling::Scaled { factor: 4.0 });
        // The product overflows u64; the estimate saturates.
        assert_eq!(c(1 << 62, 1 << 62, 1 << 61).since(&Count::ZERO).value, 1 << 63);
        assert_eq!(c(u64::MAX / 2, u64::MAX / 2, 1).since(&Count::ZERO).value, u64::MAX);
    }

    #[test]
    fn never_ran_is_zero_and_says_so() {
        let e = c(10, 2000, 100).since(&c(10, 1000, 100));
        assert_eq!(e.value, 0);
        assert_eq!(e.scaling(), Scaling::NeverRan);
        assert_eq!(e.counted(), None);
        assert_eq!(c(5, 5, 5).since(&Count::ZERO).counted(), Some(5));
    }

    #[test]
    fn running_beyond_enabled_is_exact() {
        let e = c(77, 100, 101).since(&Count::ZERO);
        assert_eq!(e.value, 77);
        assert_eq!(e.scaling(), Scaling::RunningExceedsEnabled);
    }

    #[test]
    fn a_wrap_counts_and_a_step_back_does_not() {
        assert_eq!(c(4, 0, 0).since(&c(u64::MAX, 0, 0)).value, 5, "wrapped past the top");
        assert_eq!(c(90, 0, 0).since(&c(100, 0, 0)).value, 0, "stepped back");
        assert_eq!(increase(u64::MAX - 1, 1), 3);
        assert_eq!(increase(1 << 40, 0), 0);
        // Times that step back do not make an interval look multiplexed.
        let e = c(110, 1000, 995).since(&c(100, 1000, 1000));
        assert_eq!((e.value, e.scaling()), (10, Scaling::Exact));
    }
}
