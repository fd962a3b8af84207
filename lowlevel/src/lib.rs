//! papirus-lowlevel: PAPI's low-level API in idiomatic Rust.
#![deny(unsafe_code)]

pub mod derived;
pub mod error;
pub mod overflow;
pub mod preset;
pub mod profil;

pub use error::{Code, Error, Result, SetOp};
