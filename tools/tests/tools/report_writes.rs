//! `papirus-probe run -o FILE` where FILE cannot be written, on real mounts
//! (root only): a full 64 KiB tmpfs and a read-only one. The previous report
//! stays byte for byte, no temporary file is left beside it, and a directory
//! that takes no file is refused before the program is started.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Instrumented functions of the target: a report of several hundred KiB.
const FUNCTIONS: usize = 400;

/// A tmpfs mounted on a private directory, unmounted on drop (a failed
/// assertion included) before the directory is removed.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes, or says why it cannot be (not root, no
    /// CAP_SYS_ADMIN in this container).
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
        if euid != 0 {
            return Err(format!("mounting a tmpfs needs root (euid {euid})"));
        }
        let dir = papirus_testkit::scratch();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "papirus-test"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !o.status.success() {
            return Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) {
        let ok =
            Command::new("mount").args(["-o", "remount,ro"]).arg(self.path()).status().unwrap().success();
        assert!(ok, "remounting {} read-only", self.path().display());
    }

    /// The names in the mount, sorted.
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}

/// `many MARKER`: creates MARKER on start, then calls each of its
/// [`FUNCTIONS`] functions once.
fn target() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut c = String::from("#include <stdio.h>\nvolatile long sink;\n");
        for i in 0..FUNCTIONS {
            let _ = writeln!(c, "__attribute__((noinline)) void fn_{i:04}(void) {{ sink += {i}; }}");
        }
        c.push_str("int main(int argc, char **argv) {\n    FILE *m = fopen(argv[1], \"w\");\n    if (!m) return 3;\n    fclose(m);\n");
        for i in 0..FUNCTIONS {
            let _ = writeln!(c, "    fn_{i:04}();");
        }
        c.push_str("    return 0;\n}\n");
        let dir = papirus_testkit::shared_scratch();
        papirus_testkit::Cc::from_text(dir, "many.c", &c).build(dir, "many")
    })
    .clone()
}

/// `papirus-probe run [opts] -o out -- many marker`.
fn run(opts: &[&str], out: &Path, marker: &Path) -> Output {
    crate::util::probe_run(out, opts, [target().as_os_str(), marker.as_os_str()])
}

/// A 64 KiB tmpfs holding a previous report (of a run of the same target,
/// its first functions instrumented, written by papirus-probe itself), and a
/// scratch directory for the target's marker.
struct Case {
    fs: Tmpfs,
    scratch: tempfile::TempDir,
    out: PathBuf,
    previous: Vec<u8>,
}

impl Case {
    /// `None` (the reason printed) where no tmpfs can be mounted.
    fn new() -> Option<Case> {
        let fs = match Tmpfs::mount("64k") {
            Ok(fs) => fs,
            Err(reason) => {
                papirus_testkit::skip(reason);
                return None;
            }
        };
        let scratch = papirus_testkit::scratch();
        let out = fs.path().join("report.json");
        let o = run(&["--functions", "fn_000?"], &out, &scratch.path().join("first-run"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let previous = std::fs::read(&out).unwrap();
        Some(Case { fs, scratch, out, previous })
    }

    /// Runs the whole target with `-o` at the previous report: the output,
    /// and whether the target was started.
    fn run_all(&self) -> (Output, bool) {
        let marker = self.scratch.path().join("ran");
        let o = run(&[], &self.out, &marker);
        (o, marker.exists())
    }

    /// The previous report is as it was and alone in its directory.
    fn assert_kept(&self) {
        assert_eq!(std::fs::read(&self.out).unwrap(), self.previous, "the previous report changed");
        assert_eq!(self.fs.names(), ["report.json"], "no temporary file stays beside the report");
    }
}

#[test]
fn a_full_filesystem_keeps_the_previous_report() {
    let Some(case) = Case::new() else { return };
    let (o, ran) = case.run_all();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(ran, "the program ran: the failure is the report's write\n{stderr}");
    assert_eq!(o.status.code(), Some(125), "papirus-probe's own failure\n{stderr}");
    let said = format!("papirus-probe: error: cannot write {}: No space left on device", case.out.display());
    assert!(stderr.contains(&said), "expected «{said}» in:\n{stderr}");
    case.assert_kept();
}

#[test]
fn a_read_only_directory_is_refused_before_the_program_starts() {
    let Some(case) = Case::new() else { return };
    case.fs.remount_read_only();
    let (o, ran) = case.run_all();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!ran, "the program was started although its report could not be written\n{stderr}");
    assert!(!stderr.contains("instrumented"), "nothing was patched\n{stderr}");
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    let said = format!(
        "papirus-probe: error: cannot write {}: its directory {} does not take new files: Read-only file system (os error 30)\n",
        case.out.display(),
        case.fs.path().display()
    );
    assert!(stderr.contains(&said), "expected «{said}» in:\n{stderr}");
    case.assert_kept();
}
