//! Regions in two threads, then a normal exit without an explicit flush:
//! the report is written by the exit handler. `region_exit exit` leaves
//! through `std::process::exit` instead of returning from `main`.

use papirus_highlevel::{region, region_begin, region_end};

fn work(label: &str) -> Result<u64, papirus_highlevel::RegionError> {
    let _r = region(label)?;
    let mut x = 0u64;
    for i in 0..200_000u64 {
        x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
    }
    Ok(x)
}

fn main() -> Result<(), papirus_highlevel::RegionError> {
    region_begin("main")?;
    let other = std::thread::Builder::new()
        .name("worker".into())
        .spawn(|| (0..3).map(|_| work("worker_loop")).sum::<Result<u64, _>>())
        .map_err(|source| papirus_highlevel::RegionError::Io { path: "thread spawn".into(), source })?;
    let mut total = work("inner")?;
    total = total.wrapping_add(other.join().unwrap_or(Ok(0))?);
    region_end("main")?;
    println!("{total}");
    if std::env::args().nth(1).as_deref() == Some("exit") {
        std::process::exit(0);
    }
    Ok(())
}
