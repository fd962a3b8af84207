//! The patcher on the entries it used to get wrong or refuse: functions that
//! take their own address RIP-relatively (CPython's `subtype_traverse`),
//! functions of 2, 3 and 4 bytes, and IFUNCs, each through `papirus-probe
//! run` on a program built here or a Python of this machine, compared with
//! the uninstrumented run and with kernel uprobe counts.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use papirus_probe_abi as rt;
use papirus_substrate::{Counter, Target as CountTarget, parse_event};
use papirus_testkit::{Cc, skip, target};

use crate::util::{probe_attach, probe_run};

fn build(dir: &Path, src: &str, extra: &[&str]) -> PathBuf {
    let name = src.strip_suffix(".c").unwrap_or(src);
    Cc::new(target(src)).args(extra).build(dir, name)
}

fn report(path: &Path) -> rt::Report {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Calls of `name` summed over threads.
fn calls(r: &rt::Report, name: &str) -> u64 {
    let id = r.id(name).unwrap_or_else(|| panic!("{name} not in the session"));
    r.threads.iter().flat_map(|t| &t.functions).filter(|f| f.id == id).map(|f| f.figures.calls).sum()
}

/// Where `at` names a place in `path`: a symbol, or `+0x…` a link-time address.
#[derive(Clone, Copy)]
enum At<'a> {
    Symbol(&'a str),
    Address(u64),
}

/// A counting uprobe at `at` of the file `path` in process `pid`, enabled when it execs.
fn uprobe(path: &Path, at: At, pid: i32) -> Result<Counter, papirus_substrate::Error> {
    let place = match at {
        At::Symbol(symbol) => symbol.to_string(),
        At::Address(a) => format!("{a:#x}"),
    };
    let mut attr = parse_event(&format!("uprobe:{}:{place}", path.display()))?;
    attr.enable_on_exec(true);
    attr.open(CountTarget::Task(pid))
}

/// Kernel uprobe counts at `places` of `file` over one plain run of `program`, or the kernel's reason.
fn uprobe_counts(
    program: &Path,
    args: &[&str],
    file: &Path,
    places: &[At],
) -> Result<Vec<u64>, papirus_substrate::Error> {
    // A shell that stops itself, then execs the program: the counters exist
    // before the program's first instruction and count from its exec on.
    let mut child = Command::new("sh")
        .args(["-c", "kill -STOP $$; exec \"$0\" \"$@\""])
        .arg(program)
        .args(args)
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    assert!(matches!(waitpid(pid, Some(WaitPidFlag::WUNTRACED)), Ok(WaitStatus::Stopped(..))));
    let counters = places.iter().map(|&at| uprobe(file, at, pid.as_raw())).collect::<Result<Vec<_>, _>>();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(child.wait().unwrap().success());
    counters?.iter().map(|c| Ok(c.read()?.raw)).collect()
}

/// Asserts papirus' count of each of `names` in `r` equals a kernel
/// uprobe's at its place in `file` over a plain run of `program args`; says
/// why where uprobes cannot be had.
fn assert_uprobes_agree(
    r: &rt::Report,
    names: &[impl AsRef<str>],
    places: &[At],
    program: &Path,
    args: &[&str],
    file: &Path,
) {
    match uprobe_counts(program, args, file, places) {
        Ok(counts) => {
            for (name, count) in names.iter().map(AsRef::as_ref).zip(counts) {
                assert_eq!(calls(r, name), count, "{name}: papirus and a kernel uprobe");
            }
        }
        Err(e) => skip(format!("uprobe counts not taken: {e}")),
    }
}

/// This machine's libc, or `None` with the reason printed.
fn libc() -> Option<&'static Path> {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let found = libc.exists();
    if !found {
        skip(format!("{}: not on this machine", libc.display()));
    }
    found.then_some(libc)
}

/// The names `wanted` IFUNCs take in `r` (`strlen -> libc.so.6+0x…`, for the
/// implementation the process calls), each called at least `min` times, and
/// the link-time addresses of those implementations in libc.
fn implementations(
    r: &rt::Report,
    wanted: &[&str],
    min: u64,
    stderr: &str,
) -> (Vec<String>, Vec<At<'static>>) {
    let names: Vec<String> = wanted
        .iter()
        .map(|w| {
            let prefix = format!("{w} -> libc.so.6+0x");
            r.functions
                .iter()
                .find(|f| f.starts_with(&prefix))
                .cloned()
                .unwrap_or_else(|| panic!("{w}: {stderr}"))
        })
        .collect();
    for n in &names {
        assert!(calls(r, n) >= min, "{n}: {} calls", calls(r, n));
    }
    let places = names
        .iter()
        .map(|f| At::Address(u64::from_str_radix(f.rsplit_once("+0x").unwrap().1, 16).unwrap()))
        .collect();
    (names, places)
}

#[test]
fn own_address_and_short_functions_compute_the_same_and_count_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_short.c", &[]);
    let exe = program.to_str().unwrap();
    let n = 1000u64;
    let plain = Command::new(&program).arg(n.to_string()).output().unwrap();
    assert!(plain.status.success(), "the plain run computes its own addresses right");
    let out = dir.path().join("r.json");
    let probed = probe_run(&out, &["-f", "short*,self*,is_self,enter*"], [exe, &n.to_string()]);
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success(), "instrumented run: {stderr}");
    assert!(stderr.contains("refused 0"), "{stderr}");
    // Another function jumps to entered_at_3+3: a 2-byte hop, by run and by list alike.
    assert!(!stderr.contains("refused entered_at_3"), "{stderr}");
    let list = Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
        .args(["list", exe, "--patchable", "-f", "entered_at_3"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("yes (2 insn, 3 bytes, 2-byte hop)"), "{list:?}");
    let stdout = String::from_utf8_lossy(&probed.stdout);
    assert!(stdout.starts_with(&*String::from_utf8_lossy(&plain.stdout)), "{stdout}");
    let r = report(&out);
    let shorts = ["short2", "short3", "short4"];
    for s in shorts {
        assert_eq!(calls(&r, s), n, "{s}");
    }
    assert_eq!(calls(&r, "self_addr"), n);
    assert_eq!(calls(&r, "is_self"), 2 * n);
    assert_eq!(calls(&r, "self_after_branch"), 2 * n);
    assert_eq!(calls(&r, "enters_other"), n);
    // Entered at +3 by enters_other's jump, which the count must not include.
    assert_eq!(calls(&r, "entered_at_3"), n);
    let shorts = ["short2", "short3", "short4", "entered_at_3"];
    assert_uprobes_agree(&r, &shorts, &shorts.map(At::Symbol), &program, &[&n.to_string()], &program);
}

const GC_SCRIPT: &str = "
import gc
class A:
    def __init__(s, o): s.o = o
class B(A): pass
xs = []
for i in range(3000):
    a = B(None); b = B(a); a.o = b; xs.append(a)
del xs
print('collected', gc.collect())
d = {str(i): [i] * 3 for i in range(500)}
print(sum(len(v) for v in d.values()), sorted(d)[:3])
";

/// Every function of a pyenv libpython instrumented: `gc.collect()` over
/// instances of a Python subclass finishes and prints what it prints plain.
#[test]
fn python_gc_over_subclass_instances_finishes_with_all_of_libpython_instrumented() {
    let mut ran = 0;
    for v in ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        let minor = v.rsplit_once('.').unwrap().0;
        let root = PathBuf::from("/root/.pyenv/versions").join(v);
        let python = root.join("bin").join(format!("python{minor}"));
        let lib = format!("libpython{minor}.so.1.0");
        if !python.exists() || !root.join("lib").join(&lib).exists() {
            eprintln!("{} or its {lib}: not on this machine", python.display());
            continue;
        }
        let plain = Command::new(&python).args(["-c", GC_SCRIPT]).output().unwrap();
        assert!(plain.status.success());
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let probed = probe_run(&out, &["--module", &lib], [python.to_str().unwrap(), "-c", GC_SCRIPT]);
        let stderr = String::from_utf8_lossy(&probed.stderr);
        assert!(probed.status.success(), "{v}: {stderr}");
        let stdout = String::from_utf8_lossy(&probed.stdout);
        let plain = String::from_utf8_lossy(&plain.stdout);
        assert!(stdout.starts_with(&*plain), "{v}: output changed:\n{stdout}\nvs\n{plain}");
        let r = report(&out);
        assert!(calls(&r, "subtype_traverse") > 0, "{v}: subtype_traverse ran instrumented");
        ran += 1;
    }
    if ran == 0 {
        papirus_testkit::skip("no pyenv Python with a shared libpython here: nothing run");
    }
}

/// Every function of libsqlite3, then of libc, under the sqlite3 shell: the
/// same output, and no refusal for length.
#[test]
fn sqlite_and_libc_fully_instrumented_compute_the_same() {
    let sqlite = match papirus_testkit::debian_package("sqlite3", || which("sqlite3").is_ok())
        .and_then(|()| which("sqlite3"))
    {
        Ok(s) => s,
        Err(e) => return papirus_testkit::skip(format!("sqlite3: {e}")),
    };
    let sql = "create table t(a,b); with recursive c(x) as (select 1 union all select x+1 from c where x<3000) \
               insert into t select x, x*x from c; select count(*), sum(b), max(a) from t where a%7=3;";
    let plain = Command::new(&sqlite).args([":memory:", sql]).output().unwrap();
    assert!(plain.status.success());
    for module in ["libsqlite3.so.0", "libc.so.6"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let probed = probe_run(&out, &["--module", module], [sqlite.to_str().unwrap(), ":memory:", sql]);
        let stderr = String::from_utf8_lossy(&probed.stderr);
        assert!(probed.status.success(), "{module}: {stderr}");
        let stdout = String::from_utf8_lossy(&probed.stdout);
        assert!(stdout.starts_with(&*String::from_utf8_lossy(&plain.stdout)), "{module}: {stdout}");
        assert!(!stderr.contains("shorter than"), "{module}: {stderr}");
    }
}

fn which(name: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").ok_or("no PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(format!("{name} not found"))
}

/// `-m libc.so.6 -f strlen,memcpy`: the IFUNCs stand for the implementations
/// this process calls, named after them, each counted exactly as a kernel
/// uprobe at the same address counts (memcpy's, which mempcpy enters at +3,
/// through a 2-byte hop).
#[test]
fn ifuncs_are_instrumented_at_the_implementation_the_process_calls() {
    let Some(libc) = libc() else { return };
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_ifunc.c", &["-fno-builtin"]);
    let n = "1000";
    let out = dir.path().join("r.json");
    let probed = probe_run(&out, &["-m", "libc.so.6", "-f", "strlen,memcpy"], [program.to_str().unwrap(), n]);
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success(), "{stderr}");
    let r = report(&out);
    let (impls, places) = implementations(&r, &["strlen", "memcpy"], 1000, &stderr);
    assert_uprobes_agree(&r, &impls, &places, &program, &[n], libc);
}

/// memcpy, memmove and mempcpy (which enters memmove's implementation at
/// +3) over every size class: `-f memcpy,mempcpy` and `-f memmove`
/// instrument the implementations the process calls, the program prints
/// what it prints plain, and each count equals a kernel uprobe's at that
/// address (calls entering at +3 are no calls of memmove).
#[test]
fn memcpy_and_memmove_count_exactly_through_a_hop() {
    let Some(libc) = libc() else { return };
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_memmove.c", &["-fno-builtin"]);
    let n = "3000";
    let plain = Command::new(&program).arg(n).output().unwrap();
    assert!(plain.status.success());
    for (sel, wanted) in [("memcpy,mempcpy", &["memcpy", "mempcpy"][..]), ("memmove", &["memmove"][..])] {
        let out = dir.path().join("r.json");
        let probed = probe_run(&out, &["-m", "libc.so.6", "-f", sel], [program.to_str().unwrap(), n]);
        let stderr = String::from_utf8_lossy(&probed.stderr);
        assert!(probed.status.success(), "{sel}: {stderr}");
        assert_eq!(probed.stdout, plain.stdout, "{sel}: output changed");
        assert!(!stderr.contains("papirus-probe: refused"), "{sel}: {stderr}");
        let r = report(&out);
        // memcpy and memmove each 3000 times, and both are one implementation in glibc.
        let (impls, places) = implementations(&r, wanted, 3000, &stderr);
        assert_uprobes_agree(&r, &impls, &places, &program, &[n], libc);
    }
}

/// A function whose own loop returns to +2 and too long to move whole: its
/// entry takes a 2-byte hop (by `list --patchable` and `run` alike), the
/// program prints what it prints plain, and the count equals a kernel
/// uprobe's (the loop's passes through +2 are no calls).
#[test]
fn a_loop_back_to_plus_2_takes_a_hop_and_counts_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_loop_hop.c", &[]);
    let exe = program.to_str().unwrap();
    let n = 1000u64;
    let list = Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
        .args(["list", exe, "--patchable", "-f", "loops_to_2"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("yes (1 insn, 2 bytes, 2-byte hop)"), "{list:?}");
    let plain = Command::new(&program).arg(n.to_string()).output().unwrap();
    assert!(plain.status.success());
    let out = dir.path().join("r.json");
    let probed = probe_run(&out, &["-f", "loops_to_2"], [exe, &n.to_string()]);
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success() && stderr.contains("refused 0"), "{stderr}");
    assert_eq!(probed.stdout, plain.stdout, "output changed");
    let r = report(&out);
    assert_eq!(calls(&r, "loops_to_2"), n);
    assert_uprobes_agree(
        &r,
        &["loops_to_2"],
        &[At::Symbol("loops_to_2")],
        &program,
        &[&n.to_string()],
        &program,
    );
}

/// IFUNCs the program imports lazily (`-z lazy`: their GOT slots are not
/// bound when `run` selects them) and libc never calls itself: each stands
/// for the implementation its resolver picks on this machine, found without
/// running it, and counted exactly as a kernel uprobe there counts.
#[test]
fn lazily_bound_ifuncs_resolve_to_what_the_process_calls() {
    let Some(libc) = libc() else { return };
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_lazy_ifunc.c", &["-fno-builtin", "-Wl,-z,lazy"]);
    let n = "1000";
    let plain = Command::new(&program).arg(n).output().unwrap();
    assert!(plain.status.success());
    let out = dir.path().join("r.json");
    let probed =
        probe_run(&out, &["-m", "libc.so.6", "-f", "strstr,strncat"], [program.to_str().unwrap(), n]);
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success() && !stderr.contains("papirus-probe: refused"), "{stderr}");
    assert_eq!(probed.stdout, plain.stdout, "output changed");
    let r = report(&out);
    let (impls, places) = implementations(&r, &["strstr", "strncat"], 1000, &stderr);
    assert_uprobes_agree(&r, &impls, &places, &program, &[n], libc);
}

/// `attach -f memcpy,mempcpy` to a program copying in a loop: memcpy's
/// implementation takes its hop while the program runs, and after detach
/// the code around it is byte for byte the file's and the program computes
/// what a plain run of as many rounds computes.
#[test]
fn attach_hops_into_memcpy_and_detach_restores_its_bytes() {
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::fs::FileExt;
    use std::process::Stdio;
    let Some(libc) = libc() else { return };
    let dir = tempfile::tempdir().unwrap();
    let program = build(dir.path(), "patcher_memmove.c", &["-fno-builtin"]);
    let mut child = Command::new(&program)
        .arg("until-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut ready).unwrap();
    assert_eq!(ready, "ready\n");
    let pid = child.id();
    let out = dir.path().join("r.json");
    let probed = probe_attach(pid, &["-m", "libc.so.6", "-f", "memcpy,mempcpy"], "1", &out);
    let stderr = String::from_utf8_lossy(&probed.stderr);
    assert!(probed.status.success() && !stderr.contains("papirus-probe: refused"), "{stderr}");
    let r = report(&out);
    let memcpy = r.functions.iter().find(|f| f.starts_with("memcpy -> libc.so.6+0x")).expect("memcpy");
    assert!(calls(&r, memcpy) > 0, "{memcpy} called while attached");
    // The 256 bytes either side of the implementation: the file's again.
    let link = u64::from_str_radix(memcpy.rsplit_once("+0x").unwrap().1, 16).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let base = maps
        .lines()
        .find(|l| l.ends_with("/libc.so.6") && l.split_whitespace().nth(2) == Some("00000000"))
        .map(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap())
        .expect("libc mapped at offset 0");
    let elf = papirus_substrate::elf::ElfFile::open(libc).unwrap();
    let file = elf.bytes_at(link - 256, 512).unwrap();
    let mut mem = vec![0; 512];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut mem, base + link - 256)
        .unwrap();
    assert!(mem == file, "the code around {memcpy} differs from the file's after detach");
    drop(child.stdin.take());
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    assert!(child.wait().unwrap().success());
    let (rounds, sum) = text.split_once('\n').unwrap();
    let plain = Command::new(&program).arg(rounds).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&plain.stdout), sum, "{rounds} rounds");
}

/// One refusal line of `run`'s summary: how many, the names shown, why.
struct RunRefusal {
    count: usize,
    names: Vec<String>,
    why: String,
}

/// The refusal lines of `run`'s stderr and its "instrumented N functions, refused M".
fn run_refusals(stderr: &str) -> (Vec<RunRefusal>, usize, usize) {
    let mut out = Vec::new();
    let mut totals = None;
    for l in stderr.lines().filter_map(|l| l.strip_prefix("papirus-probe: ")) {
        if let Some(rest) = l.strip_prefix("instrumented ") {
            let (n, rest) = rest.split_once(" functions, refused ").unwrap();
            let m = rest.split(' ').next().unwrap();
            totals = Some((n.parse().unwrap(), m.parse().unwrap()));
        } else if let Some(rest) = l.strip_prefix("refused ") {
            let r = match rest.split_once(" functions (") {
                Some((k, names)) if k.parse::<usize>().is_ok() => {
                    let (names, why) = names.split_once("): ").unwrap();
                    let names = names.split(", ").filter(|n| *n != "…").map(String::from).collect();
                    RunRefusal { count: k.parse().unwrap(), names, why: why.into() }
                }
                _ => {
                    let (name, rest) = rest.split_once(" at 0x").unwrap();
                    let why = rest.split_once(": ").unwrap().1;
                    RunRefusal { count: 1, names: vec![name.into()], why: why.into() }
                }
            };
            out.push(r);
        }
    }
    let (n, m) = totals.expect("run's summary line");
    (out, n, m)
}

/// Every distinct function entry of libc, libsqlite3 and a pyenv
/// libpython3.11, `run --module` under a program that loads it: `list
/// --patchable` refuses exactly the entries `run` refuses, for the same
/// reasons (IFUNCs, which only the process resolves, aside); nothing is
/// refused for its length; and at least 99.9 % of the entries that are
/// entries (a compiler-split `.cold` part is entered by a jump, not a call)
/// are instrumented.
#[test]
fn list_patchable_refuses_what_run_refuses_and_run_covers_999_per_mille() {
    let mut cases: Vec<(PathBuf, Vec<String>)> = Vec::new();
    match papirus_testkit::debian_package("sqlite3", || which("sqlite3").is_ok())
        .and_then(|()| which("sqlite3"))
    {
        Ok(sqlite) => {
            let program = vec![sqlite.display().to_string(), ":memory:".into(), "select 1;".into()];
            for lib in ["libc.so.6", "libsqlite3.so.0"] {
                cases.push((Path::new("/lib/x86_64-linux-gnu").join(lib), program.clone()));
            }
        }
        Err(e) => papirus_testkit::skip(format!("libc and libsqlite3 under sqlite3: {e}")),
    }
    let py = Path::new("/root/.pyenv/versions/3.11.7");
    let libpython = py.join("lib/libpython3.11.so.1.0");
    if libpython.exists() {
        let python = py.join("bin/python3.11").display().to_string();
        cases.push((libpython, vec![python, "-c".into(), "print(sum(range(10)))".into()]));
    } else {
        papirus_testkit::skip(format!("{}: no pyenv Python 3.11 here", libpython.display()));
    }
    for (lib, program) in cases {
        let name = lib.file_name().unwrap().to_str().unwrap();
        let list = Command::new(env!("CARGO_BIN_EXE_papirus-probe"))
            .arg("list")
            .arg(&lib)
            .args(["--patchable", "--json"])
            .output()
            .unwrap();
        assert!(list.status.success(), "{name}: {list:?}");
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        let funcs = list["modules"][0]["functions"].as_array().unwrap();
        // What run selects: sized functions and IFUNCs, a default version over
        // its compat one, one entry per address.
        let shadowed = |f: &serde_json::Value| {
            f["hidden_version"] == true
                && funcs.iter().any(|g| g["name"] == f["name"] && g["hidden_version"] == false)
        };
        let mut entries: std::collections::BTreeMap<u64, Vec<&serde_json::Value>> = Default::default();
        for f in funcs {
            let kind = f["kind"].as_str().unwrap();
            if (kind == "function" || kind == "ifunc") && f["size"].as_u64() > Some(0) && !shadowed(f) {
                entries.entry(f["address"].as_u64().unwrap()).or_default().push(f);
            }
        }
        let is_ifunc = |fs: &Vec<&serde_json::Value>| fs[0]["kind"] == "ifunc";
        let refused_by_list: Vec<(&Vec<&serde_json::Value>, &serde_json::Value)> = entries
            .values()
            .filter(|fs| !is_ifunc(fs) && fs[0]["patchability"]["status"] == "not_patchable")
            .map(|fs| (fs, &fs[0]["patchability"]["reason"]))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let args: Vec<&str> = program.iter().map(String::as_str).collect();
        let plain = Command::new(args[0]).args(&args[1..]).output().unwrap();
        let probed = probe_run(&out, &["--module", name], &args);
        let stderr = String::from_utf8_lossy(&probed.stderr);
        assert!(probed.status.success(), "{name}: {stderr}");
        assert_eq!(probed.stdout, plain.stdout, "{name}: output changed");
        let (lines, instrumented, refused) = run_refusals(&stderr);
        let (ifunc_lines, lines): (Vec<RunRefusal>, Vec<RunRefusal>) =
            lines.into_iter().partition(|r| r.why.starts_with("IFUNC "));
        // The same reasons, with as many entries each, the shown ones among them.
        let same = |r: &RunRefusal, why: &serde_json::Value| match why["kind"].as_str() {
            Some("refused") => why["why"] == r.why.as_str(),
            Some("entered") => r.why.ends_with(why["why"].as_str().unwrap()),
            _ => false,
        };
        // The summary counts every refusal; the report names what was selected
        // (IFUNCs left unresolved and entries jumped into are left out before).
        let ifunc_refused: usize = ifunc_lines.iter().map(|r| r.count).sum();
        let entered: usize = lines
            .iter()
            .filter(|r| refused_by_list.iter().any(|(_, why)| why["kind"] == "entered" && same(r, why)))
            .map(|r| r.count)
            .sum();
        assert_eq!(
            instrumented + refused,
            report(&out).functions.len() + ifunc_refused + entered,
            "{name}: {stderr}"
        );
        for r in &lines {
            let listed: Vec<_> = refused_by_list.iter().filter(|(_, why)| same(r, why)).collect();
            for n in &r.names {
                assert!(
                    listed.iter().any(|(fs, _)| fs.iter().any(|f| f["name"] == n.as_str())),
                    "{name}: run refused {n} ({}), list --patchable did not say so",
                    r.why
                );
            }
            let by_run: usize = lines.iter().filter(|q| q.why == r.why).map(|q| q.count).sum();
            assert_eq!(by_run, listed.len(), "{name}: refused by run and by list for: {}", r.why);
        }
        let by_run: usize = lines.iter().map(|r| r.count).sum();
        assert_eq!(by_run, refused_by_list.len(), "{name}: refusals by run and by list:\n{stderr}");
        // Every other entry instrumented: an IFUNC may share its implementation with another entry.
        let ifuncs = entries.values().filter(|fs| is_ifunc(fs)).count();
        let plain_ok = entries.len() - ifuncs - refused_by_list.len();
        assert!((plain_ok..=plain_ok + ifuncs).contains(&instrumented), "{name}: {stderr}");
        assert!(!stderr.contains("shorter than"), "{name}: {stderr}");
        // Coverage over entries that are entries.
        let cold =
            |fs: &Vec<&serde_json::Value>| fs.iter().all(|f| f["name"].as_str().unwrap().ends_with(".cold"));
        let total = entries.values().filter(|fs| !cold(fs)).count();
        let missed = refused_by_list.iter().filter(|(fs, _)| !cold(fs)).count() + ifunc_refused;
        let covered = (total - missed) as f64 / total as f64;
        println!(
            "{name}: {} function symbols, {total} distinct entries ({} .cold parts aside), \
             {instrumented} instrumented, {missed} refused: {:.3} % covered",
            funcs.len(),
            entries.len() - total,
            100.0 * covered
        );
        assert!(
            covered >= 0.999,
            "{name}: {:.3} % of {total} entries instrumented:\n{stderr}",
            100.0 * covered
        );
    }
}
