//! Regions: nesting, threads, misuse, measured values, and the reports.
//!
//! Every test runs on its own thread (the test harness's), and regions are
//! per thread, so tests look only at their own thread's part of a snapshot.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use papirus_highlevel::region::{self, Config, RegionError, region, region_begin, region_end};
use papirus_highlevel::report::{self, Report, ThreadReport};

/// The output directory of the setup every test shares.
fn out_dir() -> PathBuf {
    papirus_testkit::shared_scratch().to_path_buf()
}

/// One setup for the whole test binary: default events, a private output
/// directory, no write at exit (tests call flush).
fn init() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        Config::new().output_directory(out_dir()).write_at_exit(false).install().unwrap();
    });
}

fn my_thread(r: &Report) -> ThreadReport {
    let tid = papirus_lowlevel::thread_id();
    r.process.threads.iter().find(|t| t.tid == tid).cloned().expect("this thread is in the report")
}

fn schema() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/regions.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn validate(doc: &serde_json::Value) {
    let v = jsonschema::validator_for(&schema()).expect("the schema compiles");
    let errors: Vec<String> = v.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "report does not match the schema: {errors:#?}");
}

#[test]
fn nesting_fifty_deep() {
    init();
    let names: Vec<String> = (0..50).map(|i| format!("nest{i}")).collect();
    for _ in 0..2 {
        for n in &names {
            region_begin(n).unwrap();
        }
        assert_eq!(region::depth(), 50);
        for n in names.iter().rev() {
            region_end(n).unwrap();
        }
        assert_eq!(region::depth(), 0);
    }
    let me = my_thread(&report::snapshot().unwrap());
    let mut prev: Option<&report::RegionReport> = None;
    for n in &names {
        let g = me.regions.iter().find(|g| &g.name == n).unwrap();
        assert_eq!((g.calls, g.open), (2, 0), "{n}");
        assert_eq!(g.parent, prev.map(|p| p.id), "{n} nests in the one before");
        if let Some(p) = prev {
            // Inclusive: an outer region's time contains the inner one's.
            assert!(p.metrics["real_time_ns"].total >= g.metrics["real_time_ns"].total);
        }
        prev = Some(g);
    }
}

#[test]
fn eight_threads_keep_their_own_regions() {
    init();
    let handles: Vec<_> = (0..8)
        .map(|k| {
            std::thread::spawn(move || {
                let name = format!("thread_work_{k}");
                for _ in 0..=k {
                    let _outer = region(&name).unwrap();
                    let _inner = region("shared_name").unwrap();
                }
                papirus_lowlevel::thread_id()
            })
        })
        .collect();
    let tids: Vec<i32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let r = report::snapshot().unwrap();
    for (k, tid) in tids.iter().enumerate() {
        let t = r.process.threads.iter().find(|t| t.tid == *tid).expect("thread reported");
        assert!(t.exited);
        assert_eq!(t.regions.len(), 2, "thread {k}: {:?}", t.regions);
        let outer = &t.regions[0];
        assert_eq!((outer.name.as_str(), outer.calls), (format!("thread_work_{k}").as_str(), k as u64 + 1));
        let inner = &t.regions[1];
        assert_eq!(
            (inner.name.as_str(), inner.calls, inner.parent),
            ("shared_name", k as u64 + 1, Some(outer.id))
        );
    }
}

#[test]
fn ending_in_another_thread_is_an_error() {
    init();
    let (begun_tx, begun_rx) = std::sync::mpsc::channel();
    let (tried_tx, tried_rx) = std::sync::mpsc::channel();
    let owner = std::thread::spawn(move || {
        region_begin("handoff").unwrap();
        begun_tx.send(papirus_lowlevel::thread_id()).unwrap();
        tried_rx.recv().unwrap();
        region_end("handoff")
    });
    let owner_tid = begun_rx.recv().unwrap();
    let err = region_end("handoff").unwrap_err();
    tried_tx.send(()).unwrap();
    match err {
        RegionError::OtherThread { ref name, begun_in, ended_in } => {
            assert_eq!(
                (name.as_str(), begun_in, ended_in),
                ("handoff", owner_tid, papirus_lowlevel::thread_id())
            );
        }
        other => panic!("expected OtherThread, got {other:?}"),
    }
    assert!(err.to_string().contains("per thread"), "{err}");
    // The owner still ends it normally.
    owner.join().unwrap().unwrap();
}

#[test]
fn misuse_is_reported_and_loses_nothing() {
    init();
    match region_end("never_begun") {
        Err(RegionError::NotBegun { name, .. }) => assert_eq!(name, "never_begun"),
        other => panic!("expected NotBegun, got {other:?}"),
    }
    region_begin("outer_m").unwrap();
    region_begin("inner_m").unwrap();
    match region_end("outer_m") {
        Err(RegionError::OutOfOrder { ended, innermost, .. }) => {
            assert_eq!((ended.as_str(), innermost.as_str()), ("outer_m", "inner_m"))
        }
        other => panic!("expected OutOfOrder, got {other:?}"),
    }
    // The refused end changed nothing: both still end, in order.
    assert_eq!(region::depth(), 2);
    region_end("inner_m").unwrap();
    region_end("outer_m").unwrap();
    let me = my_thread(&report::snapshot().unwrap());
    for n in ["outer_m", "inner_m"] {
        let g = me.regions.iter().find(|g| g.name == n).unwrap();
        assert_eq!((g.calls, g.open), (1, 0), "{n}");
    }
    // A guard ended explicitly returns the result of region_end.
    let g = region("guarded_m").unwrap();
    g.end().unwrap();
    assert_eq!(region::depth(), 0);
    // A guard whose region cannot end (an inner one is still open) counts
    // the error for the report instead of losing it; the region stays open.
    let before = my_thread(&report::snapshot().unwrap()).guard_errors;
    {
        let _g = region("guard_outer_m").unwrap();
        region_begin("left_open_m").unwrap();
    }
    assert_eq!(my_thread(&report::snapshot().unwrap()).guard_errors, before + 1);
    region_end("left_open_m").unwrap();
    region_end("guard_outer_m").unwrap();
    assert_eq!(region::depth(), 0);
    assert!(matches!(Config::new().install(), Err(RegionError::AlreadyConfigured)));
}

fn metric(t: &ThreadReport, region: &str, m: &str) -> i64 {
    let g = t.regions.iter().rfind(|g| g.name == region).unwrap();
    g.metrics[m].total
}

/// Runs `f` in a fresh region `name` and returns (real ns, virtual ns, utilisation) of that call.
fn measure(name: &str, f: impl FnOnce()) -> (i64, i64, f64) {
    region_begin(name).unwrap();
    f();
    region_end(name).unwrap();
    let me = my_thread(&report::snapshot().unwrap());
    let g = me.regions.iter().find(|g| g.name == name).unwrap();
    assert_eq!(g.calls, 1);
    (g.metrics["real_time_ns"].total, g.metrics["virtual_time_ns"].total, g.derived["cpu_utilisation"])
}

/// A buffer of fresh pages: larger than glibc's largest mmap threshold
/// (32 MiB), so it is always its own zero-filled mmap, never recycled heap
/// memory whose pages are already present.
fn fresh_buffer(pages: usize) -> Vec<u8> {
    vec![0u8; (33 << 20).max((pages + 1) * 4096)]
}

/// Writes one byte in each of `pages` distinct pages of `buf`, spread out,
/// skipping the first page (malloc's chunk header lives there).
fn touch(buf: &mut [u8], pages: usize) {
    let stride = (buf.len() / 4096 - 1) / pages;
    for p in 0..pages {
        buf[(1 + p * stride) * 4096] = 1;
    }
}

fn thread_cpu_ns() -> i64 {
    papirus_substrate::sys::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID).unwrap() as i64
}

#[test]
fn busy_loop_is_timed_and_uses_the_cpu() {
    init();
    // A shared VM can preempt us: best of a few tries. Each try also asks
    // the kernel (CLOCK_THREAD_CPUTIME_ID, std's Instant) what happened.
    let mut tries = vec![];
    for i in 0..5 {
        let (mut wall, mut cpu) = (0i64, 0i64);
        let (real, _virt, util) = measure(&format!("busy{i}"), || {
            let (t, c) = (Instant::now(), thread_cpu_ns());
            while t.elapsed() < Duration::from_millis(100) {
                std::hint::black_box(0u64);
            }
            cpu = thread_cpu_ns() - c;
            wall = t.elapsed().as_nanos() as i64;
        });
        let kernel_util = cpu as f64 / wall as f64;
        println!(
            "busy loop: region real {real} ns (Instant {wall} ns), utilisation {util:.3} (kernel's {kernel_util:.3})"
        );
        let err = (real as f64 - 1e8).abs() / 1e8;
        tries.push((err, util, kernel_util));
        if err < 0.05 && util > 0.9 {
            return;
        }
    }
    let best_time = tries.iter().map(|t| t.0).fold(f64::MAX, f64::min);
    assert!(best_time < 0.05, "no try within 100 ms ± 5 %: {tries:?}");
    // Never above 0.9: the machine did not give this thread the CPU. That
    // is only acceptable when the kernel's own accounting agrees.
    for &(_, util, kernel) in &tries {
        assert!(kernel < 0.9, "kernel saw utilisation {kernel:.3} but the region {util:.3}: {tries:?}");
        assert!((util - kernel).abs() < 0.05, "region utilisation {util:.3} vs kernel's {kernel:.3}");
    }
    println!(
        "NOTE: this machine is overloaded (load average above its CPUs): the busy thread got under 90 % of a CPU in every try, as the kernel's own thread CPU clock confirms; the > 0.9 criterion could not be shown in this run"
    );
}

#[test]
fn sleep_does_not_use_the_cpu() {
    init();
    let mut tries = vec![];
    for i in 0..3 {
        let (real, virt, util) =
            measure(&format!("sleep{i}"), || std::thread::sleep(Duration::from_millis(100)));
        let cs = metric(&my_thread(&report::snapshot().unwrap()), &format!("sleep{i}"), "context-switches");
        println!("sleep: real {real} ns, virtual {virt} ns, utilisation {util:.4}, {cs} context switches");
        assert!(real >= 100_000_000, "a 100 ms sleep took {real} ns of real time");
        assert!(cs >= 1, "a sleep switches the thread out at least once");
        tries.push(util);
        if util < 0.1 {
            return;
        }
    }
    panic!("utilisation of a 100 ms sleep never below 0.1: {tries:?}");
}

#[test]
fn fresh_page_touches_are_counted() {
    init();
    let setup = region::setup().unwrap();
    assert!(setup.metrics.iter().any(|m| m == "page-faults"), "default events: {:?}", setup.metrics);
    let mut buf = fresh_buffer(1000);
    region_begin("touch").unwrap();
    touch(&mut buf, 1000);
    region_end("touch").unwrap();
    std::hint::black_box(&buf);
    let me = my_thread(&report::snapshot().unwrap());
    let faults = metric(&me, "touch", "page-faults");
    println!("1000 page touches: {faults} page faults");
    assert!(faults >= 1000, "1000 fresh page touches gave {faults} page faults");
}

#[test]
fn default_events_measure_what_exists() {
    init();
    let s = region::setup().unwrap();
    for must in ["task-clock", "page-faults", "context-switches"] {
        assert!(s.events.iter().any(|e| e.name == must), "{must} missing from {:?}", s.events);
    }
    for hw in ["cycles", "instructions"] {
        let measured = s.events.iter().any(|e| e.name == hw);
        let skipped = s.unavailable.iter().find(|u| u.name == hw);
        match (measured, skipped) {
            (true, None) => println!("{hw}: measured"),
            (false, Some(u)) => {
                println!("{hw}: not measured here: {}", u.reason);
                assert!(!u.reason.is_empty());
            }
            other => panic!("{hw} must be either measured or listed as unavailable: {other:?}"),
        }
    }
}

/// Numbers of the text report, keyed as (thread tid, region id, metric).
fn parse_text(text: &str) -> Vec<((i32, u32, String), Vec<f64>)> {
    let (mut tid, mut region) = (0, 0);
    let mut out = vec![];
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["thread", _, "tid", t, ..] => tid = t.parse().unwrap(),
            ["region", id, ..] => region = id.parse().unwrap(),
            ["metric", ..] => {}
            [name, nums @ ..] if line.starts_with("    ") && !nums.is_empty() => {
                let nums = nums.iter().map(|n| n.parse::<f64>().unwrap()).collect();
                out.push(((tid, region, name.to_string()), nums));
            }
            _ => {}
        }
    }
    out
}

#[test]
fn flushed_json_matches_schema_and_text() {
    init();
    {
        let _a = region("flush_outer").unwrap();
        let _b = region("flush inner with spaces").unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let path = report::flush().unwrap();
    assert!(path.starts_with(out_dir()));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    validate(&doc);
    assert_eq!(doc["format_version"], 1);
    assert!(doc["machine"]["cpus"].as_u64().unwrap() >= 1);
    let report: Report = serde_json::from_value(doc).unwrap();
    let text = std::fs::read_to_string(path.with_extension("txt")).unwrap();
    let parsed = parse_text(&text);
    // Every number of the JSON is in the text, equal, and nothing else is.
    let mut expected = vec![];
    for t in &report.process.threads {
        for g in &t.regions {
            for m in &report.process.metrics {
                let s = g.metrics[m];
                expected.push(((t.tid, g.id, m.clone()), vec![s.total as f64, s.min as f64, s.max as f64]));
            }
            for (k, v) in &g.derived {
                expected.push(((t.tid, g.id, k.clone()), vec![*v]));
            }
        }
    }
    assert!(expected.iter().any(|((_, _, m), _)| m == "cpu_utilisation"));
    assert_eq!(parsed, expected);
    let me = my_thread(&report);
    assert!(me.regions.iter().any(|g| g.name == "flush inner with spaces" && g.calls == 1));
}

fn example(name: &str) -> PathBuf {
    // tests run from target/<profile>/deps; examples are built beside it.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    dir.join("examples").join(name)
}

#[test]
fn report_is_written_at_exit() {
    let bin = example("region_exit");
    assert!(
        bin.exists(),
        "{} missing: cargo test builds examples; run `cargo build -p papirus-highlevel --examples`",
        bin.display()
    );
    let scratch = tempfile::tempdir().unwrap();
    for how in ["return", "exit"] {
        let dir = scratch.path().join(format!("exit-{how}"));
        let out = std::process::Command::new(&bin)
            .arg(how)
            .env("PAPIRUS_OUTPUT_DIRECTORY", &dir)
            .env("PAPIRUS_EVENTS", "page-faults, perf::CONTEXT-SWITCHES,PAPI_TOT_CYC")
            .env_remove("PAPI_EVENTS")
            .output()
            .unwrap();
        assert!(out.status.success(), "{how}: {out:?}");
        let json = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .unwrap_or_else(|| panic!("{how}: no JSON report in {}", dir.display()));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        validate(&doc);
        let r: Report = serde_json::from_value(doc).unwrap();
        let names: Vec<&str> = r.process.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(&names[..2], ["page-faults", "context-switches"], "{how}");
        if names.len() == 2 {
            let u = &r.process.unavailable_events;
            assert!(u.iter().any(|u| u.name == "PAPI_TOT_CYC"), "{how}: {u:?}");
            println!("PAPI_TOT_CYC not measured here: {}", u[0].reason);
        }
        assert_eq!(r.process.threads.len(), 2, "{how}");
        let main = &r.process.threads[0];
        let regions: Vec<(&str, u64)> = main.regions.iter().map(|g| (g.name.as_str(), g.calls)).collect();
        assert_eq!(regions, [("main", 1), ("inner", 1)], "{how}");
        let worker = &r.process.threads[1];
        assert_eq!(worker.name, "worker");
        assert_eq!((worker.regions[0].name.as_str(), worker.regions[0].calls), ("worker_loop", 3));
        assert!(json.with_extension("txt").exists());
    }
    // PAPI's variable, in PAPI's spelling, when papirus' own is unset.
    let dir = scratch.path().join("exit-papi-events");
    let out = std::process::Command::new(&bin)
        .env("PAPIRUS_OUTPUT_DIRECTORY", &dir)
        .env_remove("PAPIRUS_EVENTS")
        .env("PAPI_EVENTS", "perf::PAGE-FAULTS=delta")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json = dir.join(format!("papirus_{}.json", out_pid(&dir)));
    let r: Report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r.process.event_source, region::EventSource::PapiEvents);
    let names: Vec<&str> = r.process.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["page-faults"]);
}

/// The pid in the name of the one JSON report in `dir`.
fn out_pid(dir: &Path) -> u32 {
    let name = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.ends_with(".json"))
        .expect("a JSON report");
    name.trim_start_matches("papirus_").trim_end_matches(".json").parse().unwrap()
}

/// PAPI's rate functions and the classic counters API.
mod rates_and_counters {
    use std::time::{Duration, Instant};

    use papirus_highlevel::counters_api::{
        accum_counters, num_counters, read_counters, start_counters, stop_counters,
    };
    use papirus_highlevel::rates::{self, RateError};
    use papirus_lowlevel::Code;

    fn touch_pages(n: usize) -> Vec<u8> {
        let mut buf = super::fresh_buffer(n);
        super::touch(&mut buf, n);
        buf
    }

    /// Without a PMU, ipc and flops_rate name the hardware event they miss;
    /// with one, they count.
    #[test]
    fn hardware_rates_name_the_missing_event() {
        let pmu = num_counters().unwrap() > 0;
        for (what, r) in
            [("ipc", rates::ipc().map(|_| ())), ("flops_rate", rates::flops_rate("PAPI_FP_OPS").map(|_| ()))]
        {
            match r {
                Ok(()) => assert!(pmu, "{what} counted without hardware counters"),
                Err(e @ RateError::MissingEvent { .. }) => {
                    let RateError::MissingEvent { ref event, .. } = e else { unreachable!() };
                    assert!(event.starts_with("PAPI_"), "{e}");
                    assert!(e.to_string().contains(event.as_str()), "{e}");
                    assert_eq!(e.code(), Code::Enoevnt, "{e}");
                    println!("{what}: {e}");
                    if !pmu {
                        assert!(e.to_string().contains("no hardware PMU"), "{e}");
                    }
                }
                Err(e) => panic!("{what}: unexpected {e:?}"),
            }
        }
        let _ = rates::rate_stop();
        assert!(matches!(rates::flops_rate("PAPI_TOT_INS"), Err(RateError::WrongEvent { .. })));
        assert!(matches!(rates::flips_rate("PAPI_FP_OPS"), Err(RateError::WrongEvent { .. })));
    }

    #[test]
    fn time_and_event_rates_work_here() {
        let first = rates::time_rate().unwrap();
        assert_eq!(first, Default::default(), "the first call starts and reports zeros");
        let (t, c) = (Instant::now(), super::thread_cpu_ns());
        while t.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let (wall, cpu) = (t.elapsed().as_secs_f64(), (super::thread_cpu_ns() - c) as f64 / 1e9);
        let r = rates::time_rate().unwrap();
        println!("time_rate: {r:?} (inner loop: {wall} s real, {cpu} s CPU)");
        // The interval contains the loop.
        assert!(r.real_time_s >= wall && r.proc_time_s >= cpu * 0.99, "{r:?}");
        assert!(r.utilisation > 0.0 && r.proc_time_s <= r.real_time_s * 1.01, "{r:?}");

        assert_eq!(rates::event_rate("page-faults").unwrap().count, 0);
        let buf = touch_pages(200);
        let r = rates::event_rate("page-faults").unwrap();
        std::hint::black_box(buf);
        println!("event_rate(page-faults): {r:?}");
        assert!(r.count >= 200 && r.rate > 0.0, "{r:?}");
        // A later call reports only what happened since.
        let again = rates::event_rate("page-faults").unwrap();
        assert!(again.count < 200, "{again:?}");
        rates::rate_stop().unwrap();
        assert!(matches!(rates::rate_stop(), Err(RateError::NotRunning)));
    }

    #[test]
    fn classic_counters_api() {
        let mut v = [0i64; 2];
        assert_eq!(read_counters(&mut v).unwrap_err().code(), Code::Enotrun);
        start_counters(&["task-clock", "page-faults"]).unwrap();
        assert_eq!(start_counters(&["page-faults"]).unwrap_err().code(), Code::Eisrun);
        let buf = touch_pages(300);
        read_counters(&mut v).unwrap();
        std::hint::black_box(buf);
        assert!(v[1] >= 300 && v[0] > 0, "{v:?}");
        // Reading restarted the counts.
        read_counters(&mut v).unwrap();
        assert!(v[1] < 300, "{v:?}");
        let mut acc = [0, 1000i64];
        let buf = touch_pages(100);
        accum_counters(&mut acc).unwrap();
        std::hint::black_box(buf);
        assert!(acc[1] >= 1100, "{acc:?}");
        let mut short = [0i64; 1];
        assert_eq!(accum_counters(&mut short).unwrap_err().code(), Code::Ebuf);
        stop_counters(&mut v).unwrap();
        assert_eq!(stop_counters(&mut v).unwrap_err().code(), Code::Enotrun);
        assert!(start_counters(&["no-such-event"]).unwrap_err().to_string().contains("no-such-event"));
        println!("num_counters: {}", num_counters().unwrap());
    }
}
