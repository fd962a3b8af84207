//! Building and running C programs against papirus' and Debian's libpapi.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use papirus_testkit::{Cc, debian_package};

/// papirus' libpapi.so as cargo built it for this test: beside the test
/// binary in `deps/` (`cargo test` builds the library's cdylib there and
/// copies it up to `target/<profile>/` only for `cargo build`).
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    [deps.join("libpapi.so"), deps.parent().unwrap_or(deps).join("libpapi.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("no libpapi.so in or above {}: the crate's cdylib is built with its tests", deps.display())
        })
}

/// papirus' headers.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// What the C programs need, built once.
#[derive(Debug)]
pub struct Env {
    /// Where the programs are built.
    pub dir: tempfile::TempDir,
    /// A directory with papirus' library as `libpapi.so.7.0` (and `.so`).
    pub papirus_lib: PathBuf,
    /// Whether Debian's libpapi-dev is here (else why not).
    pub debian: Result<(), String>,
}

/// The environment, set up once.
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = library();
        let papirus_lib = dir.path().join("lib");
        std::fs::create_dir(&papirus_lib).unwrap();
        std::os::unix::fs::symlink(&lib, papirus_lib.join("libpapi.so.7.0")).unwrap();
        std::os::unix::fs::symlink(&lib, papirus_lib.join("libpapi.so")).unwrap();
        let debian = debian_package("libpapi-dev", || {
            Path::new("/usr/include/papi.h").exists()
                && Path::new("/usr/lib/x86_64-linux-gnu/libpapi.so.7.0").exists()
        });
        Env { dir, papirus_lib, debian }
    })
}

/// One C test program built both ways.
#[derive(Debug)]
pub struct Program {
    /// Against papirus' papi.h, linked with papirus' libpapi.
    pub papirus: PathBuf,
    /// Against Debian's papi.h and libpapi (None without libpapi-dev).
    pub debian: Option<PathBuf>,
}

const PROGRAMS: [&str; 12] = [
    "eventsets",
    "names",
    "options",
    "components",
    "timers",
    "overflow",
    "profil",
    "threads",
    "forkexec",
    "hl",
    "rates",
    "info",
];

/// Every C program, built once.
pub fn programs() -> &'static BTreeMap<&'static str, Program> {
    static P: OnceLock<BTreeMap<&'static str, Program>> = OnceLock::new();
    P.get_or_init(|| {
        let e = env();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let out = e.dir.path();
        let flags = ["-pthread", "-fopenmp", "-Wall", "-Werror"];
        PROGRAMS
            .iter()
            .map(|&name| {
                let c = src.join(format!("{name}.c"));
                let papirus = Cc::new(&c)
                    .arg(format!("-I{}", include_dir().display()))
                    .args(flags)
                    .arg(format!("-L{}", e.papirus_lib.display()))
                    .arg("-lpapi")
                    .build(out, &format!("{name}.papirus"));
                let debian = e
                    .debian
                    .is_ok()
                    .then(|| Cc::new(&c).args(flags).arg("-lpapi").build(out, &format!("{name}.debian")));
                (name, Program { papirus, debian })
            })
            .collect()
    })
}

/// Which library a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    /// papirus' (LD_LIBRARY_PATH to its libpapi.so.7.0).
    Papirus,
    /// Debian's own.
    Debian,
}

/// Runs `exe` on `lib` with extra environment; the output.
pub fn run(exe: &Path, lib: Lib, envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(exe);
    c.current_dir(env().dir.path()).envs(envs.iter().copied());
    if lib == Lib::Papirus {
        c.env("LD_LIBRARY_PATH", &env().papirus_lib);
    }
    c.output().unwrap_or_else(|e| panic!("run {}: {e}", exe.display()))
}

/// The `kv KEY value` lines a program printed, and `library` (which
/// libpapi it ran on).
pub fn kv(o: &Output) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("kv ").or_else(|| l.starts_with("library ").then_some(l)))
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// Panics with the program's output unless it succeeded.
pub fn assert_ok(what: &str, o: &Output) {
    assert!(
        o.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Asserts that a run used papirus' library.
pub fn assert_on_papirus(what: &str, o: &Output) {
    let lib = kv(o).get("library").cloned().unwrap_or_default();
    let target = library();
    assert!(
        Path::new(lib.trim()) == target || lib.contains(&*env().papirus_lib.to_string_lossy()),
        "{what} ran on {lib}, not papirus' {}",
        target.display()
    );
}
