//! What the tool tests share: where the tools and the demo program are, and
//! the `work` program the counting tools measure.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use papirus_testkit::{Built, Cc, target};

/// The demo program papirus-probe builds (`papirus-probe demo`), also a test target.
pub const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/bin/papirus-probe/demo.c");

/// The source of a test target: the demo program, or a shared target of the testkit.
pub fn source(name: &str) -> PathBuf {
    if name == "probe_program.c" { PathBuf::from(DEMO) } else { papirus_testkit::target(name) }
}

/// The workspace's root directory.
pub fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tools/ sits in the workspace")
}

/// Where the viewers the tests open outputs in are installed (kept between
/// runs of this build).
pub fn viewers() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("viewers")
}

/// papirus-probe's executable.
pub fn probe() -> &'static str {
    env!("CARGO_BIN_EXE_papirus-probe")
}

/// `papirus-probe run OPTS -o OUT -- PROGRAM ARGS`, run to its end.
pub fn probe_run<S: AsRef<OsStr>>(out: &Path, opts: &[&str], program: impl IntoIterator<Item = S>) -> Output {
    Command::new(probe()).arg("run").args(opts).arg("-o").arg(out).arg("--").args(program).output().unwrap()
}

/// `papirus-probe attach PID OPTS --duration SECS -o OUT`, run to its end.
pub fn probe_attach(pid: impl std::fmt::Display, opts: &[&str], secs: &str, out: &Path) -> Output {
    Command::new(probe())
        .args(["attach", &pid.to_string()])
        .args(opts)
        .args(["--duration", secs, "-o"])
        .arg(out)
        .output()
        .unwrap()
}

/// A tool of this crate by name.
pub fn tool(name: &str) -> Command {
    let path = match name {
        "papirus-avail" => env!("CARGO_BIN_EXE_papirus-avail"),
        "papirus-native-avail" => env!("CARGO_BIN_EXE_papirus-native-avail"),
        "papirus-stat" => env!("CARGO_BIN_EXE_papirus-stat"),
        "papirus-hwinfo" => env!("CARGO_BIN_EXE_papirus-hwinfo"),
        "papirus-calibrate" => env!("CARGO_BIN_EXE_papirus-calibrate"),
        "papirus-profile" => env!("CARGO_BIN_EXE_papirus-profile"),
        _ => env!("CARGO_BIN_EXE_papirus-probe"),
    };
    Command::new(path)
}

/// The `work` target (`testkit/targets/work.c`), built for one test.
pub fn work() -> Built {
    Cc::new(target("work.c")).built("work")
}

/// Runs a calibration command (`papirus-calibrate`, `papirus-probe
/// calibrate`) with `args`, echoing its output; its success and stdout.
pub fn calibration(mut cmd: Command, args: &[&str]) -> (bool, String) {
    let out = cmd.args(args).output().expect("the calibration runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

/// The cost file at `path` and calibrate's schema validator; the file must match it.
pub fn cost_file(path: &Path) -> (serde_json::Value, jsonschema::Validator) {
    let instance: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let schema = workspace().join("calibrate/schema/costfile.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(schema).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let errors: Vec<String> =
        validator.iter_errors(&instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
    (instance, validator)
}
