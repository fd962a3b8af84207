//! papirus-highlevel: what most users call. Regions bracketing code, rates,
//! and Paradyn's instrumentation primitives — counters, nesting timers that
//! another thread can sample, predicates guarding them, and folding time
//! histograms.
#![deny(unsafe_code)]

pub mod clocks;
pub mod counters_api;
pub mod histogram;
pub mod predicate;
pub mod rates;
pub mod region;
pub mod report;
pub mod timer;

pub use clocks::{ProcessTime, TimeSource, Wall};
pub use histogram::{Sampler, TimeHistogram};
pub use predicate::{Expr, Op, Predicate};
pub use region::{Config, Region, RegionError, region, region_begin, region_end};
pub use report::{Report, flush};
pub use timer::{Counter, Timer, TimerError};
