//! What the tool tests share: where the tools and the demo program are, and
//! the `work` program the counting tools measure.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// papirus-probe's executable.
pub fn probe() -> &'static str {
    env!("CARGO_BIN_EXE_papirus-probe")
}

/// A tool of this crate by name.
pub fn tool(name: &str) -> Command {
    let path = match name {
        "papirus-avail" => env!("CARGO_BIN_EXE_papirus-avail"),
        "papirus-native-avail" => env!("CARGO_BIN_EXE_papirus-native-avail"),
        "papirus-stat" => env!("CARGO_BIN_EXE_papirus-stat"),
        "papirus-hwinfo" => env!("CARGO_BIN_EXE_papirus-hwinfo"),
        "papirus-calibrate" => env!("CARGO_BIN_EXE_papirus-calibrate"),
        _ => env!("CARGO_BIN_EXE_papirus-probe"),
    };
    Command::new(path)
}

/// The `work` target (`testkit/targets/work.c`), built for one test.
pub fn work() -> Built {
    Cc::new(target("work.c")).built("work")
}
