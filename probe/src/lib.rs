//! papirus-probe: find a program's functions, control its process, and
//! patch trampolines into it. Unsafe code lives in `process::sys` (raw
//! system calls of process control), `patch::space` (mapping code near a
//! function in this process), `session::results` (the read-only mapping of
//! a target's results segment) and `session::cost` (a library it built,
//! loaded into this process and called); the rest is safe Rust.
#![deny(unsafe_code)]

pub mod error;
pub mod inventory;
pub mod patch;
pub mod process;
pub mod session;

pub use error::{Error, Result};
