//! Integration tests of the substrate against the real kernel of this
//! machine: one binary, one module per topic. A test that needs what this
//! machine lacks prints the kernel's reason and returns.
//!
//! Every test holds [`util::serial`] (or, beside others of its kind,
//! [`util::shared`]): timing checks on a shared 2-vCPU VM need quiet, and
//! descriptor-count checks need no other test opening files meanwhile.

mod util;

mod clocks;
mod kernel;
mod names;
mod sampling;
