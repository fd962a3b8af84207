//! Integration tests of papirus-probe's library against the real kernel:
//! process control on targets it starts and attaches to, and in-process
//! trampolines on libraries built by the tests. One binary, one module per
//! topic; tests that drive the `papirus-probe` tool live with the tools.

mod process;
mod trampoline;
