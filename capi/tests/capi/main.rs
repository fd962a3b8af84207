//! papirus' libpapi against PAPI 7.0 as Debian ships it: the ABI (struct
//! layouts, every shared `#define`, the exported symbols), C programs of
//! the project's own per area run both ways (papirus' header and library;
//! Debian's header and binaries on papirus' library) and on Debian's real
//! PAPI, the high-level output read by PAPI's own writer, and Fortran.
//!
//! The C programs are built once per test binary.

mod common;

mod abi;
mod fortran;
mod highlevel;
mod programs;
mod tools;
