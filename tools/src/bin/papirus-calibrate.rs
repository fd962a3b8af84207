//! `papirus-calibrate`: see `papirus-calibrate --help`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    papirus_substrate::sys::default_sigpipe();
    papirus_tools::calibrate::main_with(|_| {})
}
