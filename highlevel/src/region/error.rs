//! What the region API reports when it cannot do what was asked.

use std::path::PathBuf;

use papirus_lowlevel::Tid;

/// Errors of the region API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// `region_end` of a name that is open nowhere.
    #[error(
        "region `{name}` ended in thread {thread} but was never begun: call region_begin(\"{name}\") first"
    )]
    NotBegun {
        /// The region.
        name: String,
        /// The calling thread.
        thread: Tid,
    },
    /// `region_end` of a region that has a region begun inside it still open.
    #[error(
        "region `{ended}` ended in thread {thread} while `{innermost}`, begun inside it, is still open: end `{innermost}` first (regions nest)"
    )]
    OutOfOrder {
        /// The region the caller ended.
        ended: String,
        /// The innermost open region.
        innermost: String,
        /// The calling thread.
        thread: Tid,
    },
    /// `region_end` in a thread other than the one that began the region.
    #[error(
        "region `{name}` was begun in thread {begun_in} and cannot end in thread {ended_in}: regions are per thread, end it where it began"
    )]
    OtherThread {
        /// The region.
        name: String,
        /// The thread that began it.
        begun_in: Tid,
        /// The calling thread.
        ended_in: Tid,
    },
    /// An event of [`Config::events`] cannot be counted here.
    #[error("region event `{event}` cannot be counted: {source}")]
    Event {
        /// The event as given.
        event: String,
        /// Why, from the low-level layer (with the PAPI code).
        #[source]
        source: Box<papirus_lowlevel::Error>,
    },
    /// An entry of an event list that is not an event name.
    #[error("bad event list entry `{entry}`: {reason}")]
    EventSyntax {
        /// The entry.
        entry: String,
        /// What is wrong.
        reason: String,
    },
    /// [`Config::install`] after regions were set up.
    #[error(
        "regions are already set up (by Config::install or the first region_begin): install the configuration before the first region"
    )]
    AlreadyConfigured,
    /// Reading or opening the thread's counters failed.
    #[error("thread {thread}: {op} of the region counters failed: {source}")]
    Counters {
        /// The calling thread.
        thread: Tid,
        /// What was done.
        op: &'static str,
        /// The substrate's error.
        #[source]
        source: Box<papirus_substrate::Error>,
    },
    /// The thread is exiting (its thread-locals are gone).
    #[error("the calling thread is exiting: regions cannot begin or end in thread-local destructors")]
    ThreadExiting,
    /// Writing the report failed.
    #[error("writing the region report {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
