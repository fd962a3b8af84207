//! What every papirus command-line tool does around its own work.

use std::fmt::Display;
use std::process::ExitCode;

/// Runs the work of the tool `name`: SIGPIPE back to its default action
/// first (a closed pipe ends the tool quietly), then `work`, whose error is
/// printed as `name: error` on stderr and ends the tool with status 2.
pub fn run_tool<E: Display>(name: &str, work: impl FnOnce() -> Result<ExitCode, E>) -> ExitCode {
    papirus_substrate::sys::default_sigpipe();
    work().unwrap_or_else(|e| {
        eprintln!("{name}: {e}");
        ExitCode::from(2)
    })
}
