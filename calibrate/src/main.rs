//! `papirus-calibrate`: see `papirus-calibrate --help`.
#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    papirus_calibrate::cli::main_with(|_| {})
}
