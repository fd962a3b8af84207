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
//! - [`output`]: writing any of them atomically, never through a planted link.
#![forbid(unsafe_code)]

pub mod flamegraph;
pub mod folded;
pub mod output;
pub mod pprof;
