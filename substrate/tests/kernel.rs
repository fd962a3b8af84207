//! Integration tests of the substrate against the real kernel of this
//! machine. Each test is an acceptance criterion of issue 2; a test that
//! needs what this machine lacks prints the kernel's reason and returns.
//!
//! Tests take a process-wide lock ([`util::serial`]): timing checks on a
//! shared 2-vCPU VM need quiet, and the descriptor-count check needs no
//! other test opening files at the same time.

#[path = "kernel/breakpoint.rs"]
mod breakpoint;
#[path = "kernel/pmus.rs"]
mod pmus;
#[path = "kernel/software.rs"]
mod software;
#[path = "kernel/util.rs"]
mod util;
