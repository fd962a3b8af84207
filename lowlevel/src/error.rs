//! PAPI's error codes and the low-level API's error type.
//!
//! Every [`Error`] maps to the PAPI code a PAPI user expects ([`Error::code`]),
//! keeps what the layer below reported, and says what to do.

use std::fmt;

use papirus_substrate as sub;
use serde::Serialize;

/// PAPI's return codes (`papi.h`, PAPI 7), for callers who think in them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[repr(i32)]
pub enum Code {
    /// `PAPI_OK`: no error.
    Ok = 0,
    /// `PAPI_EINVAL`: invalid argument.
    Einval = -1,
    /// `PAPI_ENOMEM`: insufficient memory.
    Enomem = -2,
    /// `PAPI_ESYS`: a system or C library call failed.
    Esys = -3,
    /// `PAPI_ECMP`: not supported by the component.
    Ecmp = -4,
    /// `PAPI_ECLOST`: access to the counters was lost or interrupted.
    Eclost = -5,
    /// `PAPI_EBUG`: internal error.
    Ebug = -6,
    /// `PAPI_ENOEVNT`: the event does not exist.
    Enoevnt = -7,
    /// `PAPI_ECNFLCT`: the event exists but cannot be counted due to resource limits.
    Ecnflct = -8,
    /// `PAPI_ENOTRUN`: the event set is not running.
    Enotrun = -9,
    /// `PAPI_EISRUN`: the event set is running.
    Eisrun = -10,
    /// `PAPI_ENOEVST`: no such event set.
    Enoevst = -11,
    /// `PAPI_ENOTPRESET`: not a preset event.
    Enotpreset = -12,
    /// `PAPI_ENOCNTR`: the hardware has no counters.
    Enocntr = -13,
    /// `PAPI_EMISC`: unknown error.
    Emisc = -14,
    /// `PAPI_EPERM`: permission denied.
    Eperm = -15,
    /// `PAPI_ENOINIT`: the library was not initialised.
    Enoinit = -16,
    /// `PAPI_ENOCMP`: component index not set.
    Enocmp = -17,
    /// `PAPI_ENOSUPP`: not supported.
    Enosupp = -18,
    /// `PAPI_ENOIMPL`: not implemented.
    Enoimpl = -19,
    /// `PAPI_EBUF`: buffer size exceeded.
    Ebuf = -20,
    /// `PAPI_EINVAL_DOM`: invalid or missing domain.
    EinvalDom = -21,
    /// `PAPI_EATTR`: invalid or missing event attributes.
    Eattr = -22,
    /// `PAPI_ECOUNT`: too many events or attributes.
    Ecount = -23,
    /// `PAPI_ECOMBO`: bad combination of features.
    Ecombo = -24,
    /// `PAPI_ECMP_DISABLED`: the component is disabled.
    EcmpDisabled = -25,
    /// `PAPI_EDELAY_INIT`: delayed initialisation component.
    EdelayInit = -26,
    /// `PAPI_EMULPASS`: the event needs multiple passes.
    Emulpass = -27,
}

impl Code {
    /// Every code, from `PAPI_OK` down to `PAPI_EMULPASS`.
    pub const ALL: [Code; 28] = [
        Code::Ok,
        Code::Einval,
        Code::Enomem,
        Code::Esys,
        Code::Ecmp,
        Code::Eclost,
        Code::Ebug,
        Code::Enoevnt,
        Code::Ecnflct,
        Code::Enotrun,
        Code::Eisrun,
        Code::Enoevst,
        Code::Enotpreset,
        Code::Enocntr,
        Code::Emisc,
        Code::Eperm,
        Code::Enoinit,
        Code::Enocmp,
        Code::Enosupp,
        Code::Enoimpl,
        Code::Ebuf,
        Code::EinvalDom,
        Code::Eattr,
        Code::Ecount,
        Code::Ecombo,
        Code::EcmpDisabled,
        Code::EdelayInit,
        Code::Emulpass,
    ];

    /// The numeric value (`PAPI_ENOEVNT` is -7).
    pub fn value(self) -> i32 {
        self as i32
    }

    /// The code for a numeric value, if PAPI defines it.
    pub fn from_value(v: i32) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.value() == v)
    }

    /// PAPI's symbolic name (`PAPI_ENOEVNT`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "PAPI_OK",
            Code::Einval => "PAPI_EINVAL",
            Code::Enomem => "PAPI_ENOMEM",
            Code::Esys => "PAPI_ESYS",
            Code::Ecmp => "PAPI_ECMP",
            Code::Eclost => "PAPI_ECLOST",
            Code::Ebug => "PAPI_EBUG",
            Code::Enoevnt => "PAPI_ENOEVNT",
            Code::Ecnflct => "PAPI_ECNFLCT",
            Code::Enotrun => "PAPI_ENOTRUN",
            Code::Eisrun => "PAPI_EISRUN",
            Code::Enoevst => "PAPI_ENOEVST",
            Code::Enotpreset => "PAPI_ENOTPRESET",
            Code::Enocntr => "PAPI_ENOCNTR",
            Code::Emisc => "PAPI_EMISC",
            Code::Eperm => "PAPI_EPERM",
            Code::Enoinit => "PAPI_ENOINIT",
            Code::Enocmp => "PAPI_ENOCMP",
            Code::Enosupp => "PAPI_ENOSUPP",
            Code::Enoimpl => "PAPI_ENOIMPL",
            Code::Ebuf => "PAPI_EBUF",
            Code::EinvalDom => "PAPI_EINVAL_DOM",
            Code::Eattr => "PAPI_EATTR",
            Code::Ecount => "PAPI_ECOUNT",
            Code::Ecombo => "PAPI_ECOMBO",
            Code::EcmpDisabled => "PAPI_ECMP_DISABLED",
            Code::EdelayInit => "PAPI_EDELAY_INIT",
            Code::Emulpass => "PAPI_EMULPASS",
        }
    }

    /// A one-line description in the spirit of `PAPI_strerror`.
    pub fn describe(self) -> &'static str {
        match self {
            Code::Ok => "no error",
            Code::Einval => "invalid argument",
            Code::Enomem => "insufficient memory",
            Code::Esys => "a system call failed (see the errno)",
            Code::Ecmp => "not supported by the component",
            Code::Eclost => "access to the counters was lost or interrupted",
            Code::Ebug => "internal error",
            Code::Enoevnt => "event does not exist",
            Code::Ecnflct => "event exists, but cannot be counted due to resource limitations",
            Code::Enotrun => "event set is currently not running",
            Code::Eisrun => "event set is currently counting",
            Code::Enoevst => "no such event set available",
            Code::Enotpreset => "event in argument is not a valid preset",
            Code::Enocntr => "hardware does not support performance counters",
            Code::Emisc => "unknown error",
            Code::Eperm => "permission level does not permit operation",
            Code::Enoinit => "library has not been initialized",
            Code::Enocmp => "component index is not set",
            Code::Enosupp => "not supported",
            Code::Enoimpl => "not implemented",
            Code::Ebuf => "buffer size exceeded",
            Code::EinvalDom => "event set domain is not supported for the operation",
            Code::Eattr => "invalid or missing event attributes",
            Code::Ecount => "too many events or attributes",
            Code::Ecombo => "bad combination of features",
            Code::EcmpDisabled => "component containing the event is disabled",
            Code::EdelayInit => "delayed initialization component",
            Code::Emulpass => "event exists, but cannot be counted due to multiple passes required",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.value())
    }
}

/// The event-set operation an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetOp {
    /// Adding an event.
    Add,
    /// Removing an event.
    Remove,
    /// Starting the set.
    Start,
    /// Stopping the set.
    Stop,
    /// Reading the set.
    Read,
    /// Accumulating into the caller's values.
    Accum,
    /// Resetting the counters.
    Reset,
    /// Writing counter values.
    Write,
    /// Changing an option.
    SetOption,
    /// Removing every event.
    Cleanup,
}

impl fmt::Display for SetOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SetOp::Add => "add",
            SetOp::Remove => "remove",
            SetOp::Start => "start",
            SetOp::Stop => "stop",
            SetOp::Read => "read",
            SetOp::Accum => "accum",
            SetOp::Reset => "reset",
            SetOp::Write => "write",
            SetOp::SetOption => "set option",
            SetOp::Cleanup => "cleanup",
        })
    }
}

fn suggest(s: &[String]) -> String {
    if s.is_empty() {
        "; list the events with papirus-avail and papirus-native-avail".to_string()
    } else {
        format!("; did you mean {}?", s.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "))
    }
}

/// Errors of the low-level API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The substrate (kernel, sysfs, name parser) refused; see [`Error::code`].
    #[error(transparent)]
    Substrate(#[from] sub::Error),
    /// No preset or native event has this name.
    #[error("unknown event `{name}`{}", suggest(.suggestions))]
    NoSuchEvent {
        /// The name given.
        name: String,
        /// The closest known names, best first.
        suggestions: Vec<String>,
    },
    /// No event has this code.
    #[error(
        "no event has code {code:#010x}: preset codes are 0x80000000|index (see papirus-avail), native codes 0x40000000|index are handed out by name lookups in this process"
    )]
    NoSuchCode {
        /// The code given.
        code: u32,
    },
    /// A preset that exists but has no working definition on this machine.
    #[error("preset {name} is not available here: {reason}")]
    PresetUnavailable {
        /// The preset.
        name: String,
        /// Why, e.g. no hardware PMU, or no definition for this CPU.
        reason: String,
    },
    /// The set is running and the operation needs it stopped.
    #[error("cannot {op} while the event set is running; stop it first")]
    IsRunning {
        /// The operation refused.
        op: SetOp,
    },
    /// The set is stopped and the operation needs it running.
    #[error("cannot {op} an event set that is not running; start it first")]
    NotRunning {
        /// The operation refused.
        op: SetOp,
    },
    /// The events cannot be counted together (or beside another running set).
    #[error("`{event}` cannot be counted here: {reason}")]
    Conflict {
        /// The event, or the set's events.
        event: String,
        /// Which resource ran out and what to do.
        reason: String,
    },
    /// Removing an event the set does not hold.
    #[error("`{event}` is not in this event set; list its events with EventSet::events")]
    NotInSet {
        /// The event named.
        event: String,
    },
    /// Overflow or profil asked for an event the set does not hold.
    #[error("`{event}` is not in this event set (it holds: {held}); add it first, or name one of its events")]
    EventNotInSet {
        /// The event asked for (code, position or name).
        event: String,
        /// The set's events.
        held: String,
    },
    /// Starting a set that holds no event.
    #[error("the event set is empty: add at least one event before starting it")]
    EmptySet,
    /// The same event added twice.
    #[error("`{event}` is already in this event set; each event may be added once")]
    Duplicate {
        /// The event.
        event: String,
    },
    /// An argument out of range or of the wrong shape.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The argument.
        what: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The target process or thread does not exist.
    #[error("no process or thread {pid}: check the id (ps -eLf) and that it is still running")]
    NoSuchProcess {
        /// The id.
        pid: i32,
    },
    /// Options that cannot be combined.
    #[error("bad combination of options: {reason}")]
    Combination {
        /// Which options and why.
        reason: String,
    },
    /// What perf_event cannot do.
    #[error("{op} is not supported: {reason}")]
    NotSupported {
        /// The operation.
        op: SetOp,
        /// Why.
        reason: String,
    },
    /// A preset definition file that cannot be parsed.
    #[error("{file}:{line}: {reason}")]
    PresetFile {
        /// The file (or `built-in`).
        file: String,
        /// The 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The caller's value slice has the wrong length.
    #[error(
        "value buffer holds {got} values but the event set has {expected} events; pass a slice of EventSet::len()"
    )]
    Buffer {
        /// The slice's length.
        got: usize,
        /// The number of events.
        expected: usize,
    },
}

/// The result type of the low-level API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The PAPI code a PAPI user would expect for this error.
    pub fn code(&self) -> Code {
        match self {
            Error::Substrate(e) => substrate_code(e),
            Error::NoSuchEvent { .. }
            | Error::NoSuchCode { .. }
            | Error::PresetUnavailable { .. }
            | Error::EventNotInSet { .. } => Code::Enoevnt,
            Error::IsRunning { .. } => Code::Eisrun,
            Error::NotRunning { .. } => Code::Enotrun,
            Error::Conflict { .. } => Code::Ecnflct,
            Error::NotInSet { .. } | Error::EmptySet | Error::Duplicate { .. } | Error::Invalid { .. } => {
                Code::Einval
            }
            Error::NoSuchProcess { .. } => Code::Esys,
            Error::Combination { .. } => Code::Ecombo,
            Error::NotSupported { .. } => Code::Enosupp,
            Error::PresetFile { .. } => Code::Einval,
            Error::Buffer { .. } => Code::Ebuf,
        }
    }
}

fn substrate_code(e: &sub::Error) -> Code {
    match e {
        sub::Error::Unsupported { .. } | sub::Error::UnknownEvent { .. } | sub::Error::UnknownPmu { .. } => {
            Code::Enoevnt
        }
        sub::Error::Permission { .. } => Code::Eperm,
        sub::Error::NoCounterSlot { .. } => Code::Ecnflct,
        sub::Error::Malformed { .. } | sub::Error::SymbolNotFound { .. } => Code::Einval,
        sub::Error::TooManyFiles { .. } => Code::Enomem,
        _ => Code::Esys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_papi_h() {
        // Values from papi.h (PAPI 7.0): PAPI_OK is 0, each error one below the last.
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(c.value(), -(i as i32), "{}", c.name());
            assert_eq!(Code::from_value(c.value()), Some(*c));
        }
        assert_eq!(Code::Enoevnt.value(), -7);
        assert_eq!(Code::Ecnflct.value(), -8);
        assert_eq!(Code::Enosupp.value(), -18);
        assert_eq!(Code::Emulpass.value(), -27);
        assert_eq!(Code::from_value(-28), None);
        assert_eq!(Code::EinvalDom.name(), "PAPI_EINVAL_DOM");
    }

    #[test]
    fn substrate_errors_map_to_papi_codes() {
        use papirus_substrate::Op;
        use papirus_substrate::sys::Errno;
        let enoent = sub::Error::from_errno(Op::Open, "cycles", Errno(libc::ENOENT), true, 0);
        let e = Error::from(enoent);
        assert_eq!(e.code(), Code::Enoevnt);
        assert!(e.to_string().contains("no hardware PMU"), "{e}");
        let eacces = sub::Error::from_errno(Op::Open, "cycles:k", Errno(libc::EACCES), false, 0);
        assert_eq!(Error::from(eacces).code(), Code::Eperm);
        let enospc = sub::Error::from_errno(Op::Open, "mem:0x1000", Errno(libc::ENOSPC), false, 0);
        assert_eq!(Error::from(enospc).code(), Code::Ecnflct);
        let esrch = sub::Error::from_errno(Op::Open, "task-clock", Errno(libc::ESRCH), false, 99);
        assert_eq!(Error::from(esrch).code(), Code::Esys);
    }

    #[test]
    fn messages_say_what_to_do() {
        let e = Error::NoSuchEvent { name: "task-clok".into(), suggestions: vec!["task-clock".into()] };
        assert_eq!(e.code(), Code::Enoevnt);
        assert!(e.to_string().contains("did you mean `task-clock`"), "{e}");
        let e = Error::IsRunning { op: SetOp::Add };
        assert!(e.to_string().contains("stop it first"), "{e}");
        assert_eq!(Error::NotRunning { op: SetOp::Stop }.code(), Code::Enotrun);
        assert_eq!(Error::EmptySet.code(), Code::Einval);
    }
}
