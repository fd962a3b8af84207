//! papirus-lowlevel: PAPI's low-level API in idiomatic Rust.
//!
//! ```no_run
//! let lib = papirus_lowlevel::init()?;
//! let mut set = lib.event_set();
//! set.add_all(["task-clock", "page-faults", "PAPI_TOT_INS"])?;
//! set.start()?;
//! // ... the work measured ...
//! let values = set.stop()?;
//! # Ok::<(), papirus_lowlevel::Error>(())
//! ```
//!
//! * [`init`] collects the machine's facts once; event sets come from the
//!   returned [`Library`], so nothing runs uninitialised.
//! * [`EventSet`] follows PAPI's state machine, with every misuse an
//!   [`Error`] whose [`Error::code`] is the PAPI code.
//! * Overflow handlers and PC histograms live on the event set:
//!   [`EventSet::overflow`], [`EventSet::overflow_deferred`],
//!   [`EventSet::profil`], [`EventSet::sprofil`] (see [`overflow`], [`profil`]).
//! * Presets ([`preset`]) are data: `data/preset_list.csv` and
//!   `data/presets.csv`; native events ([`native`]) use perf's syntax.
//! * Timers: [`real_cyc`], [`real_nsec`], [`real_usec`], [`virt_cyc`],
//!   [`virt_nsec`], [`virt_usec`].
#![forbid(unsafe_code)]

pub mod avail;
pub mod derived;
pub mod error;
pub mod eventset;
pub mod library;
pub mod native;
pub mod overflow;
pub mod preset;
pub mod profil;

pub use error::{Code, Error, Result, SetOp};
pub use eventset::{EventInfo, EventRef, EventSet, Granularity, Options, ResolvedEvent, Status, Value};
pub use library::{
    Library, Machine, Tid, init, is_initialized, list_threads, real_cyc, real_nsec, real_usec, thread_id,
    virt_cyc, virt_nsec, virt_usec,
};
