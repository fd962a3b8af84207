//! What the tool tests share: where the tools and the demo program are, and
//! the small `work` program the counting tools measure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// A private scratch directory, removed on drop.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("papirus-tools-test-").tempdir().unwrap()
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

const WORK_C: &str = r#"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
/* work PAGES SPIN_MS [wait]: optionally wait for a byte on stdin, touch
   PAGES fresh pages, then burn SPIN_MS of CPU time. */
int main(int argc, char **argv) {
    long pages = atol(argv[1]), ms = atol(argv[2]);
    if (argc > 3) { char c; if (read(0, &c, 1) < 0) return 3; }
    char *p = mmap(0, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 4;
    madvise(p, pages * 4096, MADV_NOHUGEPAGE); /* one fault per 4 KiB page */
    for (long i = 0; i < pages; i++) p[i * 4096] = 1;
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    volatile unsigned long x = 0;
    do {
        for (int i = 0; i < 100000; i++) x += i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
    return 0;
}
"#;

/// The `work` test program, built once with gcc.
pub fn work() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tools-work");
        std::fs::create_dir_all(&dir).unwrap();
        papirus_testkit::Cc::from_text(&dir, "work.c", WORK_C).build(&dir, "work")
    })
    .clone()
}
