//! What papirus' tests share: one way to build a C, C++ or Fortran target,
//! one kind of scratch directory, one way to get a Debian package a test
//! needs, one way to skip, and one way to open outputs in the viewers
//! people use ([`browser`]).
//!
//! A test that cannot run here prints `SKIP: <the reason>` on stderr (the
//! kernel's or the tool's own words) and returns; it never passes silently
//! with nothing checked.
#![forbid(unsafe_code)]

pub mod browser;

use std::ffi::OsStr;
use std::fmt::Display;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

/// Prints why a test does not run here, in the form every test uses.
pub fn skip(reason: impl Display) {
    eprintln!("SKIP: {reason}");
}

/// A private scratch directory (mkdtemp, mode 0700), removed on drop.
pub fn scratch() -> TempDir {
    tempfile::Builder::new()
        .prefix("papirus-test-")
        .tempdir()
        .unwrap_or_else(|e| panic!("a temporary directory: {e}"))
}

/// A private scratch directory the tests of one test binary share (what
/// they build or record once), removed when the binary exits.
pub fn shared_scratch() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    extern "C" fn remove() {
        if let Some(d) = DIR.get() {
            let _ = std::fs::remove_dir_all(d.path());
        }
    }
    DIR.get_or_init(|| {
        papirus_substrate::exit::at_exit(remove).expect("atexit");
        scratch()
    })
    .path()
}

/// A program built into a scratch directory of its own, removed with it.
#[derive(Debug)]
pub struct Built {
    path: PathBuf,
    _dir: TempDir,
}

impl Built {
    /// The program's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for Built {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Built {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<OsStr> for Built {
    fn as_ref(&self) -> &OsStr {
        self.path.as_os_str()
    }
}

/// A C, C++ or Fortran program or shared library built by gcc, g++ or
/// gfortran (by the sources' extensions) for a test.
/// Sources in `testkit/targets` may include `papirus_target.h`, the bodies
/// the targets share.
///
/// ```no_run
/// let exe = papirus_testkit::Cc::new(papirus_testkit::target("probe_loop.c")).arg("-pthread").built("loop");
/// std::process::Command::new(&exe).status().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Cc {
    sources: Vec<PathBuf>,
    args: Vec<String>,
    opt: String,
}

impl Cc {
    /// Builds `source` (a path relative to the crate under test, or
    /// absolute); `.cpp` and `.cc` sources are built with g++.
    pub fn new(source: impl AsRef<Path>) -> Cc {
        Cc { sources: vec![source.as_ref().to_path_buf()], args: Vec::new(), opt: "-O2".into() }
    }

    /// Writes `text` to `dir/name` and builds that.
    pub fn from_text(dir: &Path, name: &str, text: &str) -> Cc {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        Cc::new(path)
    }

    /// Another source file.
    pub fn source(&mut self, source: impl AsRef<Path>) -> &mut Cc {
        self.sources.push(source.as_ref().to_path_buf());
        self
    }

    /// The optimisation level (`-O2` unless set).
    pub fn opt(&mut self, level: &str) -> &mut Cc {
        self.opt = level.into();
        self
    }

    /// One more compiler argument, after the sources (libraries, -pthread, -D…).
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Cc {
        self.args.push(arg.as_ref().to_string_lossy().into_owned());
        self
    }

    /// More compiler arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Cc {
        for a in args {
            self.arg(a);
        }
        self
    }

    /// A shared library (`-shared -fPIC`).
    pub fn shared(&mut self) -> &mut Cc {
        self.args(["-shared", "-fPIC"])
    }

    /// Builds `dir/name` and returns its path; panics with the compiler's
    /// messages when the build fails (a broken target is a broken test).
    pub fn build(&self, dir: &Path, name: &str) -> PathBuf {
        self.try_build(dir, name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Builds `name` into a scratch directory of its own, removed when the
    /// result is dropped.
    pub fn built(&self, name: &str) -> Built {
        let dir = scratch();
        Built { path: self.build(dir.path(), name), _dir: dir }
    }

    /// Builds `dir/name`, or says why not.
    pub fn try_build(&self, dir: &Path, name: &str) -> Result<PathBuf, String> {
        let is = |exts: &[&str]| {
            self.sources
                .iter()
                .any(|s| s.extension().and_then(OsStr::to_str).is_some_and(|e| exts.contains(&e)))
        };
        let compiler = if is(&["f", "F", "f90", "F90"]) {
            "gfortran"
        } else if is(&["cpp", "cc", "cxx"]) {
            "g++"
        } else {
            "gcc"
        };
        let out = dir.join(name);
        let o = Command::new(compiler)
            .arg(&self.opt)
            .arg("-g")
            .arg("-o")
            .arg(&out)
            .args(&self.sources)
            .args(&self.args)
            .output()
            .map_err(|e| format!("cannot run {compiler}: {e}"))?;
        if o.status.success() {
            Ok(out)
        } else {
            Err(format!(
                "{compiler} {:?} {:?} failed: {}",
                self.sources,
                self.args,
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    }
}

/// Makes sure the Debian package `package` is installed, installing it with
/// apt-get when `present` says it is missing; `Err` with apt-get's own words
/// when it cannot be had (no network, not root, not Debian).
///
/// Tests of one run take turns: an advisory lock on `/var/lib/apt` (a
/// root-owned directory, so no file at a name others could plant) keeps
/// two apt-gets of one `cargo test` from failing on dpkg's lock.
pub fn debian_package(package: &str, present: impl Fn() -> bool) -> Result<(), String> {
    if present() {
        return Ok(());
    }
    let lock = std::fs::File::open("/var/lib/apt").map_err(|e| format!("/var/lib/apt: {e} (not Debian?)"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock /var/lib/apt: {e}"))?;
    if present() {
        return Ok(());
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-q", "-y", "-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
    };
    let mut last = String::new();
    for step in [
        &["install", "--no-install-recommends", package][..],
        &["update"],
        &["install", "--no-install-recommends", package],
    ] {
        match apt(step) {
            Ok(o) if o.status.success() => {
                if step[0] == "install" && present() {
                    return Ok(());
                }
            }
            Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => return Err(format!("cannot run apt-get: {e}")),
        }
    }
    Err(format!("apt-get install {package} did not provide it: {last}"))
}

/// Whether `cmd ARGS` runs and succeeds (a tool's presence check).
pub fn runs(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success())
}

/// A symbol as `nm -S` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NmSymbol {
    /// Its name.
    pub name: String,
    /// Its address.
    pub address: u64,
    /// Its size (0 when nm prints none).
    pub size: u64,
    /// nm's type letter (`T`, `t`, `W`, `i`, …).
    pub kind: String,
}

/// The symbols `nm ARGS FILE` prints (give `-S` for sizes); `None`, with the
/// reason printed, where nm cannot run; panics when it fails on the file.
pub fn nm(file: &Path, args: &[&str]) -> Option<Vec<NmSymbol>> {
    let out = match Command::new("nm").args(args).arg(file).output() {
        Ok(o) => o,
        Err(e) => {
            skip(format!("cannot run nm: {e}"));
            return None;
        }
    };
    assert!(out.status.success(), "nm {args:?} {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let symbols = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (address, size, kind, name) = match l.split_whitespace().collect::<Vec<_>>()[..] {
                [a, s, t, n] => (hex(a)?, hex(s)?, t, n),
                [a, t, n] => (hex(a)?, 0, t, n),
                _ => return None,
            };
            Some(NmSymbol { name: name.to_string(), address, size, kind: kind.to_string() })
        })
        .collect();
    Some(symbols)
}

/// The source of a shared test target, `testkit/targets/NAME`.
pub fn target(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("targets").join(name)
}
