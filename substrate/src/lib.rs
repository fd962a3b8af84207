//! papirus-substrate: the machine layer of papirus.
//!
//! The only crate of papirus that talks to `perf_event_open(2)`, its ioctls
//! and mmap'd pages, the TSC, and sysfs. Everything unsafe lives in
//! [`sys`] (syscalls), [`mmap`] (counter pages), [`ring`] (sample ring
//! buffer pages), [`arch`] (rdtsc, cpuid, rdpmc), [`signal`] (the overflow
//! signal handler and signal dispositions), [`exit`] (`atexit`) and
//! [`stdio`] (the start-up check of the standard streams); the rest is safe
//! Rust.
#![deny(unsafe_code)]

pub mod arch;
pub mod attr;
pub mod catalog;
pub mod clock;
pub mod command;
pub mod demangle;
pub mod elf;
pub mod error;
pub mod event;
pub mod exit;
pub mod fastread;
pub mod group;
pub mod hwinfo;
pub mod input;
pub mod maps;
pub mod mmap;
pub mod names;
pub mod pmu;
pub mod ring;
pub mod sample;
pub mod signal;
pub mod stdio;
pub mod symbolize;
pub mod sys;
pub mod vclock;

pub use attr::{Domain, EventAttr, Kind};
pub use error::{Error, Op, Result};
pub use event::{Count, Counter, Scaling, Target};
pub use group::{Group, GroupCounts, Member};
pub use names::{Parser, parse_event};
