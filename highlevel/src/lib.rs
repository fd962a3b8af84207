//! papirus-highlevel: what most users call. Regions bracketing code, rates,
//! and Paradyn's instrumentation primitives — counters, nesting timers that
//! another thread can sample, predicates guarding them, and folding time
//! histograms.
//!
//! * [`region`](mod@region): `region_begin`/`region_end` and the [`Region`] guard,
//!   per thread and nested, measured with real and virtual time and perf
//!   events chosen by [`Config`] or `PAPIRUS_EVENTS`/`PAPI_EVENTS`.
//! * [`report`]: the per-process JSON report (schema in
//!   `schema/regions.schema.json`) and its text twin, written at exit and on
//!   [`flush`].
//! * [`rates`]: PAPI's `flops_rate`, `flips_rate`, `ipc`, `epc`, plus
//!   `event_rate` and `time_rate`, which work without a hardware PMU.
//! * [`counters_api`]: PAPI's classic `start_counters` family.
//! * [`Counter`], [`Timer`] over a [`TimeSource`] ([`Wall`]: the TSC;
//!   [`ProcessTime`]: the process's CPU time), [`Predicate`],
//!   [`TimeHistogram`] and [`Sampler`]: Paradyn's primitives.
//!
//! `benches/README.md` lists what each costs on the development VM.
#![forbid(unsafe_code)]

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
pub use region::{Config, Reading, Region, RegionError, read_counters, region, region_begin, region_end};
pub use report::{Report, flush};
pub use timer::{Counter, Timer, TimerError};
