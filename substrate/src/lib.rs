//! papirus-substrate: the machine layer of papirus.
//!
//! The only crate of papirus that talks to `perf_event_open(2)`, its ioctls
//! and mmap'd pages, the TSC, and sysfs. Everything unsafe lives in
//! [`sys`] (syscalls) and the modules that map kernel pages; the rest is
//! safe Rust.
#![deny(unsafe_code)]

pub mod attr;
pub mod catalog;
pub mod elf;
pub mod error;
pub mod event;
pub mod group;
pub mod names;
pub mod pmu;
pub mod sys;

pub use attr::{Domain, EventAttr, Kind};
pub use error::{Error, Op, Result};
pub use event::{Count, Counter, Scaling, Target};
pub use group::{Group, GroupCounts, Member};
pub use names::{Parser, parse_event};
