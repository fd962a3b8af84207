//! Call-path profiles: the tree the runtime keeps per thread, on the
//! demo's recursion, longjmp and four threads and on C++ exceptions; its
//! figures consistent (a parent's inclusive time covers its children's,
//! flat figures are the tree's sums); the JSON against its schema; the
//! text tree's depth limit and threshold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use papirus_probe_abi::{NodeReport, Report, ThreadReport};

fn exe(src: &str, name: &str) -> PathBuf {
    papirus_testkit::Cc::new(crate::util::source(src))
        .arg("-pthread")
        .build(papirus_testkit::shared_scratch(), name)
}

fn run(program: &Path, out: &Path, extra: &[&str]) -> Report {
    let o = crate::util::probe_run(out, extra, [program]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Children of each node.
fn children(t: &ThreadReport) -> Vec<Vec<usize>> {
    let mut c = vec![Vec::new(); t.tree.len()];
    for (i, n) in t.tree.iter().enumerate() {
        if let Some(p) = n.parent {
            assert!((p as usize) < i, "a parent comes before its child");
            c[p as usize].push(i);
        }
    }
    c
}

/// The invariants every thread's tree keeps, and the flat figures
/// recomputed here from the tree.
fn check_consistent(r: &Report, t: &ThreadReport) {
    let kids = children(t);
    for (i, n) in t.tree.iter().enumerate() {
        let name = &r.functions[n.function as usize];
        let sum: u64 = kids[i].iter().map(|&c| t.tree[c].figures.incl_ticks).sum();
        assert!(
            n.figures.incl_ticks >= sum,
            "{name}: inclusive {} < its children's {sum}",
            n.figures.incl_ticks
        );
        assert_eq!(
            n.figures.excl_ticks,
            n.figures.incl_ticks - sum,
            "{name}: exclusive = inclusive - children"
        );
        assert!(n.figures.exits + n.figures.unwound <= n.figures.calls, "{name}");
        let closed = n.figures.exits + n.figures.unwound;
        if closed > 0 {
            assert!(
                n.figures.min_ticks <= n.figures.max_ticks && n.figures.max_ticks <= n.figures.incl_ticks,
                "{name}"
            );
        }
        // No two siblings share a function: one node per path.
        let mut seen = std::collections::BTreeSet::new();
        assert!(kids[i].iter().all(|&c| seen.insert(t.tree[c].function)), "{name}: duplicate child");
    }
    // Flat figures: sums over the nodes; inclusive over nodes without an
    // ancestor of the same function (a recursion counted once).
    let mut flat: BTreeMap<u32, (u64, u64, u64, u64, u64)> = BTreeMap::new();
    for (i, n) in t.tree.iter().enumerate() {
        let mut outermost = true;
        let mut at = n.parent;
        while let Some(p) = at {
            outermost &= t.tree[p as usize].function != n.function;
            at = t.tree[p as usize].parent;
        }
        let f = flat.entry(n.function).or_default();
        f.0 += n.figures.calls;
        f.1 += n.figures.exits;
        f.2 += n.figures.unwound;
        f.3 += if outermost { n.figures.incl_ticks } else { 0 };
        f.4 += n.figures.excl_ticks;
        let _ = i;
    }
    assert_eq!(t.functions.len(), flat.len());
    for f in &t.functions {
        let want = flat[&f.id];
        assert_eq!(
            (f.figures.calls, f.figures.exits, f.figures.unwound, f.figures.incl_ticks, f.figures.excl_ticks),
            want,
            "{}",
            r.functions[f.id as usize]
        );
    }
    for e in &t.callees {
        let (calls, incl) = t
            .tree
            .iter()
            .filter(|n| {
                n.function == e.callee && n.parent.is_some_and(|p| t.tree[p as usize].function == e.caller)
            })
            .fold((0, 0), |(c, i), n| (c + n.figures.calls, i + n.figures.incl_ticks));
        assert_eq!((e.calls, e.incl_ticks), (calls, incl), "pair {} -> {}", e.caller, e.callee);
    }
}

/// The node reached by following `path` (function names) from the thread's roots.
fn node<'a>(r: &Report, t: &'a ThreadReport, path: &[&str]) -> &'a NodeReport {
    let mut parent = None;
    let mut found = None;
    for name in path {
        let id = r.id(name).unwrap_or_else(|| panic!("{name} not in the session"));
        let i = t
            .tree
            .iter()
            .position(|n| n.parent == parent && n.function == id)
            .unwrap_or_else(|| panic!("no node {path:?} (at {name})"));
        parent = Some(i as u32);
        found = Some(&t.tree[i]);
    }
    found.unwrap()
}

#[test]
fn call_paths_hold_recursion_longjmp_exceptions_and_threads() {
    let dir = papirus_testkit::scratch();
    let demo =
        run(&exe("probe_program.c", "callpath_demo"), &dir.path().join("demo.json"), &["--per-thread"]);
    assert_eq!(demo.threads.len(), 5);
    for t in &demo.threads {
        check_consistent(&demo, t);
    }
    let main = demo.threads.iter().find(|t| t.tid == demo.pid).unwrap();
    // fib(20): one node per recursion level, 20 of them, 21891 calls in all.
    let fib = demo.id("fib").unwrap();
    let levels: Vec<&NodeReport> = main.tree.iter().filter(|n| n.function == fib).collect();
    assert_eq!(levels.len(), 20);
    assert_eq!(levels.iter().map(|n| n.figures.calls).sum::<u64>(), 21891);
    assert_eq!(node(&demo, main, &["main", "fib"]).figures.calls, 1);
    assert_eq!(node(&demo, main, &["main", "fib", "fib"]).figures.calls, 2);
    // The longjmp closes lj3, lj2, lj1 as unwound; main then calls three again, as main.
    for path in [&["main", "lj1"][..], &["main", "lj1", "lj2"], &["main", "lj1", "lj2", "lj3"]] {
        let n = node(&demo, main, path);
        assert_eq!((n.figures.calls, n.figures.exits, n.figures.unwound), (1, 0, 1), "{path:?}");
    }
    assert_eq!(node(&demo, main, &["main", "three"]).figures.calls, 4);
    assert_eq!(node(&demo, main, &["main", "tail_caller", "tail_callee"]).figures.calls, 1);
    assert_eq!(node(&demo, main, &["main", "f", "g"]).figures.calls, 1000);
    // Four threads, each its own tree: worker → f → g.
    for w in demo.threads.iter().filter(|t| t.tid != demo.pid) {
        assert_eq!(w.tree.len(), 3, "thread {}", w.tid);
        let g = node(&demo, w, &["worker", "f", "g"]);
        assert_eq!((g.figures.calls, g.figures.exits), (1000, 1000));
    }

    // Without --per-thread, the ended workers fold into one tree of the process.
    let folded = run(&exe("probe_program.c", "callpath_demo"), &dir.path().join("folded.json"), &[]);
    let exited = folded.threads.iter().find(|t| t.exited_threads == 4).expect("the folded workers");
    check_consistent(&folded, exited);
    assert_eq!(exited.tree.len(), 3, "four threads' paths merge into one tree");
    assert_eq!(node(&folded, exited, &["worker", "f", "g"]).figures.calls, 4000);
    assert_eq!(node(&folded, exited, &["worker"]).figures.calls, 4);

    // A bound of 8 nodes (the root and 7 paths): later paths are counted,
    // left out, and the tree stays consistent.
    let bounded = run(
        &exe("probe_program.c", "callpath_demo"),
        &dir.path().join("bounded.json"),
        &["--tree-nodes", "8"],
    );
    let main = bounded.threads.iter().find(|t| t.tid == bounded.pid).unwrap();
    check_consistent(&bounded, main);
    assert_eq!(main.tree.len(), 7);
    assert!(main.node_overflow > 0, "calls beyond the bound are counted");
    let placed: u64 = main.tree.iter().map(|n| n.figures.calls).sum();
    let all: u64 =
        demo.threads.iter().find(|t| t.tid == demo.pid).unwrap().tree.iter().map(|n| n.figures.calls).sum();
    assert_eq!(placed + main.node_overflow, all, "every call is placed or counted as overflow");

    // C++ exceptions: run_exc → ex1 → ex2 → ex3; four of six calls throw from ex3 to its catch.
    let exc = run(&exe("probe_program_exc.cpp", "callpath_exc"), &dir.path().join("exc.json"), &[]);
    let t = &exc.threads[0];
    check_consistent(&exc, t);
    let path = ["main", "run_exc(int)", "ex1(int)", "ex2(int)", "ex3(int)"];
    for depth in 3..=path.len() {
        let n = node(&exc, t, &path[..depth]);
        assert_eq!((n.figures.calls, n.figures.exits, n.figures.unwound), (6, 2, 4), "{:?}", &path[..depth]);
    }
    assert_eq!(node(&exc, t, &path[..2]).figures.exits, 6, "run_exc catches every exception");
}

#[test]
fn report_json_follows_its_schema_and_the_text_tree_is_bounded() {
    let dir = papirus_testkit::scratch();
    let out = dir.path().join("demo.json");
    let r = run(&exe("probe_program.c", "callpath_schema"), &out, &[]);
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../probe/abi/schema/report.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&json).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
    let mut broken = json.clone();
    broken["threads"][0]["tree"][0].as_object_mut().unwrap().remove("parent");
    assert!(!validator.is_valid(&broken), "the schema accepts a node without its parent");

    let tree = |extra: &[&str]| {
        let o = Command::new(crate::util::probe())
            .arg("report")
            .arg(&out)
            .arg("--tree")
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let full = tree(&[]);
    // Every fib level is a line, indented one step deeper than its parent.
    let fib_lines: Vec<&str> = full.lines().filter(|l| l.trim_end().ends_with(" fib")).collect();
    assert_eq!(fib_lines.len(), 20, "{full}");
    assert!(full.contains(&format!("{}fib\n", "  ".repeat(20))), "{full}");
    let shallow = tree(&["--depth", "2"]);
    assert!(shallow.contains("  main\n") && shallow.contains("    fib\n"), "{shallow}");
    assert!(!shallow.contains("      fib\n") && shallow.contains("deeper than 2 levels"), "{shallow}");
    let main = r.threads.iter().find(|t| t.tid == r.pid).unwrap();
    let fib_share = node(&r, main, &["main", "fib"]).figures.incl_ticks as f64
        / node(&r, main, &["main"]).figures.incl_ticks as f64;
    // A threshold above fib's share hides its whole subtree and says how much it hid.
    let pct = (fib_share * 100.0 + 1.0).min(99.0).to_string();
    let cut = tree(&["--threshold", &pct]);
    assert!(!cut.contains(" fib\n") && cut.contains("under the threshold"), "{cut}");
}
