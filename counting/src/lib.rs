//! papirus-counting: papirus' counting core.
//!
//! Everything between an event description and a count, done once for every
//! reader papirus has (event sets, regions, the probe runtime in a target):
//!
//! - [`attr`]: what an event is (`perf_event_attr`), [`event`] and
//!   [`group`]: events and groups opened through the [`sys`] seam;
//! - [`layout`]: which events share a group;
//! - [`mmap`]: the perf mmap page and its seqlock reader (rdpmc, the
//!   kernel's TSC conversion);
//! - [`read`]: a group read by its fastest exact path, [`mapped`]: its pages
//!   mapped and each member's method decided;
//! - [`count`]: the one estimator that turns two readings into a count.
//!
//! No event-name parser and no sysfs: papirus-substrate adds those above,
//! and the probe runtime, which receives resolved descriptions, needs only
//! this crate. Everything unsafe lives in [`sys`] (system calls), [`mmap`]
//! (kernel pages) and [`arch`] (rdtsc, cpuid, rdpmc).
#![deny(unsafe_code)]

pub mod arch;
pub mod attr;
pub mod count;
pub mod error;
pub mod event;
pub mod group;
pub mod layout;
pub mod mapped;
pub mod mmap;
pub mod read;
pub mod sys;

pub use attr::{Domain, EventAttr, Kind};
pub use count::{Count, Estimate, Scaling};
pub use error::{Error, Op, Result};
pub use event::{Counter, Target};
pub use group::{Group, GroupCounts, Member};
