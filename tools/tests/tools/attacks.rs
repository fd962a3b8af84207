//! A local user against the root tool, and targets that name hostile files.
//!
//! Each attack is played by uid 65534 (`setpriv`), against `papirus-probe`
//! run as root. Every test asserts the outcome: a root-owned victim file
//! keeps its content, the attacker's own plants are left as they were, and
//! the tool ends within a bound (a hang fails the test, it does not block it).
//! The names planted are every name in the temp directory the tool or its
//! runtime has used: demo directories, session files of the tool and of the
//! runtime (for the pids about to be used), and the output path's neighbours.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const TOOL: &str = env!("CARGO_BIN_EXE_papirus-probe");
const VICTIM_TEXT: &[u8] = b"root's data, not to be changed\n";
/// Pids after the tool's own for which session files are planted.
const FUTURE_PIDS: u32 = 100;

/// Whether this machine lets the test play both sides; prints why not.
fn can_play_attacker() -> bool {
    // /proc/self belongs to the effective uid.
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    if euid != 0 {
        println!("skipped: playing a root tool against uid 65534 needs root (euid {euid})");
        return false;
    }
    match Command::new("setpriv").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        other => {
            println!("skipped: setpriv (util-linux) is needed to act as uid 65534: {other:?}");
            false
        }
    }
}

/// Runs `script` with `sh` as uid and gid 65534, with `args` as `$1`….
fn as_nobody(script: &str, args: &[&OsStr]) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script, "sh"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "as uid 65534: {script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A root-owned file the attacker points links at.
struct Victim {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl Victim {
    fn new() -> Victim {
        let dir = tempfile::Builder::new().prefix("papirus-attack-victim-").tempdir().unwrap();
        let path = dir.path().join("victim");
        std::fs::write(&path, VICTIM_TEXT).unwrap();
        Victim { dir, path }
    }

    fn assert_intact(&self) {
        assert_eq!(std::fs::read(&self.path).unwrap(), VICTIM_TEXT, "the root-owned victim file was changed");
        let md = std::fs::symlink_metadata(&self.path).unwrap();
        assert!(md.is_file() && md.uid() == 0, "the victim was replaced");
        assert_eq!(
            std::fs::read_dir(self.dir.path()).unwrap().count(),
            1,
            "a file appeared beside the victim"
        );
    }
}

/// What the attacker planted, with what each was; checked unchanged, removed on drop.
#[derive(Default)]
struct Plants(Vec<(PathBuf, &'static str)>);

impl Plants {
    fn add(&mut self, path: PathBuf, kind: &'static str) {
        self.0.push((path, kind));
    }

    /// Every plant is still the attacker's and still what it was.
    fn assert_unchanged(&self, victim: &Victim) {
        for (path, kind) in &self.0 {
            let md = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(md.uid(), 65534, "{} changed owner", path.display());
            let now = match md.file_type() {
                t if t.is_symlink() => {
                    assert_eq!(std::fs::read_link(path).unwrap(), victim.path, "{}", path.display());
                    "symlink"
                }
                t if t.is_fifo() => "fifo",
                t if t.is_dir() => "dir",
                _ => "file",
            };
            assert_eq!(now, *kind, "{} was replaced", path.display());
        }
    }
}

impl Drop for Plants {
    fn drop(&mut self) {
        for (path, kind) in self.0.iter().rev() {
            let _ = if *kind == "dir" { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
        }
    }
}

/// Plants, in the temp directory, the session files the tool and its runtime
/// used to read and write, for every pid in `pids`: symlinks to the victim,
/// FIFOs, and runtime sessions that send the report onto the victim.
fn plant_sessions(pids: std::ops::Range<u32>, victim: &Victim, plants: &mut Plants) {
    let tmp = std::env::temp_dir();
    let session = serde_json::json!({
        "format_version": 1, "probe": "wallclock", "functions": ["main"], "events": [],
        "output": victim.path,
    });
    let staged = tempfile::Builder::new().prefix("papirus-attack-stage-").tempdir().unwrap();
    std::fs::set_permissions(staged.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let json = staged.path().join("session.json");
    std::fs::write(&json, session.to_string()).unwrap();
    let mut script = String::from("set -e\n");
    for pid in pids {
        for (i, name) in [
            format!("papirus-probe-session-run-{pid}.json"),
            format!("papirus-probe-session-attach-{pid}.json"),
            format!("papirus-probe-session-{pid}.json"),
        ]
        .into_iter()
        .enumerate()
        {
            let path = tmp.join(name);
            if std::fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            let kind = match (pid + i as u32) % 3 {
                0 => "symlink",
                1 => "fifo",
                _ => "file",
            };
            let p = path.display();
            script += &match kind {
                "symlink" => format!("ln -s '{}' '{p}'\n", victim.path.display()),
                "fifo" => format!("mkfifo '{p}'\n"),
                _ => format!("cp '{}' '{p}'\n", json.display()),
            };
            plants.add(path, kind);
        }
    }
    as_nobody(&script, &[]);
}

/// `papirus-probe ARGS`, started in `cwd` but held before exec: its pid is
/// known before it runs, so names made from it can be planted first.
struct Held(Child);

impl Held {
    fn new(args: &[&OsStr], cwd: &Path) -> Held {
        let child = Command::new("sh")
            .args(["-c", "read _ && exec \"$0\" \"$@\"", TOOL])
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Held(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Lets the tool run; its output, or a failure when it outlives `limit`.
    fn release(mut self, limit: Duration, what: &str) -> Output {
        let mut stdin = self.0.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        bounded(self.0, limit, what)
    }
}

/// Waits for `child` at most `limit`; kills it and fails when it hangs.
fn bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let output = Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() };
            println!("{what}: {status} after {:?}", start.elapsed());
            return output;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still runs after {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this machine has `unshare` for a mount namespace, besides what
/// [`can_play_attacker`] needs; prints why not.
fn can_unshare() -> bool {
    if !can_play_attacker() {
        return false;
    }
    match Command::new("unshare").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        other => {
            println!("skipped: unshare (util-linux) is needed for a mount namespace: {other:?}");
            false
        }
    }
}

/// The arguments of `papirus-probe attach PID --duration 1` then `options`.
fn attach_for_a_second<'a>(pid: &'a str, options: &[&'a str]) -> Vec<&'a OsStr> {
    ["attach", pid, "--duration", "1"].into_iter().chain(options.iter().copied()).map(OsStr::new).collect()
}

/// Attaches for a second from `cwd`: the attach reports `function` or
/// refuses with a clear reason (calling a wrong address is neither), and
/// the target runs on.
fn attach_reports_or_refuses(target: &mut Target, options: &[&str], function: &str, cwd: &Path, what: &str) {
    let pid = target.pid().to_string();
    let out = tool(&attach_for_a_second(&pid, options), cwd, Duration::from_secs(60), what);
    let err = text(&out.stderr);
    std::thread::sleep(Duration::from_millis(200));
    target.assert_running();
    if out.status.success() {
        // The profile is on stderr: the program owns stdout.
        assert!(err.contains(function), "{function} reported: {err}");
    } else {
        assert!(err.contains("refused") || err.contains("not the file"), "a clear refusal: {err}");
    }
}

fn tool(args: &[&OsStr], cwd: &Path, limit: Duration, what: &str) -> Output {
    let child = Command::new(TOOL)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    bounded(child, limit, what)
}

/// Builds the shared target `src` as `dir/out`.
fn gcc(dir: &Path, src: &str, out: &str, extra: &[&str]) -> PathBuf {
    papirus_testkit::Cc::new(crate::util::source(src)).args(extra).build(dir, out)
}

/// A scratch directory others may read and enter (targets run as uid 65534).
fn open_scratch(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A working directory a target of uid 65534 may write its report into.
fn writable_scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("papirus-attack-cwd-").tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// A process killed and reaped on drop; its stdout read line by line.
struct Target {
    child: Child,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Target {
    fn start(mut cmd: Command) -> Target {
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Target { child, lines }
    }

    fn line(&mut self) -> String {
        self.lines.next().expect("the target prints a line").unwrap()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn assert_running(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "the target ended: {:?}", self.child.try_wait());
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory made by the attacker at the demo's old name, holding a FIFO
/// and a symlink to the victim, is not used: the demo builds elsewhere.
#[test]
fn demo_ignores_a_planted_demo_directory() {
    if !can_play_attacker() {
        return;
    }
    let victim = Victim::new();
    let cwd = tempfile::tempdir().unwrap();
    let held = Held::new(&["demo".as_ref(), "-o".as_ref(), "out.json".as_ref()], cwd.path());
    let dir = std::env::temp_dir().join(format!("papirus-probe-demo-{}", held.pid()));
    let mut plants = Plants::default();
    as_nobody(
        "mkdir -m 0777 \"$1\" && mkfifo \"$1/probe_program\" && ln -s \"$2\" \"$1/probe_program.c\"",
        &[dir.as_os_str(), victim.path.as_os_str()],
    );
    plants.add(dir.clone(), "dir");
    plants.add(dir.join("probe_program"), "fifo");
    plants.add(dir.join("probe_program.c"), "symlink");
    let out = held.release(Duration::from_secs(300), "papirus-probe demo");
    let err = text(&out.stderr);
    assert!(out.status.success(), "demo: {err}");
    assert!(!err.contains(&dir.display().to_string()), "the demo used the planted directory: {err}");
    victim.assert_intact();
    plants.assert_unchanged(&victim);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "something was written into the planted directory"
    );
}

/// Session files planted for the pids about to be used (the tool's and its
/// runtime's old names, as symlinks, FIFOs and sessions whose output is the
/// victim) change nothing under `run` and `attach`, and hang nothing.
/// (The runtime reading `papirus-probe-session-<pid>.json` itself was the
/// hole: this passes once the runtime reads no session file.)
#[test]
fn run_and_attach_ignore_planted_session_files() {
    if !can_play_attacker() {
        return;
    }
    let victim = Victim::new();
    let bin = open_scratch("papirus-attack-bin-");
    let program = gcc(bin.path(), "probe_program.c", "probe_program", &["-pthread"]);
    let looping = gcc(bin.path(), "hostile_maps.c", "hostile_maps", &[]);
    let cwd = writable_scratch();
    let mut plants = Plants::default();

    let args: Vec<&OsStr> =
        vec!["run".as_ref(), "-f".as_ref(), "main".as_ref(), "--".as_ref(), program.as_ref()];
    let held = Held::new(&args, cwd.path());
    plant_sessions(held.pid()..held.pid() + FUTURE_PIDS, &victim, &mut plants);
    let out = held.release(Duration::from_secs(60), "papirus-probe run");
    println!("run: {}", text(&out.stderr));
    victim.assert_intact();
    plants.assert_unchanged(&victim);

    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&looping);
    let mut target = Target::start(cmd);
    assert_eq!(target.line(), "ready");
    let pid = target.pid();
    let pid_arg = pid.to_string();
    let held = Held::new(&attach_for_a_second(&pid_arg, &["-f", "work"]), cwd.path());
    plant_sessions(pid..pid + 1, &victim, &mut plants);
    plant_sessions(held.pid()..held.pid() + FUTURE_PIDS, &victim, &mut plants);
    let out = held.release(Duration::from_secs(60), "papirus-probe attach");
    println!("attach: {}", text(&out.stderr));
    victim.assert_intact();
    plants.assert_unchanged(&victim);
    target.assert_running();
}

/// Links and FIFOs beside the output path, in a directory everyone may
/// write (sticky, like /tmp), do not redirect the report.
#[test]
fn output_neighbours_are_not_followed() {
    if !can_play_attacker() {
        return;
    }
    let victim = Victim::new();
    let bin = open_scratch("papirus-attack-bin-");
    let program = gcc(bin.path(), "probe_program.c", "probe_program", &["-pthread"]);
    let shared = tempfile::Builder::new().prefix("papirus-attack-shared-").tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out_path = shared.path().join("out.json");
    let mut plants = Plants::default();
    let mut script = String::from("set -e\n");
    for (name, kind) in [
        ("out.json.tmp", "symlink"),
        ("out.json~", "symlink"),
        (".out.json.swp", "symlink"),
        ("out.json.new", "symlink"),
        (".papirus-", "symlink"),
        ("out.json.part", "fifo"),
        (".out.json", "fifo"),
    ] {
        let p = shared.path().join(name);
        script += &match kind {
            "symlink" => format!("ln -s '{}' '{}'\n", victim.path.display(), p.display()),
            _ => format!("mkfifo '{}'\n", p.display()),
        };
        plants.add(p, kind);
    }
    as_nobody(&script, &[]);
    let cwd = tempfile::tempdir().unwrap();
    let args: Vec<&OsStr> = vec![
        "run".as_ref(),
        "-f".as_ref(),
        "main".as_ref(),
        "-o".as_ref(),
        out_path.as_ref(),
        "--".as_ref(),
        program.as_ref(),
    ];
    let out = tool(&args, cwd.path(), Duration::from_secs(60), "papirus-probe run -o");
    assert!(out.status.success(), "run: {}", text(&out.stderr));
    victim.assert_intact();
    plants.assert_unchanged(&victim);
    let md = std::fs::symlink_metadata(&out_path).unwrap();
    assert!(md.is_file() && md.uid() == 0, "the report is a regular file of root's");
    let extra = std::fs::read_dir(shared.path()).unwrap().count() - plants.0.len() - 1;
    assert_eq!(extra, 0, "no temporary file left beside the report");
}

/// `list FILE` and `report FILE` on a device, a FIFO, a directory and a
/// 3 GiB sparse file: a clear error naming the bound, at once.
#[test]
fn list_and_report_refuse_files_they_cannot_bound() {
    if !can_play_attacker() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (fifo, sparse) = (dir.path().join("fifo"), dir.path().join("sparse"));
    as_nobody(
        "mkfifo \"$1\" && printf '\\177ELF' > \"$2\" && truncate -s 3G \"$2\"",
        &[fifo.as_os_str(), sparse.as_os_str()],
    );
    let cwd = tempfile::tempdir().unwrap();
    for (file, says) in [
        (Path::new("/dev/zero"), "character device, not a regular file"),
        (&fifo, "FIFO, not a regular file"),
        (dir.path(), "directory, not a regular file"),
        (&sparse, "3221225472 bytes, over the"),
    ] {
        for cmd in ["list", "report"] {
            let what = format!("papirus-probe {cmd} {}", file.display());
            let out = tool(&[cmd.as_ref(), file.as_os_str()], cwd.path(), Duration::from_secs(10), &what);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "{what}: {err}");
            assert!(
                err.contains(says) && err.contains("bytes"),
                "{what}: expected `{says}` and the bound: {err}"
            );
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
    }
    // A FIFO named as the program to run: refused, not waited on.
    let out = tool(
        &["run".as_ref(), "--".as_ref(), fifo.as_os_str()],
        cwd.path(),
        Duration::from_secs(10),
        "run FIFO",
    );
    assert_eq!(out.status.code(), Some(126), "run FIFO: {}", text(&out.stderr));
}

/// A target of uid 65534 whose maps name `/dev/zero` and a 3 GiB sparse file
/// (ELF magic first) behind 4 KiB mappings: both are skipped with the
/// reason, and the target is listed and instrumented as usual.
#[test]
fn hostile_mappings_are_skipped_with_a_reason() {
    if !can_play_attacker() {
        return;
    }
    let bin = open_scratch("papirus-attack-bin-");
    let exe = gcc(bin.path(), "hostile_maps.c", "hostile_maps", &[]);
    let files = tempfile::tempdir().unwrap();
    std::fs::set_permissions(files.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let sparse = files.path().join("libhostile.so");
    as_nobody("printf '\\177ELF' > \"$1\" && truncate -s 3G \"$1\"", &[sparse.as_os_str()]);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&exe).arg("/dev/zero").arg(&sparse);
    let mut target = Target::start(cmd);
    assert_eq!(target.line(), "ready");
    let pid = target.pid().to_string();
    let cwd = writable_scratch();

    let out = tool(
        &["list".as_ref(), "--pid".as_ref(), pid.as_ref()],
        cwd.path(),
        Duration::from_secs(10),
        "list --pid",
    );
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "list --pid: {err}");
    assert!(stdout.contains("work"), "the main program is listed: {stdout}");
    assert!(
        err.contains("/dev/zero") && err.contains("character device"),
        "/dev/zero skipped with the reason: {err}"
    );
    assert!(
        err.contains("libhostile.so") && err.contains("3221225472 bytes"),
        "the sparse file skipped: {err}"
    );

    let out =
        tool(&attach_for_a_second(&pid, &["-f", "work"]), cwd.path(), Duration::from_secs(60), "attach");
    assert!(out.status.success(), "attach: {}", text(&out.stderr));
    // The profile is on stderr: the program owns stdout.
    assert!(text(&out.stderr).contains("work"), "work reported: {}", text(&out.stderr));
    target.assert_running();
}

/// A target in another mount namespace, where its library's path holds
/// another build (other functions, other offsets) and where a path that is a
/// FIFO in the tool's view is a regular file: the library the target really
/// loaded is listed and instrumented, its results stay right, nothing hangs.
#[test]
fn another_mount_namespace_is_read_through_the_target() {
    if !can_unshare() {
        return;
    }
    let dir = open_scratch("papirus-attack-ns-");
    let lib_a = gcc(dir.path(), "ns_variant.c", "libvariant.so", &["-shared", "-fPIC", "-DVARIANT=1"]);
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let lib_b =
        gcc(&dir.path().join("b"), "ns_variant.c", "libvariant.so", &["-shared", "-fPIC", "-DVARIANT=2"]);
    let exe = gcc(dir.path(), "ns_target.c", "ns_target", &[]);
    let fifo = dir.path().join("hostile.so");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let regular = dir.path().join("regular.bin");
    let mut bytes = b"\x7fELF".to_vec();
    bytes.resize(4096, 0);
    std::fs::write(&regular, bytes).unwrap();

    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$1\" \"$2\" && mount --bind \"$3\" \"$4\" && exec \"$5\" \"$2\" \"$4\"")
        .arg("sh")
        .args([&lib_b, &lib_a, &regular, &fifo, &exe]);
    let mut target = Target::start(cmd);
    let first = target.line();
    let (addr, variant) = first.split_once(' ').expect("address and variant");
    assert_eq!(variant, "2", "the target loaded the namespace's build");
    let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap();
    assert_eq!(target.line(), "ready");
    let pid = target.pid().to_string();
    let cwd = tempfile::tempdir().unwrap();

    // As root (through /proc/PID/map_files), and without CAP_SYS_ADMIN and
    // CAP_CHECKPOINT_RESTORE (through the target's root, /proc/PID/root).
    for without_caps in [false, true] {
        let mut cmd = Command::new("setpriv");
        if without_caps {
            cmd.arg("--bounding-set=-sys_admin,-checkpoint_restore");
        }
        cmd.args([TOOL, "list", "--json", "--pid", &pid]).current_dir(cwd.path());
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = bounded(child, Duration::from_secs(10), "list --pid (another mount namespace)");
        assert!(out.status.success(), "list (without caps: {without_caps}): {}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let module = v["modules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with("libvariant.so")))
            .expect("the library is listed");
        let names: Vec<&str> =
            module["functions"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
        assert!(
            names.contains(&"b_only_1") && !names.contains(&"a_only"),
            "the namespace's build is read (without caps: {without_caps}): {names:?}"
        );
        let listed =
            module["functions"].as_array().unwrap().iter().find(|f| f["name"] == "variant_fn").unwrap();
        assert_eq!(listed["address"].as_u64(), Some(addr), "variant_fn where the target has it");
    }

    let options = ["-m", "libvariant.so", "-f", "variant_fn"];
    attach_reports_or_refuses(
        &mut target,
        &options,
        "variant_fn",
        cwd.path(),
        "attach (another mount namespace)",
    );
}

/// A target in another mount namespace whose libc path, in the tool's view,
/// holds another file naming `dlopen`, `malloc`, … at other offsets (each a
/// trap): attach must read the libc the target mapped, or refuse; calling
/// an address computed from the wrong file kills the target.
#[test]
fn another_mount_namespace_libc_is_the_targets() {
    if !can_unshare() {
        return;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let real_libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|b| b.starts_with("libc.so")))
        .expect("this test links libc")
        .to_string();
    let dir = open_scratch("papirus-attack-nslibc-");
    let fake =
        gcc(dir.path(), "fake_libc.c", "libc.so.6", &["-shared", "-fPIC", "-nostdlib", "-fno-builtin", "-w"]);
    let exe = gcc(dir.path(), "hostile_maps.c", "hostile_maps", &[]);
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$1\" \"$2\" && LD_LIBRARY_PATH=\"$3\" exec \"$4\"")
        .arg("sh")
        .arg(&real_libc)
        .args([fake.as_os_str(), dir.path().as_os_str(), exe.as_os_str()]);
    let mut target = Target::start(cmd);
    assert_eq!(target.line(), "ready");
    let pid = target.pid().to_string();
    let target_maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(target_maps.contains(&fake.display().to_string()), "the target maps libc at the fake's path");

    let cwd = tempfile::tempdir().unwrap();
    attach_reports_or_refuses(
        &mut target,
        &["-f", "work"],
        "work",
        cwd.path(),
        "attach (libc of another mount namespace)",
    );
}

/// No literal temp-directory path in the non-test source: scratch files go
/// through `tempfile` (private, unpredictable), and nothing else belongs there.
#[test]
fn no_temp_directory_paths_in_the_source() {
    let root = crate::util::workspace();
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                let skip = ["target", "tests", "benches", "examples", ".git"];
                if !skip.iter().any(|s| name == *s) {
                    stack.push(path);
                }
            } else if ft.is_file() && path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                // The unit tests at the end of a file may use scratch paths.
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                for (n, line) in code.lines().enumerate() {
                    if line.contains("\"/tmp") || line.contains("temp_dir()") {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "literal temp-directory paths in non-test source:\n{}", found.join("\n"));
}
