//! papirus-calibrate: what each papirus primitive costs on this machine, in
//! TSC cycles and nanoseconds, beside the baselines it must be read against;
//! a machine cost file the probe tool's cost model reads back; and checks
//! that counts of known workloads are right.
#![deny(unsafe_code)]

pub mod costfile;
pub mod measure;

pub use costfile::{Check, CostFile, FORMAT_VERSION, LoadError, Outcome};
pub use measure::{Bin, Cost, Plan, Stats, Ticks, measure};
