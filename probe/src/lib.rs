//! papirus-probe: find a program's functions, control its process, and
//! patch trampolines into it.
#![deny(unsafe_code)]

pub mod error;
pub mod inventory;
pub mod patch;
pub mod process;
pub mod session;

pub use error::{Error, Result};
