//! papirus-lowlevel: PAPI's low-level API in idiomatic Rust.
#![deny(unsafe_code)]

pub mod derived;
pub mod error;
pub mod preset;

pub use error::{Code, Error, Result, SetOp};
