//! papirus-profile: a sampling profiler on papirus' substrate, what
//! `papirus-profile record` and `report` do.
//!
//! [`record::record`] samples a command it starts, or a running process,
//! with one perf event (task-clock, cpu-clock, page-faults, a breakpoint, a
//! tracepoint, or a hardware event where a PMU exists), optionally with
//! call chains; [`collect`] turns ring records into per-thread counts of
//! symbolized stacks; a [`recording::Recording`] is saved as versioned JSON;
//! [`report`] prints it like `perf report` or converts it to pprof, folded
//! stacks or a flame graph SVG through `papirus-formats`.
//!
//! # Caveats
//! - Frame-pointer call chains (`CallGraph::Fp`) are the kernel's walks:
//!   code built without frame pointers (most distribution libraries) shows
//!   its own function but loses its callers; `CallGraph::Dwarf` unwinds a
//!   copy of the user stack with the modules' `.eh_frame` instead, up to
//!   the size of the copy.
//! - A sample whose address lies outside every mapping known to the tool
//!   (JIT code, a module gone before it could be read) is `[unknown]`.
#![forbid(unsafe_code)]

pub mod collect;
pub mod record;
pub mod recording;
pub mod report;

use std::path::PathBuf;

pub use record::{Options, Target, record};
pub use recording::Recording;

/// What can go wrong while recording or reporting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The event could not be parsed or opened (the kernel's reason inside).
    #[error(transparent)]
    Event(#[from] papirus_substrate::Error),
    /// The command could not be started.
    #[error(transparent)]
    Spawn(#[from] papirus_substrate::command::SpawnError),
    /// No such process to profile.
    #[error("no process {0}: give the id of a running process")]
    NoSuchProcess(i32),
    /// An option that makes no sense.
    #[error("{0}")]
    Usage(String),
    /// A system call or file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A recording that cannot be read.
    #[error(transparent)]
    Input(#[from] papirus_substrate::input::InputError),
    /// A recording that is not one, or of another version.
    #[error("{}: not a papirus-profile recording this version reads: {why}", .path.display())]
    BadRecording {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// An output that cannot be written.
    #[error(transparent)]
    Output(#[from] papirus_formats::output::OutputError),
}
