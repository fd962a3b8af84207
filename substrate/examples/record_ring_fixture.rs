//! Records the ring-buffer fixture the ring unit tests replay:
//! `cargo run -p papirus-substrate --example record_ring_fixture`.
//!
//! A task-clock sampler (100 µs period) with a page-faults member in its
//! group, every parsed sample field, COMM records, and a one-page ring left
//! undrained long enough to overflow, so the stream holds SAMPLE, COMM and
//! LOST records. Writes `tests/fixtures/ring/records.bin` (the records,
//! back to back, as the kernel wrote them) and `records.txt` (the layout and
//! what the stream contains).

use std::hint::black_box;
use std::time::{Duration, Instant};

use papirus_substrate::attr::consts::PERF_TYPE_SOFTWARE;
use papirus_substrate::sample::{ReadFormat, SampleType, Sampler, Sampling, SamplingEvents};
use papirus_substrate::sys::kernel;
use papirus_substrate::{EventAttr, Kind};

fn spin(d: Duration) {
    let t = Instant::now();
    let mut x = 0u64;
    while t.elapsed() < d {
        x = black_box(x.wrapping_add(1));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tc = EventAttr::new("task-clock", Kind::Software, PERF_TYPE_SOFTWARE, 1);
    let pf = EventAttr::new("page-faults", Kind::Software, PERF_TYPE_SOFTWARE, 2);
    let mut s = Sampling::period(100_000);
    s.sample_type(
        SampleType::IDENTIFIER
            | SampleType::IP
            | SampleType::TID
            | SampleType::TIME
            | SampleType::ADDR
            | SampleType::ID
            | SampleType::STREAM_ID
            | SampleType::CPU
            | SampleType::PERIOD
            | SampleType::READ
            | SampleType::CALLCHAIN,
    )
    .read_format(
        ReadFormat::GROUP
            | ReadFormat::ID
            | ReadFormat::TOTAL_TIME_ENABLED
            | ReadFormat::TOTAL_TIME_RUNNING
            | ReadFormat::LOST,
    )
    .mmap_records(true)
    .data_pages(1)
    .wakeup_events(0);
    let mut sampler = Sampler::map(SamplingEvents::open(kernel(), &tc, &s, &[pf], 0, -1)?, &s)?;
    let mut stream = Vec::new();
    sampler.events().enable()?;
    std::fs::write("/proc/thread-self/comm", "papirus-fixture")?;
    spin(Duration::from_millis(20));
    sampler.events().disable()?;
    let take = |sampler: &mut Sampler, stream: &mut Vec<u8>| {
        while let Ok(Some(r)) = sampler.ring().next_record() {
            stream.extend_from_slice(r.bytes());
        }
    };
    take(&mut sampler, &mut stream);
    // The pending loss count is written ahead of the next record.
    for _ in 0..100 {
        if Some(sampler.stats().lost) == sampler.events().read_count()?.lost {
            break;
        }
        sampler.events().enable()?;
        spin(Duration::from_micros(300));
        sampler.events().disable()?;
        take(&mut sampler, &mut stream);
    }
    let st = sampler.stats();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ring");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("records.bin"), &stream)?;
    let layout = s.layout();
    std::fs::write(
        dir.join("records.txt"),
        format!(
            "sample_type {:#x}\nread_format {:#x}\nbytes {}\nsamples {}\nlost {}\nlost_records {}\nother {}\n",
            layout.sample_type.0,
            layout.read_format.0,
            stream.len(),
            st.samples,
            st.lost,
            st.lost_records,
            st.other
        ),
    )?;
    println!("wrote {} bytes: {st:?}", stream.len());
    Ok(())
}
