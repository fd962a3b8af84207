//! papirus-dyninst: find a program's functions, control its process, and
//! patch trampolines into it.
#![deny(unsafe_code)]

pub mod error;
pub mod inventory;
pub mod output;
pub mod patch;
pub mod probe;
pub mod process;

pub use error::{Error, Result};
