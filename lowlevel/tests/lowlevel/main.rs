//! Integration tests of papirus-lowlevel against the real kernel: one
//! binary, one module per topic. Every test holds [`util::serial`]: the
//! descriptor counts are process-wide, and the CPU-time workloads are
//! steadier one at a time on a 2-CPU VM.

mod util;

mod bad_input;
mod fastread;
mod overflow;
mod processes;
mod threads;
