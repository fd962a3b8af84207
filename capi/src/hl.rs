//! PAPI's high-level API (`PAPI_hl_region_begin`, `_read`, `_end`,
//! `_stop`) on papirus-highlevel's region counters, writing PAPI's own
//! output: `$PAPI_OUTPUT_DIRECTORY/papi_hl_output/rank_NNNNNN.json`, one
//! record per begin with its reads, in the layout PAPI's
//! `papi_hl_output_writer` reads.
//!
//! Events: `PAPI_EVENTS` (PAPI's spellings, `NAME=delta` accepted), else
//! papirus' defaults (task-clock, page-faults, context-switches, plus
//! cycles and instructions where a PMU counts them), all per thread. As in
//! PAPI, the file is written at normal exit when every begun region ended,
//! and printed after a `PAPI-HL Output:` line when `PAPI_REPORT` is set.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use papirus_highlevel::region::{self, EventSource, Reading, RegionError};

use crate::{Code, state};

/// One begin of a region in one thread.
#[derive(Debug, Clone)]
struct Record {
    name: String,
    parent: i64,
    /// Per output metric (cycles, real ns, events): the region's value,
    /// then each `PAPI_hl_read`.
    values: Vec<Vec<i64>>,
    ended: bool,
}

#[derive(Debug, Default)]
struct ThreadLog {
    records: Vec<Record>,
}

struct Open {
    id: usize,
    begin: Reading,
}

struct ThreadState {
    log: Arc<Mutex<ThreadLog>>,
    stack: Vec<Open>,
    /// `PAPI_hl_stop` was called: no region runs until the next begin.
    stopped: bool,
}

thread_local! {
    static STATE: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
}

/// Every thread's log, by thread id.
fn logs() -> MutexGuard<'static, BTreeMap<u64, Arc<Mutex<ThreadLog>>>> {
    static LOGS: Mutex<BTreeMap<u64, Arc<Mutex<ThreadLog>>>> = Mutex::new(BTreeMap::new());
    LOGS.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_log(l: &Mutex<ThreadLog>) -> MutexGuard<'_, ThreadLog> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

static BEGINS: AtomicU64 = AtomicU64::new(0);
static ENDS: AtomicU64 = AtomicU64::new(0);

/// The output names of the measured events (PAPI's spelling as given in
/// `PAPI_EVENTS`), fixed at the first region.
struct Setup {
    names: Vec<String>,
    dir: PathBuf,
}

fn setup() -> Result<&'static Setup, Code> {
    static SETUP: OnceLock<Result<Setup, Code>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            if !state::initialized() {
                state::library_init(state::VER_CURRENT)?;
            }
            // papirus' own report is not wanted: PAPI's file is written instead.
            let s = match region::Config::new().write_at_exit(false).install() {
                Ok(s) => s,
                Err(RegionError::AlreadyConfigured) => region::setup().map_err(|_| Code::Emisc)?,
                Err(_) => return Err(Code::Einval),
            };
            let given: Vec<String> = std::env::var("PAPI_EVENTS")
                .ok()
                .filter(|_| s.source == EventSource::PapiEvents)
                .and_then(|v| region::split_list(&v).ok())
                .unwrap_or_default();
            let names = s
                .events
                .iter()
                .map(|e| {
                    given
                        .iter()
                        .find(|g| region::translate(g).is_ok_and(|t| t == e.name))
                        .map(|g| g.split_once('=').map_or(g.as_str(), |(n, _)| n).to_string())
                        .unwrap_or_else(|| e.name.clone())
                })
                .collect();
            let base =
                std::env::var("PAPI_OUTPUT_DIRECTORY").map(PathBuf::from).unwrap_or_else(|_| ".".into());
            if papirus_substrate::exit::at_exit(write_at_exit).is_err() {
                return Err(Code::Enomem);
            }
            Ok(Setup { names, dir: base.join("papi_hl_output") })
        })
        .as_ref()
        .map_err(|&c| c)
}

fn read() -> Result<Reading, Code> {
    region::read_counters().map_err(|e| match e {
        RegionError::ThreadExiting => Code::Emisc,
        _ => Code::Esys,
    })
}

/// The output values of an interval: cycles, real ns, then the events
/// (papirus' virtual time is not one of PAPI's fields).
fn interval(now: &Reading, begin: &Reading) -> Vec<i64> {
    let d = now.since(begin);
    let mut v = vec![now.ticks().wrapping_sub(begin.ticks()) as i64];
    v.push(d.first().copied().unwrap_or(0));
    v.extend(d.iter().skip(2));
    v
}

fn with_thread<T>(f: impl FnOnce(&mut ThreadState) -> Result<T, Code>) -> Result<T, Code> {
    STATE
        .try_with(|s| {
            let mut s = s.borrow_mut();
            if s.is_none() {
                let log = Arc::new(Mutex::new(ThreadLog::default()));
                logs().insert(papirus_lowlevel::thread_id() as u64, log.clone());
                *s = Some(ThreadState { log, stack: vec![], stopped: false });
            }
            match s.as_mut() {
                Some(t) => f(t),
                None => Err(Code::Emisc),
            }
        })
        .unwrap_or(Err(Code::Emisc))
}

/// `PAPI_hl_region_begin`.
pub fn begin(name: &str) -> Result<c_int, Code> {
    setup()?;
    let begin = read()?;
    with_thread(|t| {
        t.stopped = false;
        let mut log = lock_log(&t.log);
        let id = log.records.len();
        let parent = t.stack.last().map_or(-1, |o| o.id as i64);
        log.records.push(Record { name: name.to_string(), parent, values: vec![], ended: false });
        drop(log);
        t.stack.push(Open { id, begin });
        BEGINS.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    })
}

/// `PAPI_hl_read`: appends a `read_N` to the innermost open region of that
/// name; OK (with nothing recorded) when none is open, as PAPI.
pub fn read_region(name: &str) -> Result<c_int, Code> {
    let now = read()?;
    with_thread(|t| {
        if lock_log(&t.log).records.is_empty() {
            return Err(Code::Emisc);
        }
        let Some(open) = t.stack.iter().rev().find(|o| lock_log(&t.log).records[o.id].name == name) else {
            return Ok(0);
        };
        let v = interval(&now, &open.begin);
        let mut log = lock_log(&t.log);
        let rec = &mut log.records[open.id];
        if rec.values.is_empty() {
            // Slot 0 is the region's value, filled at the end.
            rec.values = v.iter().map(|_| vec![0]).collect();
        }
        for (m, x) in rec.values.iter_mut().zip(v) {
            m.push(x);
        }
        Ok(0)
    })
}

/// `PAPI_hl_region_end`: `name` must be the innermost open region.
pub fn end(name: &str) -> Result<c_int, Code> {
    let now = read()?;
    with_thread(|t| {
        let mut log = lock_log(&t.log);
        if log.records.is_empty() {
            return Err(Code::Emisc);
        }
        let Some(open) = t.stack.last() else { return Err(Code::Einval) };
        if log.records[open.id].name != name {
            return Err(Code::Einval);
        }
        let v = interval(&now, &open.begin);
        let rec = &mut log.records[open.id];
        if rec.values.is_empty() {
            rec.values = v.into_iter().map(|x| vec![x]).collect();
        } else {
            for (m, x) in rec.values.iter_mut().zip(v) {
                m[0] = x;
            }
        }
        rec.ended = true;
        drop(log);
        t.stack.pop();
        ENDS.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    })
}

/// `PAPI_hl_stop`: ENOEVNT when this thread has nothing running.
pub fn stop() -> Result<c_int, Code> {
    let running = STATE.try_with(|s| s.borrow().as_ref().is_some_and(|t| !t.stopped)).unwrap_or(false);
    if !running {
        return Err(Code::Enoevnt);
    }
    with_thread(|t| {
        t.stopped = true;
        Ok(0)
    })
}

fn q(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The file's text, in PAPI's layout: two-space indent, a newline before
/// each key, every number a string.
fn render(setup: &Setup) -> String {
    let hw = papirus_lowlevel::init().ok().and_then(|l| l.hwinfo().cloned());
    let cpu = hw.as_ref().and_then(|h| h.model_name.clone()).unwrap_or_default();
    let cpu = cpu.split_whitespace().collect::<Vec<_>>().join(" ");
    let mhz = hw.as_ref().and_then(|h| h.clock.tsc_hz).map_or(0, |hz| (hz / 1e6).round() as i64);
    let mut o = String::new();
    let _ = write!(
        o,
        "{{\n  \"papi_version\":\"7.0.0.0\",\n  \"cpu_info\":{},\n  \"max_cpu_rate_mhz\":\"{mhz}\",\n  \"min_cpu_rate_mhz\":\"{mhz}\",\n  \"event_definitions\":{{",
        q(&cpu)
    );
    let comp = "perf_event";
    for (i, n) in setup.names.iter().enumerate() {
        let sep = if i + 1 < setup.names.len() { "," } else { "" };
        let _ = write!(
            o,
            "\n    {}:{{\n      \"component\":{},\n      \"type\":\"delta\"\n    }}{sep}",
            q(n),
            q(comp)
        );
    }
    o.push_str("\n  },\n  \"threads\":{");
    let mut metrics = vec!["cycles".to_string(), "real_time_nsec".to_string()];
    metrics.extend(setup.names.iter().cloned());
    let threads: Vec<Vec<Record>> = logs().values().map(|l| lock_log(l).records.clone()).collect();
    let threads: Vec<Vec<Record>> = threads.into_iter().filter(|r| !r.is_empty()).collect();
    for (ti, recs) in threads.iter().enumerate() {
        let _ = write!(o, "\n    \"{ti}\":{{\n      \"regions\":{{");
        let recs: Vec<(usize, &Record)> = recs.iter().enumerate().filter(|(_, r)| r.ended).collect();
        for (k, (id, r)) in recs.iter().enumerate() {
            let _ = write!(
                o,
                "\n        \"{id}\":{{\n          \"name\":{},\n          \"parent_region_id\":\"{}\"",
                q(&r.name),
                r.parent
            );
            for (m, vals) in metrics.iter().zip(&r.values) {
                if vals.len() == 1 {
                    let _ = write!(o, ",\n          {}:\"{}\"", q(m), vals[0]);
                } else {
                    let _ =
                        write!(o, ",\n          {}:{{\n            \"region_value\":\"{}\"", q(m), vals[0]);
                    for (j, v) in vals.iter().enumerate().skip(1) {
                        let _ = write!(o, ",\n            \"read_{j}\":\"{v}\"");
                    }
                    o.push_str("\n          }");
                }
            }
            o.push_str(if k + 1 < recs.len() { "\n        }," } else { "\n        }" });
        }
        o.push_str(if ti + 1 < threads.len() { "\n      }\n    }," } else { "\n      }\n    }" });
    }
    o.push_str("\n  }\n}\n");
    o
}

fn rank() -> u64 {
    ["OMPI_COMM_WORLD_RANK", "ALPS_APP_PE", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or(u64::from(std::process::id()) % 1_000_000)
}

/// Writes the output now; the file's path.
fn write_now(setup: &Setup) -> std::io::Result<PathBuf> {
    let mut b = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.recursive(true).create(&setup.dir)?;
    let text = render(setup);
    let mut r = rank();
    loop {
        let path = setup.dir.join(format!("rank_{r:06}.json"));
        // create_new: never follows a planted link or truncates another run's file.
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(text.as_bytes())?;
                if std::env::var_os("PAPI_REPORT").is_some() {
                    println!("PAPI-HL Output:\n{text}");
                }
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => r += 1,
            Err(e) => return Err(e),
        }
    }
}

extern "C" fn write_at_exit() {
    static DONE: AtomicBool = AtomicBool::new(false);
    let _ = std::panic::catch_unwind(|| {
        if DONE.swap(true, Ordering::Relaxed) {
            return;
        }
        // Registered by a successful setup, so this only reads it.
        let Ok(setup) = setup() else { return };
        let (b, e) = (BEGINS.load(Ordering::Relaxed), ENDS.load(Ordering::Relaxed));
        if b == 0 {
            return;
        }
        if b != e {
            eprintln!(
                "PAPI-HL Warning: {b} regions began and {e} ended: not writing the output (end every region)"
            );
            return;
        }
        if let Err(err) = write_now(setup) {
            eprintln!("PAPI-HL Error: cannot write {}: {err}", setup.dir.display());
        }
    });
}
