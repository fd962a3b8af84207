//! Integration tests of papirus-lowlevel against the real kernel: one
//! binary, one module per topic. Tests that open descriptors hold
//! [`util::serial`] so the descriptor-count test sees only its own.

mod util;

mod bad_input;
mod fastread;
mod processes;
mod threads;
