//! What every papirus command-line tool does around its own work.
//!
//! Output policy, the same in every tool: what a tool prints is written to
//! stdout in one piece at the end, and a failed write (a full disk, a closed
//! descriptor) ends the tool with `name: cannot write to standard output: …`
//! and status 2. A reader that goes away (`| head -1`) ends the tool
//! quietly by SIGPIPE, as perf and the C tools end.

use std::fmt::Display;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

/// Why a tool failed: the message printed after its name.
#[derive(Debug)]
pub struct Failure(pub String);

impl Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<papirus_lowlevel::Error> for Failure {
    fn from(e: papirus_lowlevel::Error) -> Self {
        Failure(e.to_string())
    }
}

/// Runs the work of the tool `name`: SIGPIPE back to its default action
/// first (a closed pipe ends the tool quietly), then `work`, whose error is
/// printed as `name: error` on stderr and ends the tool with status 2.
///
/// A closed stdout is refused before any work: Rust's stdout drops writes to
/// a closed descriptor silently, and the first file the tool opened would
/// take descriptor 1 and receive what was meant for stdout.
pub fn run_tool<E: Display>(name: &str, work: impl FnOnce() -> Result<ExitCode, E>) -> ExitCode {
    papirus_substrate::sys::default_sigpipe();
    if !stdout_is_open() {
        let _ =
            writeln!(std::io::stderr(), "{name}: standard output is closed; redirect it (e.g. >/dev/null)");
        return ExitCode::from(2);
    }
    work().unwrap_or_else(|e| {
        // stderr may be closed as well; nothing is left to report to then.
        let _ = writeln!(std::io::stderr(), "{name}: {e}");
        ExitCode::from(2)
    })
}

/// [`run_tool`] for a tool that parses its command line `A` and writes what
/// it prints into a string, printed in one piece at the end.
pub fn run_printing<A: clap::Parser, E>(
    name: &str,
    run: impl FnOnce(&A, &mut String) -> Result<ExitCode, E>,
) -> ExitCode
where
    Failure: From<E>,
{
    run_tool(name, || {
        let args = A::parse();
        let mut w = String::new();
        let code = run(&args, &mut w)?;
        print(&w)?;
        Ok::<_, Failure>(code)
    })
}

/// Mounts tracefs where it is mounted nowhere, as perf does; where that is
/// not permitted, says why and how on stderr (`name: why` and `then`, what
/// the tool does without it), and tracepoint names fail with the parser's reason.
pub fn mount_tracefs(name: &str, then: &str) {
    if let Err(why) = papirus_substrate::names::ensure_tracefs() {
        let _ = writeln!(std::io::stderr(), "{name}: {why}{then}");
    }
}

/// Whether stdout was open when the tool started (Rust's runtime reopens a
/// closed one on /dev/null before `main`; see [`papirus_substrate::stdio`]).
pub fn stdout_is_open() -> bool {
    !papirus_substrate::stdio::closed_at_start(1)
}

/// Writes `text` to stdout and flushes it; a write error becomes a [`Failure`].
pub fn print(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure(format!("cannot write to standard output: {e}")))
}

/// `writeln!` into a `String` a tool prints with [`print`] at its end.
#[macro_export]
macro_rules! outln {
    ($w:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing into a String cannot fail.
        let _ = writeln!($w, $($arg)*);
    }};
}

/// `write!` into a `String` a tool prints with [`print`] at its end.
#[macro_export]
macro_rules! out {
    ($w:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing into a String cannot fail.
        let _ = write!($w, $($arg)*);
    }};
}

/// Parses a number of seconds for a duration option: finite, positive and
/// within what [`Duration`] holds (`0.5`, `2`, `1e-3`; not `nan`, `inf`,
/// `-1`, `0` or `1e30`).
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("`{s}`: give a finite, positive number of seconds"));
    }
    let d = Duration::try_from_secs_f64(v).map_err(|_| format!("`{s}` seconds is too long a duration"))?;
    if d.is_zero() {
        return Err(format!("`{s}` seconds rounds to zero; give at least 1e-9"));
    }
    Ok(d)
}

/// Parses a number of milliseconds (`-I 100`) with the rules of [`parse_seconds`].
pub fn parse_millis(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of milliseconds"))?;
    parse_seconds(&(v / 1e3).to_string())
        .map_err(|_| format!("`{s}`: give a finite, positive number of milliseconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_finite_positive_and_in_range() {
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_seconds(" 2 "), Ok(Duration::from_secs(2)));
        for bad in ["nan", "inf", "-inf", "-1", "0", "1e30", "1e-12", "", "x"] {
            assert!(parse_seconds(bad).is_err(), "`{bad}` is refused");
        }
        assert_eq!(parse_millis("100"), Ok(Duration::from_millis(100)));
        assert!(parse_millis("nan").is_err() && parse_millis("0").is_err() && parse_millis("1e30").is_err());
    }
}
