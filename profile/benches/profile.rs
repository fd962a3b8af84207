//! What papirus-profile costs, each beside its baseline from the same run:
//!
//! - drain throughput: ring records (IP, TID, PERIOD and a 12-frame call
//!   chain) parsed and counted by the collector, against parsing alone;
//! - overhead on the target: the hot-function target's own wall time
//!   sampled at -F 1000 (and 4000, with frame-pointer or DWARF call
//!   chains), against the same target run plain, runs interleaved.

use std::ffi::OsString;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use papirus_profile::collect::Collector;
use papirus_profile::recording::{CallGraph, TriggerInfo};
use papirus_profile::{Options, Target, record};
use papirus_substrate::sample::{Record, SampleLayout, SampleType};
use papirus_substrate::stats::median;

/// Distinct stacks in the synthetic stream, and samples in it.
const STACKS: u64 = 64;
const SAMPLES: usize = 10_000;
const DEPTH: u64 = 12;

/// A SAMPLE record as the kernel writes it for IP|TID|PERIOD|CALLCHAIN.
fn sample_record(i: u64) -> Vec<u8> {
    let chain: Vec<u64> = std::iter::once(-512i64 as u64)
        .chain((0..DEPTH).map(|d| 0x40_1000 + (i % STACKS) * 0x100 + d * 0x1_0000))
        .collect();
    let mut body = Vec::new();
    for w in [chain[1], 1000 | (1000 << 32), 1_000_000, chain.len() as u64] {
        body.extend_from_slice(&w.to_ne_bytes());
    }
    for a in &chain {
        body.extend_from_slice(&a.to_ne_bytes());
    }
    let mut r = Vec::new();
    r.extend_from_slice(&9u32.to_ne_bytes());
    r.extend_from_slice(&2u16.to_ne_bytes());
    r.extend_from_slice(&((8 + body.len()) as u16).to_ne_bytes());
    r.extend(body);
    r
}

fn drain(c: &mut Criterion) {
    let layout = SampleLayout {
        sample_type: SampleType::IP | SampleType::TID | SampleType::PERIOD | SampleType::CALLCHAIN,
        ..Default::default()
    };
    let records: Vec<Vec<u8>> = (0..SAMPLES as u64).map(sample_record).collect();
    let mut g = c.benchmark_group("drain");
    g.throughput(Throughput::Elements(SAMPLES as u64));
    g.bench_function("baseline_parse_only", |b| {
        b.iter(|| {
            for r in &records {
                black_box(Record::parse(r, &layout).unwrap());
            }
        })
    });
    g.bench_function("parse_and_collect", |b| {
        let mut col = Collector::new();
        b.iter(|| {
            for r in &records {
                col.record(&Record::parse(r, &layout).unwrap());
            }
        });
        black_box(col.samples());
    });
    g.finish();
}

fn overhead() {
    let dir = tempfile::tempdir().unwrap();
    let exe = papirus_testkit::Cc::new(papirus_testkit::target("profile_hot.c"))
        .opt("-O0")
        .args(["-fno-omit-frame-pointer", "-pthread"])
        .build(dir.path(), "profile_hot");
    let timefile = dir.path().join("ns");
    let argv = |rounds: &str| -> Vec<OsString> {
        vec![exe.clone().into(), rounds.into(), "1".into(), timefile.clone().into()]
    };
    let wall = |t: &Path| std::fs::read_to_string(t).unwrap().trim().parse::<f64>().unwrap() / 1e6;
    let configs: [(&str, Option<Options>); 5] = [
        ("plain (baseline)", None),
        ("-F 1000", Some(Options { trigger: Some(TriggerInfo::Frequency(1000)), ..Options::default() })),
        (
            "-F 1000 -g",
            Some(Options {
                trigger: Some(TriggerInfo::Frequency(1000)),
                call_graph: CallGraph::Fp,
                ..Options::default()
            }),
        ),
        (
            "-F 1000 dwarf",
            Some(Options {
                trigger: Some(TriggerInfo::Frequency(1000)),
                call_graph: CallGraph::Dwarf,
                ..Options::default()
            }),
        ),
        (
            "-F 4000 -g",
            Some(Options {
                trigger: Some(TriggerInfo::Frequency(4000)),
                call_graph: CallGraph::Fp,
                ..Options::default()
            }),
        ),
    ];
    let runs = 7;
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut samples = vec![0u64; configs.len()];
    for _ in 0..runs {
        for (i, (_, opts)) in configs.iter().enumerate() {
            match opts {
                None => {
                    let st = std::process::Command::new(&exe)
                        .args(["300", "1"])
                        .arg(&timefile)
                        .stdout(std::process::Stdio::null())
                        .status()
                        .unwrap();
                    assert_eq!(st.code(), Some(3));
                }
                Some(o) => {
                    let r = record(&Target::Command(argv("300")), o).unwrap();
                    samples[i] += r.total_samples();
                }
            }
            ms[i].push(wall(&timefile));
        }
    }
    let base = median(&ms[0]);
    println!(
        "\noverhead on the target: its own wall time, median of {runs} interleaved runs (profile_hot 300)"
    );
    for (i, (name, _)) in configs.iter().enumerate() {
        let m = median(&ms[i]);
        let per_run = samples[i] / runs as u64;
        println!("  {name:<18} {m:>9.1} ms  {:>6.3}x  {per_run:>6} samples/run", m / base);
    }
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    drain(&mut c);
    c.final_summary();
    overhead();
}
