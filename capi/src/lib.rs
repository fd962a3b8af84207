//! papirus-capi: PAPI 7.0's C and Fortran interface on papirus.
//!
//! `cargo build --release` leaves `target/release/libpapi.so` (SONAME
//! `libpapi.so.7.0`, the name binaries built against PAPI 7.0 ask for),
//! `target/release/libpapi.a` and `target/release/papi.pc`; the headers are
//! in `capi/include/` (`papi.h`, `papiStdEventDefs.h`, `fpapi.h`,
//! `f90papi.h`). The exported functions are PAPI's, plain and unversioned,
//! with PAPI 7.0's signatures, constants and struct layouts ([`types`]
//! asserts every size and offset at compile time).
//!
//! Everything is built on papirus' crates: event sets, presets, native
//! events, overflow and profil on `papirus-lowlevel`; regions and rates on
//! `papirus-highlevel`; clocks and hardware facts on `papirus-substrate`.
//! This crate adds what C callers need: integer handles, PAPI's rules
//! where they differ from the Rust API (binding a set to a component,
//! destroying only empty sets, accum on stopped sets), C structs, and
//! PAPI's high-level output format.
//!
//! # Safety
//!
//! `unsafe` lives in three modules only: [`raw`] (every dereference of a
//! pointer a C caller passed, and every call of a C function pointer, each
//! block with a `// SAFETY:` comment), and the two modules of exported
//! symbols, [`exports`] and [`fortran`], whose `#[unsafe(no_mangle)]`
//! functions build `raw`'s checked wrappers from their arguments citing
//! PAPI's contract. Every exported function runs behind one panic boundary
//! ([`boundary`]): a panic becomes `PAPI_EBUG`, never an unwind into C or
//! an abort; misuse returns PAPI's error code. Handles are checked (a
//! wrong one is `PAPI_ENOEVST`).
#![deny(unsafe_code)]

pub mod boundary;
pub mod events;
pub mod exports;
pub mod fortran;
pub mod hl;
pub mod info;
pub mod options;
pub mod raw;
pub mod sets;
pub mod state;
pub mod types;

pub use papirus_lowlevel::Code;
