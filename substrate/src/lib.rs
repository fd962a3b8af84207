//! papirus-substrate: the machine layer of papirus.
//!
//! The counting core ([`papirus_counting`]: events, groups, their layout,
//! mmap pages, user-space reads, the estimator) re-exported at its own
//! paths, and above it event names and PMUs from sysfs, ELF symbols, the TSC
//! clock and virtual time, sampling, ring buffers, overflow signals and
//! hardware information. Everything unsafe lives in the counting core's
//! `sys`, `mmap` and `arch` modules and in [`signal`] (the overflow signal
//! handler and signal dispositions), [`ring`], [`exit`] and [`stdio`] (the
//! start-up check of the standard streams); the rest is safe Rust.
#![deny(unsafe_code)]

pub use papirus_counting::{arch, attr, count, error, event, group, layout, mapped, mmap, read, sys};

pub mod catalog;
pub mod clock;
pub mod command;
pub mod demangle;
pub mod elf;
pub mod exit;
pub mod fastread;
pub mod hwinfo;
pub mod input;
pub mod maps;
pub mod names;
pub mod pmu;
pub mod ring;
pub mod sample;
pub mod signal;
pub mod stats;
pub mod stdio;
pub mod symbolize;
pub mod vclock;

pub use attr::{Domain, EventAttr, Kind};
pub use count::{Count, Estimate, Scaling};
pub use error::{Error, Op, Result};
pub use event::{Counter, Target};
pub use group::{Group, GroupCounts, Member};
pub use names::{Parser, parse_event};

impl papirus_counting::event::SamplingAttr for sample::Sampling {
    fn validate(&self, event: &str) -> Result<()> {
        sample::Sampling::validate(self, event)
    }

    fn apply(&self, attr: &mut sys::perf_event_attr) {
        sample::Sampling::apply(self, attr)
    }
}
