//! Listing the functions of a large shared library, against `nm` on the
//! same file in the same run.
//!
//! The library is found at run time (libpython3.11, any libpython3, then
//! libstdc++, then libc; `PAPIRUS_BENCH_LIB=path` overrides) and printed.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use criterion::{Criterion, criterion_group, criterion_main};
use papirus_probe::inventory::Inventory;
use papirus_substrate::elf::ElfFile;

fn candidates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        std::env::var_os("PAPIRUS_BENCH_LIB").map(PathBuf::from).into_iter().collect();
    let mut dirs: Vec<PathBuf> =
        vec!["/usr/lib/x86_64-linux-gnu".into(), "/usr/lib64".into(), "/usr/lib".into()];
    if let Ok(versions) = std::fs::read_dir("/root/.pyenv/versions") {
        let mut v: Vec<PathBuf> = versions.flatten().map(|e| e.path().join("lib")).collect();
        v.sort();
        dirs.splice(0..0, v);
    }
    let files: Vec<PathBuf> =
        dirs.iter().filter_map(|d| std::fs::read_dir(d).ok()).flatten().flatten().map(|e| e.path()).collect();
    for prefix in ["libpython3.11.so", "libpython3.", "libstdc++.so", "libc.so"] {
        let mut hits: Vec<&PathBuf> = files
            .iter()
            .filter(|p| {
                p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)) && !p.is_symlink()
            })
            .collect();
        // Largest first: the real library rather than a stub like libpython3.so.
        hits.sort_by_key(|p| std::cmp::Reverse(p.metadata().map(|m| m.len()).unwrap_or(0)));
        out.extend(hits.into_iter().cloned());
    }
    out
}

fn nm(args: &[&str], file: &PathBuf) -> bool {
    Command::new("nm")
        .args(args)
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn describe(lib: &PathBuf) -> bool {
    let inv = Inventory::of_file(lib).expect("listable");
    let m = &inv.modules[0];
    let demangled = m.functions.iter().filter(|f| f.demangled.is_some()).count();
    let dynamic = m.functions.iter().filter(|f| f.table.in_dynsym()).count();
    println!(
        "library: {} ({} bytes, {} functions, {dynamic} in .dynsym, {demangled} demangled, {} PLT stubs, stripped: {})",
        lib.display(),
        lib.metadata().map(|m| m.len()).unwrap_or(0),
        m.functions.len(),
        m.plt.len(),
        m.stripped
    );
    m.stripped
}

fn bench(c: &mut Criterion) {
    let all = candidates();
    let Some(lib) = all.iter().find(|p| ElfFile::open(p).is_ok()).cloned() else {
        eprintln!("no libpython, libstdc++ or libc found: nothing to bench");
        return;
    };
    let stripped = describe(&lib);
    let has_nm = nm(&["--version"], &lib);
    if !has_nm {
        eprintln!("nm is not installed: no baseline");
    }

    let mut g = c.benchmark_group("list_functions");
    g.sample_size(10);
    g.bench_function("elf_open", |b| b.iter(|| ElfFile::open(&lib).unwrap()));
    g.bench_function("inventory_of_file", |b| b.iter(|| Inventory::of_file(&lib).unwrap()));
    g.bench_function("inventory_plus_patchability", |b| {
        b.iter(|| {
            let inv = Inventory::of_file(&lib).unwrap();
            let m = &inv.modules[0];
            m.functions.iter().filter(|f| m.patchability(f).is_patchable()).count()
        })
    });
    if has_nm {
        g.bench_function("baseline_nm_dynamic", |b| b.iter(|| assert!(nm(&["-D", "--defined-only"], &lib))));
        if !stripped {
            g.bench_function("baseline_nm_symtab", |b| b.iter(|| assert!(nm(&["--defined-only"], &lib))));
        }
    }
    g.finish();

    // Demangling cost: a C++ library, against `nm -D -C`.
    let Some(cxx) =
        all.iter().find(|p| p.to_string_lossy().contains("libstdc++") && ElfFile::open(p).is_ok())
    else {
        eprintln!("no libstdc++ found: no demangling bench");
        return;
    };
    describe(cxx);
    let mut g = c.benchmark_group("list_cxx_functions");
    g.sample_size(10);
    g.bench_function("inventory_of_file", |b| b.iter(|| Inventory::of_file(cxx).unwrap()));
    if has_nm {
        g.bench_function("baseline_nm_dynamic_demangled", |b| {
            b.iter(|| assert!(nm(&["-D", "-C", "--defined-only"], cxx)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
