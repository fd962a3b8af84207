//! papirus-substrate: the machine layer of papirus.
//!
//! The only crate of papirus that talks to `perf_event_open(2)`, its ioctls
//! and mmap'd pages, the TSC, and sysfs. Everything unsafe lives in
//! [`sys`] (syscalls) and the modules that map kernel pages; the rest is
//! safe Rust.
#![deny(unsafe_code)]

pub mod attr;
pub mod elf;
pub mod error;
pub mod sys;

pub use attr::{Domain, EventAttr, Kind};
pub use error::{Error, Op, Result};
