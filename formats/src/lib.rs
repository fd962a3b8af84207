//! papirus-formats: the output writers the papirus tools share.
//!
//! Each writer takes generic input (call stacks as frame names, root first,
//! with weights) rather than any tool's own types, so the sampling profiler
//! and the probe write the same files the same way:
//!
//! - [`folded`]: folded stacks (`main;solve;kernel 1234`), read by inferno,
//!   flamegraph.pl, speedscope and Perfetto;
//! - [`flamegraph`]: a flame graph SVG drawn by the `inferno` crate;
//! - [`pprof`]: `profile.proto`, gzip-compressed, read by `go tool pprof`,
//!   speedscope and Perfetto;
//! - [`chrome`]: Chrome Trace Event Format JSON (a timeline of calls per
//!   thread), read by Perfetto UI and speedscope;
//! - [`tau`]: TAU profile directories with call paths, read by ParaProf,
//!   TAU's `pprof` and Hatchet;
//! - [`otf2`]: OTF2 archives (Vampir, Score-P's tools), written through the
//!   system's libotf2, loaded at run time (the one module with unsafe code);
//! - [`output`]: writing any of them atomically, never through a planted link.
#![deny(unsafe_code)]

pub mod chrome;
pub mod flamegraph;
pub mod folded;
pub mod otf2;
pub mod output;
pub mod pprof;
pub mod tau;

use std::borrow::Cow;

/// `name` with `special` (a format's separator or quote) replaced by
/// `instead` and control characters by spaces, so it stays one field.
fn one_field(name: &str, special: char, instead: char) -> Cow<'_, str> {
    if !name.chars().any(|c| c == special || c.is_control()) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| {
                if c == special {
                    instead
                } else if c.is_control() {
                    ' '
                } else {
                    c
                }
            })
            .collect(),
    )
}
