//! The clocks timers read.

/// A monotonic clock in nanoseconds, readable from any thread.
pub trait TimeSource: Send + Sync + std::fmt::Debug {
    /// The current time in ns from an arbitrary origin.
    fn now_ns(&self) -> u64;
}

impl<T: TimeSource + ?Sized> TimeSource for &T {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// Wall-clock time since the first use in this process.
#[derive(Debug, Default, Clone, Copy)]
pub struct Wall;

impl TimeSource for Wall {
    #[inline]
    fn now_ns(&self) -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}
