//! What papirus' command-line tools share: the output and exit-status
//! policy every tool follows ([`cli`]), `papirus-calibrate`'s command line
//! ([`calibrate`]), the probe rows and cost predictions that
//! `papirus-probe calibrate` and `--costs` add to it ([`probe_costs`]), and
//! the files other tools open, made from reports and traces ([`export`]).
//!
//! The tools live here, at the top of the workspace, so that no library
//! crate depends on clap and the probe crate does not depend on calibrate.
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod cli;
pub mod export;
pub mod probe_costs;
