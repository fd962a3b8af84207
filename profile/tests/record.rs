//! Recording real programs through the library: what appears after
//! recording starts (a thread, a forked process, a library loaded with
//! dlopen) is sampled and symbolized, exact events (a breakpoint, a
//! tracepoint) give one sample per event, and a recording survives a save
//! and a load.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use papirus_profile::recording::{CallGraph, Frame, TriggerInfo};
use papirus_profile::{Options, Recording, Target, record};

fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("profile_multi.c"))
        .opt("-O0")
        .args(["-fno-omit-frame-pointer", "-pthread", "-ldl"])
        .build(dir, "profile_multi");
    let lib = papirus_testkit::Cc::new(papirus_testkit::target("profile_lib.c"))
        .opt("-O0")
        .arg("-fno-omit-frame-pointer")
        .shared()
        .build(dir, "libprofile_lib.so");
    (exe, lib)
}

fn command(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Target {
    Target::Command(args.iter().map(|a| OsString::from(a.as_ref())).collect())
}

/// Samples per (thread name, leaf function, leaf module file name), and pids seen.
fn leaves(r: &Recording) -> Vec<(String, String, String, u32, u64)> {
    r.samples
        .iter()
        .map(|s| {
            let leaf = r.stack(s.stack).last().unwrap();
            let module = leaf.module.rsplit('/').next().unwrap().to_string();
            (r.comm(s.tid).to_string(), leaf.name.clone(), module, s.pid, s.count)
        })
        .collect()
}

#[test]
fn follows_threads_processes_and_libraries_that_appear_after_start() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, lib) = build(dir.path());
    let opts = Options {
        call_graph: CallGraph::Fp,
        trigger: Some(TriggerInfo::Frequency(1000)),
        ..Options::default()
    };
    let r = record(&command(&[&exe, &lib]), &opts).unwrap();
    assert_eq!(r.exit.map(|e| e.code), Some(0));
    let l = leaves(&r);
    let main_pid = r.target.pid as u32;
    let has = |comm: &str, func: &str, module: &str, other_pid: bool| {
        l.iter().any(|(c, f, m, pid, n)| {
            c == comm && f == func && m == module && (*pid != main_pid) == other_pid && *n > 0
        })
    };
    assert!(has("late", "hot_b", "profile_multi", false), "a thread made later, by its name: {l:?}");
    assert!(has("profile_multi", "hot_c", "profile_multi", true), "a forked child, its own pid: {l:?}");
    assert!(
        has("profile_multi", "lib_spin", "libprofile_lib.so", false),
        "a dlopen'd library: {l:?} {:?}",
        r.unreadable_modules
    );
    assert!(r.unreadable_modules.is_empty(), "{:?}", r.unreadable_modules);
    // The library's function is reached from main through frame pointers.
    let chain = r
        .samples
        .iter()
        .map(|s| r.stack(s.stack).map(|f| f.name.as_str()).collect::<Vec<_>>())
        .find(|st| st.last() == Some(&"lib_spin"))
        .unwrap();
    assert!(chain.ends_with(&["main", "lib_spin"]), "{chain:?}");
    // Saved and loaded, the recording is the same.
    let file = dir.path().join("r.json");
    r.save(&file).unwrap();
    assert_eq!(Recording::load(&file).unwrap(), r);
}

#[test]
fn a_breakpoint_samples_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, lib) = build(dir.path());
    let opts = Options { event: "mem:hot_b:x".into(), call_graph: CallGraph::Fp, ..Options::default() };
    let r = record(&command(&[&exe, &lib, &"37"]), &opts).unwrap();
    assert_eq!(r.event.trigger, TriggerInfo::Period(1), "breakpoints sample every event by default");
    let calls: u64 = leaves(&r).iter().filter(|x| x.1 == "hot_b").map(|x| x.4).sum();
    assert_eq!((calls, r.total_samples(), r.rings.lost), (37, 37, 0), "{:?}", leaves(&r));
    assert!(r.threads.iter().any(|t| t.comm == "late"));
}

#[test]
fn a_tracepoint_samples_every_event_with_kernel_and_user_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, lib) = build(dir.path());
    // One thread and one process created: two forks in the scheduler's eyes.
    let opts =
        Options { event: "sched:sched_process_fork".into(), call_graph: CallGraph::Fp, ..Options::default() };
    let r = match record(&command(&[&exe, &lib, &"5"]), &opts) {
        Ok(r) => r,
        Err(e) => return papirus_testkit::skip(format!("tracepoint sampling: {e}")),
    };
    assert_eq!(r.total_samples(), 2, "one sample per fork: {:?}", leaves(&r));
    for s in &r.samples {
        let st: Vec<&Frame> = r.stack(s.stack).collect();
        assert!(st.last().unwrap().kernel, "the tracepoint fires in the kernel: {st:?}");
        assert!(st.iter().any(|f| f.name == "kernel_clone"), "resolved through kallsyms: {st:?}");
        // libc's fork and clone keep no frame pointer: the user part ends there.
        assert!(st.iter().any(|f| !f.kernel && f.module.contains("libc")), "from libc: {st:?}");
    }
}

#[test]
fn dwarf_unwinding_gives_whole_chains_without_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("profile_hot.c"))
        .opt("-O2")
        .args(["-fomit-frame-pointer", "-fno-inline", "-pthread"])
        .build(dir.path(), "profile_hot");
    // Debian's detached libc symbols name libc's local functions, as perf does with them.
    let libc = papirus_substrate::elf::ElfFile::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let debug_root = Path::new(papirus_substrate::elf::DEBUG_ROOT);
    let libc_dbg = papirus_testkit::debian_package("libc6-dbg", || libc.debug_file(debug_root).is_some());
    if let Err(e) = &libc_dbg {
        papirus_testkit::skip(format!("libc's debug symbols (libc6-dbg): {e}"));
    }
    let opts = Options {
        call_graph: CallGraph::Dwarf,
        trigger: Some(TriggerInfo::Frequency(1000)),
        ..Options::default()
    };
    let r = record(&command(&[&exe, &"300"]), &opts).unwrap();
    assert_eq!(r.exit.map(|e| e.code), Some(3));
    let total = r.total_samples();
    assert!(total >= 100, "{total} samples");
    let mut hot = 0;
    for s in &r.samples {
        let names: Vec<&str> = r.stack(s.stack).map(|f| f.name.as_str()).collect();
        if names.last().is_some_and(|n| n.starts_with("hot_")) {
            hot += s.count;
            // Through the program and libc's own unwind tables, up to the entry point.
            assert_eq!(names.first(), Some(&"_start"), "{names:?}");
            assert!(names.ends_with(&["main", "run", names.last().unwrap()]), "{names:?}");
            if libc_dbg.is_ok() {
                assert!(names.contains(&"__libc_start_call_main"), "a local symbol of libc: {names:?}");
                // The debug file's `.symtab` spells `__libc_start_main@@GLIBC_2.34`.
                assert!(names.contains(&"__libc_start_main"), "without its version: {names:?}");
            }
        }
    }
    assert!(hot * 10 >= total * 9, "{hot} of {total} samples in hot functions: {:?}", leaves(&r));
}

#[test]
fn a_debug_files_aliases_resolve_to_the_exported_name() {
    let libc = papirus_substrate::elf::ElfFile::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let root = Path::new(papirus_substrate::elf::DEBUG_ROOT);
    if let Err(e) = papirus_testkit::debian_package("libc6-dbg", || libc.debug_file(root).is_some()) {
        papirus_testkit::skip(format!("libc's debug symbols (libc6-dbg): {e}"));
        return;
    }
    let debug = libc.debug_file(root).unwrap();
    // Its .symtab holds __GI___libc_malloc and __malloc (local), __libc_malloc and malloc there.
    let malloc = libc.functions().find(|s| s.name == "malloc").unwrap().address;
    assert_eq!(debug.function_at(malloc).unwrap().name, "malloc");
}

#[test]
fn samples_kernel_mode_too_unless_a_modifier_says_user() {
    // dd copies one byte per read(2) and write(2): most of its time is in the kernel.
    let dd = command(&[&"dd", &"if=/dev/zero", &"of=/dev/null", &"bs=1", &"count=300000"]);
    let kernel_share = |event: &str| {
        let opts = Options {
            event: event.into(),
            trigger: Some(TriggerInfo::Frequency(2000)),
            ..Options::default()
        };
        let r = record(&dd, &opts).unwrap();
        let kernel: u64 = r
            .samples
            .iter()
            .filter(|s| r.stack(s.stack).last().is_some_and(|f| f.kernel))
            .map(|s| s.count)
            .sum();
        (r.event.domain.clone().unwrap(), r.notes.clone(), kernel, r.total_samples())
    };
    let (domain, notes, kernel, total) = kernel_share("task-clock");
    if rustix::process::geteuid().is_root() {
        assert_eq!(domain, "user+kernel", "as perf record: {notes:?}");
        assert!(total >= 20 && kernel * 4 >= total, "{kernel} of {total} samples in the kernel");
    } else {
        assert_eq!(domain, "user", "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("perf_event_paranoid")), "{notes:?}");
    }
    let (domain, notes, kernel, total) = kernel_share("task-clock:u");
    assert_eq!((domain.as_str(), notes.len(), kernel), ("user", 0, 0), "{total} samples");
}
