//! papirus-calibrate: what each papirus primitive costs on this machine, in
//! TSC cycles and nanoseconds, beside the baselines it must be read against;
//! a machine cost file the probe tool's cost model reads back; and checks
//! that counts of known workloads are right.
//!
//! Rows live in a [`Registry`]; other crates add theirs with
//! [`Registry::add`]; the `papirus-calibrate` tool (papirus-tools) runs them.
#![forbid(unsafe_code)]

pub mod builtin;
pub mod costfile;
pub mod measure;
pub mod rows;
pub mod validate;

pub use costfile::{Check, CostFile, FORMAT_VERSION, LoadError, Outcome};
pub use measure::{Bin, Cost, Plan, Stats, Ticks, measure, measure_phases};
pub use rows::{Bench, Registry, Report, RowResult, Unavailable};
