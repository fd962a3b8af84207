//! The function inventory and `papirus-probe list`, checked against `nm`,
//! `strip`, and running processes built by the tests themselves.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use papirus_probe::inventory::{Inventory, Patchability, Reason};
use papirus_substrate::elf::{ElfFile, SymbolKind};
use papirus_testkit::{Cc, skip};
use serde_json::Value;

/// A private scratch directory (mkdtemp), removed on drop.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        Scratch(tempfile::Builder::new().prefix(&format!("papirus-inventory-{tag}-")).tempdir().unwrap())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// A child killed and reaped on drop, so a failing test leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const C_PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((noinline)) static int helper(int x) { return x * 3 + 1; }
__attribute__((noinline, weak)) int weak_fn(int x) { return x + helper(x); }
__attribute__((noinline)) int global_fn(const char *s) { return (int)strlen(s) + weak_fn(2); }
int counter;
int main(int argc, char **argv) {
    printf("main=%p puts=%p helper=%p\n", (void *)&main, (void *)&puts, (void *)&helper);
    fflush(stdout);
    counter = global_fn(argv[0]);
    if (argc > 1) {
        char buf[8];
        /* Wait until the test closes stdin. */
        while (read(0, buf, sizeof buf) > 0) {}
    }
    return counter > 0 ? 0 : 1;
}
"#;

const CPP_PROGRAM: &str = r#"
#include <cstdio>
#include <string>
#include <vector>
namespace geo {
struct Shape { virtual ~Shape() {} virtual double area() const = 0; };
struct Square : Shape { double s; explicit Square(double s) : s(s) {} double area() const override { return s * s; } };
__attribute__((noinline)) double total(const std::vector<Shape *> &v) { double t = 0; for (auto *p : v) t += p->area(); return t; }
template <typename T> __attribute__((noinline)) T twice(T x) { return x + x; }
}
int main() {
    geo::Square a(2), b(3);
    std::vector<geo::Shape *> v{&a, &b};
    std::string s = "x";
    std::printf("%g %d %s\n", geo::total(v), geo::twice(21), geo::twice(s).c_str());
    return 0;
}
"#;

/// Entry shapes for the patchability pre-check, in assembly so the bytes are known.
const ASM_FUNCTIONS: &str = r#"
__asm__(
    ".text\n"
    ".globl f_ret_first\n.type f_ret_first,@function\nf_ret_first:\n ret\n nop\n nop\n nop\n nop\n nop\n nop\n nop\n.size f_ret_first,.-f_ret_first\n"
    ".globl f_tiny\n.type f_tiny,@function\nf_tiny:\n xor %eax,%eax\n ret\n.size f_tiny,.-f_tiny\n"
    ".globl f_endbr\n.type f_endbr,@function\nf_endbr:\n endbr64\n push %rbp\n mov %rsp,%rbp\n pop %rbp\n xor %eax,%eax\n ret\n.size f_endbr,.-f_endbr\n"
    ".globl f_thunk\n.type f_thunk,@function\nf_thunk:\n {disp32} jmp f_endbr\n.size f_thunk,.-f_thunk\n"
    ".globl f_riprel\n.type f_riprel,@function\nf_riprel:\n mov counter(%rip),%eax\n ret\n.size f_riprel,.-f_riprel\n"
    ".globl f_int3\n.type f_int3,@function\nf_int3:\n nop\n int3\n nop\n nop\n nop\n ret\n.size f_int3,.-f_int3\n"
    ".globl f_early_jmp\n.type f_early_jmp,@function\nf_early_jmp:\n jmp 1f\n nop\n nop\n nop\n1: ret\n.size f_early_jmp,.-f_early_jmp\n"
    ".globl f_call\n.type f_call,@function\nf_call:\n call f_endbr\n ret\n.size f_call,.-f_call\n"
    ".globl f_nosize\n.type f_nosize,@function\nf_nosize:\n nop\n nop\n nop\n nop\n nop\n ret\n"
    ".globl f_short_body\n.type f_short_body,@function\nf_short_body:\n push %rbp\n pop %rbp\n ret\n nop\n nop\n.size f_short_body,.-f_short_body\n"
);
int counter;
int main(void) { return 0; }
"#;

/// Compiles `source` (C, or C++ for `ext` "cpp") at -O1 into `dir/name`.
fn compile(dir: &Scratch, ext: &str, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    Cc::from_text(dir.0.path(), &format!("{name}.{ext}"), source)
        .opt("-O1")
        .args(flags)
        .build(dir.0.path(), name)
}

/// Runs a tool, `None` with the reason printed when it is not installed.
fn tool(cmd: &str, args: &[&str], file: &Path) -> Option<String> {
    match Command::new(cmd).args(args).arg(file).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => panic!("{cmd} {args:?} {} failed: {}", file.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            papirus_testkit::skip(format!("cannot run {cmd}: {e}"));
            None
        }
    }
}

fn probe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_papirus-probe")).args(args).output().expect("papirus-probe runs")
}

/// `papirus-probe list ARGS --json`, parsed.
fn list_json(args: &[&str]) -> Value {
    let out = probe(&[&["list", "--json"], args].concat());
    assert!(out.status.success(), "list {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["format_version"], 1);
    v
}

/// (name, address, size) of the code symbols `nm` prints with `nm_args`,
/// keeping the types in `types` whose address lies in an executable
/// section (`W` also covers weak data such as `data_start`).
fn nm_functions(file: &Path, nm_args: &[&str], types: &[&str]) -> Option<BTreeSet<(String, u64, u64)>> {
    let elf = ElfFile::open(file).unwrap();
    let in_code =
        |a: u64| elf.sections().iter().any(|s| s.executable && (s.address..s.address + s.size).contains(&a));
    let symbols = papirus_testkit::nm(file, nm_args)?;
    Some(
        symbols
            .into_iter()
            .filter(|s| types.contains(&s.kind.as_str()) && in_code(s.address))
            .map(|s| (s.name, s.address, s.size))
            .collect(),
    )
}

/// (name, address, size) of a module's functions in `list --json` output;
/// `versioned` renders versions the way `nm -D` does.
fn listed(module: &Value, versioned: bool, filter: impl Fn(&Value) -> bool) -> BTreeSet<(String, u64, u64)> {
    module["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| filter(f))
        .map(|f| {
            let mut name = f["name"].as_str().unwrap().to_string();
            if versioned && let Some(v) = f["version"].as_str() {
                name =
                    format!("{name}{}{v}", if f["hidden_version"].as_bool().unwrap() { "@" } else { "@@" });
            }
            (name, f["address"].as_u64().unwrap(), f["size"].as_u64().unwrap())
        })
        .collect()
}

fn in_symtab(f: &Value) -> bool {
    matches!(f["table"].as_str(), Some("symtab" | "both"))
}

fn in_dynsym(f: &Value) -> bool {
    matches!(f["table"].as_str(), Some("dynsym" | "both"))
}

/// Acceptance 1: `list` agrees with `nm --defined-only -S` (T, t, W) both
/// ways on a C program, and, after `strip`, with `nm -D`.
#[test]
fn c_program_agrees_with_nm_and_strip() {
    let dir = Scratch::new("c");
    let exe = compile(&dir, "c", "prog", C_PROGRAM, &["-rdynamic"]);
    let Some(expected) = nm_functions(&exe, &["--defined-only", "-S"], &["T", "t", "W"]) else { return };
    let v = list_json(&[exe.to_str().unwrap()]);
    let module = &v["modules"][0];
    assert_eq!(module["stripped"], false);
    assert_eq!(module["is_main"], true);
    let got = listed(module, false, in_symtab);
    assert_eq!(got, expected, "list vs nm --defined-only -S");
    for name in ["main", "helper", "weak_fn", "global_fn"] {
        assert!(got.iter().any(|(n, _, size)| n == name && *size > 0), "{name} missing or sizeless");
    }

    let stripped = dir.path("prog.stripped");
    let status = Command::new("strip").arg("-o").arg(&stripped).arg(&exe).status();
    match status {
        Ok(s) => assert!(s.success()),
        Err(e) => {
            papirus_testkit::skip(format!("the strip half: cannot run strip: {e}"));
            return;
        }
    }
    let v = list_json(&[stripped.to_str().unwrap()]);
    let module = &v["modules"][0];
    assert_eq!(module["stripped"], true);
    let Some(expected) = nm_functions(&stripped, &["-D", "--defined-only", "-S"], &["T", "W", "i"]) else {
        return;
    };
    let got = listed(module, false, in_dynsym);
    assert_eq!(got, expected, "stripped: list vs nm -D");
    assert!(got.iter().any(|(n, _, _)| n == "global_fn"), "exported functions survive strip");
    assert!(!got.iter().any(|(n, _, _)| n == "helper"), "static functions do not");
    let table = String::from_utf8(probe(&["list", stripped.to_str().unwrap()]).stdout).unwrap();
    assert!(table.contains("stripped: dynamic symbols only"), "{table}");
}

/// Acceptance 1 on libc: every defined dynamic function, versions included, as `nm -D` lists it.
#[test]
fn libc_agrees_with_nm_dynamic() {
    let libc =
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
    let Some(libc) = libc else {
        papirus_testkit::skip("no glibc libc.so.6 in the usual places");
        return;
    };
    let Some(expected) = nm_functions(&libc, &["-D", "--defined-only", "-S"], &["T", "t", "W", "i"]) else {
        return;
    };
    let v = list_json(&[libc.to_str().unwrap()]);
    let got = listed(&v["modules"][0], true, in_dynsym);
    assert!(expected.len() > 1000, "libc exports thousands of functions, nm saw {}", expected.len());
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let extra: Vec<_> = got.difference(&expected).take(5).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}");
}

/// C++ names are demangled as `nm -C` demangles them, and the glob filter
/// matches demangled names.
#[test]
fn cpp_names_are_demangled() {
    let dir = Scratch::new("cpp");
    let exe = compile(&dir, "cpp", "shapes", CPP_PROGRAM, &[]);
    let Some(nm_c) = tool("nm", &["--defined-only", "-C"], &exe) else { return };
    let Some(nm_raw) = tool("nm", &["--defined-only"], &exe) else { return };
    // The same lines in the same order: mangled and demangled side by side.
    let pairs: Vec<(String, String)> = nm_raw
        .lines()
        .zip(nm_c.lines())
        .filter_map(|(raw, dem)| {
            let raw_name = raw.splitn(3, ' ').nth(2)?;
            let dem_name = dem.splitn(3, ' ').nth(2)?;
            raw_name.starts_with("_Z").then(|| (raw_name.to_string(), dem_name.to_string()))
        })
        .collect();
    let inv = Inventory::of_file(&exe).unwrap();
    let module = &inv.modules[0];
    let mut compared = 0;
    for f in module.functions.iter().filter(|f| f.name.starts_with("_Z")) {
        let (_, want) = pairs.iter().find(|(raw, _)| *raw == f.name).expect("nm lists every function");
        assert_eq!(f.demangled.as_deref(), Some(want.as_str()), "{}", f.name);
        compared += 1;
    }
    assert!(compared >= 5, "only {compared} C++ functions compared");
    for name in [
        "geo::total(std::vector<geo::Shape*, std::allocator<geo::Shape*> > const&)",
        "int geo::twice<int>(int)",
        "geo::Square::area() const",
    ] {
        assert!(module.functions.iter().any(|f| f.demangled.as_deref() == Some(name)), "{name} not listed");
    }
    assert!(module.function("geo::Square::area").is_some(), "lookup without the parameter list");

    let v = list_json(&[exe.to_str().unwrap(), "--functions", "geo::*"]);
    let names: Vec<&str> = v["modules"][0]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["demangled"].as_str().unwrap())
        .collect();
    assert!(names.len() >= 3, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("geo::")), "{names:?}");
}

/// `list --pid`: the executable and libc at run-time addresses that equal
/// what the running program prints for `&main`, `&helper` and `&puts`.
#[test]
fn running_process_addresses_match() {
    let dir = Scratch::new("pid");
    let exe = compile(&dir, "c", "waiter", C_PROGRAM, &[]);
    let child = Command::new(&exe).arg("wait").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut child = Reaped(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let printed = |key: &str| {
        let field = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).unwrap();
        u64::from_str_radix(field.trim_start_matches("0x"), 16).unwrap()
    };
    let pid = child.0.id().to_string();

    let v = list_json(&["--pid", &pid]);
    let modules = v["modules"].as_array().unwrap();
    let main_mod = modules.iter().find(|m| m["is_main"] == true).expect("the executable is listed");
    assert!(main_mod["path"].as_str().unwrap().ends_with("/waiter"));
    let addr_of = |m: &Value, name: &str| {
        m["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .map(|f| f["address"].as_u64().unwrap())
    };
    assert_eq!(addr_of(main_mod, "main"), Some(printed("main")), "main at its run-time address");
    assert_eq!(addr_of(main_mod, "helper"), Some(printed("helper")));
    let bias = main_mod["load_bias"].as_u64().unwrap();
    assert_ne!(bias, 0, "a PIE is loaded at a non-zero bias");
    let text = main_mod["text"].as_array().unwrap();
    assert!((text[0].as_u64().unwrap()..text[1].as_u64().unwrap()).contains(&printed("main")));

    let libc =
        modules.iter().find(|m| m["path"].as_str().unwrap().contains("libc.so")).expect("libc is listed");
    assert_eq!(addr_of(libc, "puts"), Some(printed("puts")), "libc's puts at its run-time address");
    assert_eq!(libc["is_main"], false);
    let inv = Inventory::of_process(child.0.id() as i32).unwrap();
    let libc = inv.module("libc.so.6").expect("found by basename");
    assert_eq!(libc.elf().soname(), Some("libc.so.6"));
    assert_eq!(libc.function("puts").map(|f| f.address), Some(printed("puts")));
    assert_eq!(inv.function_at(printed("puts")).map(|(m, _)| m.basename()), Some("libc.so.6".to_string()));

    // --module selects by basename; the table names the module and its bias.
    let table = String::from_utf8(probe(&["list", "--pid", &pid, "--module", "waiter", "-f", "main"]).stdout)
        .unwrap();
    assert!(table.contains(&format!("load bias {bias:#x}")), "{table}");
    assert!(table.contains(&format!("{:#018x}", printed("main"))), "{table}");
    assert!(!table.contains("libc"), "{table}");

    drop(child.0.stdin.take());
    let status = child.0.wait().unwrap();
    assert!(status.success(), "the listed process ran on unharmed: {status}");
}

/// `list --libs`: the shared objects a program needs, as `ldd` finds them,
/// including one found through `$ORIGIN` in RUNPATH; a missing one is reported.
#[test]
fn needed_libraries_match_ldd() {
    let dir = Scratch::new("libs");
    std::fs::create_dir_all(dir.path("lib")).unwrap();
    // The library itself needs libm: a dependency found transitively.
    let lib = Cc::from_text(dir.0.path(), "shapes_lib.c", "int papirus_lib_fn(int x) { return x * 7; }\n")
        .opt("-O1")
        .shared()
        .args(["-Wl,--no-as-needed", "-lm"])
        .build(&dir.path("lib"), "libpapirus_t.so");
    let main = "int papirus_lib_fn(int);\nint main(int c, char **v) { (void)v; return papirus_lib_fn(c) == 7 ? 0 : 1; }\n";
    let exe = Cc::from_text(dir.0.path(), "uses_lib.c", main)
        .args(["-Wl,--no-as-needed", "-Wl,-rpath,$ORIGIN/lib", "-L"])
        .arg(dir.path("lib"))
        .arg("-lpapirus_t")
        .build(dir.0.path(), "uses_lib");
    let Some(ldd) = tool("ldd", &[], &exe) else { return };
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let expected: BTreeSet<PathBuf> = ldd
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once(" => ") {
                Some((_, rest)) => rest.split(" (").next()?,
                None => l.split(" (").next().filter(|p| p.starts_with('/'))?,
            };
            Some(canon(path))
        })
        .collect();
    assert!(expected.contains(&canon(lib.to_str().unwrap())), "ldd: {ldd}");
    assert!(expected.iter().any(|p| p.to_string_lossy().contains("libm.so")), "ldd: {ldd}");

    let v = list_json(&[exe.to_str().unwrap(), "--libs"]);
    assert_eq!(v["unresolved"].as_array().unwrap().len(), 0, "{}", v["unresolved"]);
    let modules = v["modules"].as_array().unwrap();
    assert_eq!(modules[0]["is_main"], true);
    let got: BTreeSet<PathBuf> = modules[1..].iter().map(|m| canon(m["path"].as_str().unwrap())).collect();
    assert_eq!(got, expected, "list --libs vs ldd");
    let own = modules.iter().find(|m| m["path"].as_str().unwrap().ends_with("libpapirus_t.so")).unwrap();
    assert!(own["functions"].as_array().unwrap().iter().any(|f| f["name"] == "papirus_lib_fn"));

    // Without the library, it is reported and the rest still listed.
    std::fs::remove_file(&lib).unwrap();
    let out = probe(&["list", exe.to_str().unwrap(), "--libs", "--module", "libc"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("libpapirus_t.so (needed by") && err.contains("not found"), "{err}");
}

/// A position-dependent executable (bias 0) whose file was deleted while
/// it runs: found through /proc/PID/map_files, addresses still right.
#[test]
fn deleted_non_pie_executable() {
    let dir = Scratch::new("deleted");
    let exe = compile(&dir, "c", "gone", C_PROGRAM, &["-no-pie"]);
    let child = Command::new(&exe).arg("wait").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut child = Reaped(child);
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let main_printed = line.split_whitespace().find_map(|w| w.strip_prefix("main=0x")).unwrap();
    let main_printed = u64::from_str_radix(main_printed, 16).unwrap();
    std::fs::remove_file(&exe).unwrap();

    let inv = Inventory::of_process(child.0.id() as i32).unwrap();
    let m = inv.main_module().expect("the deleted executable is still listed");
    assert!(m.path.to_string_lossy().ends_with("gone (deleted)"), "{}", m.path.display());
    assert_eq!(m.kind, papirus_substrate::elf::ElfKind::Executable);
    assert_eq!(m.load_bias, 0, "ET_EXEC runs at its link addresses");
    assert_eq!(m.function("main").map(|f| f.address), Some(main_printed));
    assert_eq!(inv.function_at(main_printed + 1).map(|(_, f)| f.name.as_str()), Some("main"));
    drop(child.0.stdin.take());
    assert!(child.0.wait().unwrap().success());
}

/// The patchability pre-check on entries whose bytes the test wrote in assembly.
#[test]
fn patchability_precheck() {
    let dir = Scratch::new("patch");
    let exe = compile(&dir, "c", "shapes", ASM_FUNCTIONS, &[]);
    let inv = Inventory::of_file(&exe).unwrap();
    let m = &inv.modules[0];
    let check =
        |name: &str| m.patchability(m.function(name).unwrap_or_else(|| panic!("{name} not listed"))).clone();
    let reason = |name: &str| match check(name) {
        Patchability::NotPatchable { reason } => reason,
        p => panic!("{name}: expected not patchable, got {p}"),
    };
    let prologue = |name: &str| match check(name) {
        Patchability::Patchable(p) => p,
        p => panic!("{name}: expected patchable, got {p}"),
    };

    let refused = |name: &str| match reason(name) {
        Reason::Refused { why } => why,
        r => panic!("{name}: expected the patcher's refusal, got {r}"),
    };
    // Too short for a 5-byte jump, f_endbr (entered by f_thunk) right after
    // it, and the only dead padding in a hop's reach lies before two other
    // functions, which the hop's patch would rewrite: refused, as `run` refuses it.
    let tiny = reason("f_tiny");
    assert!(
        matches!(&tiny, Reason::Entered { why, .. } if why.ends_with("without other code between")),
        "{tiny}"
    );
    assert!(refused("f_int3").starts_with("`int3` at +0x1 ends the code"));
    assert_eq!(reason("f_nosize"), Reason::UnknownSize);
    // A return or jump within the first 5 bytes: what follows it is overwritten, not moved.
    for (name, instructions) in [("f_ret_first", 1), ("f_early_jmp", 1), ("f_short_body", 3)] {
        let p = prologue(name);
        assert_eq!((p.instructions, p.length), (instructions, 5), "{name}");
    }

    let p = prologue("f_endbr");
    assert!(p.endbr64);
    assert_eq!((p.offset, p.length, p.instructions), (4, 5, 3), "push, mov, pop after endbr64");
    let p = prologue("f_thunk");
    assert!(p.relative_branch && !p.endbr64);
    assert_eq!((p.length, p.instructions), (5, 1));
    let p = prologue("f_riprel");
    assert!(p.rip_relative);
    assert_eq!((p.length, p.instructions), (6, 1));
    let p = prologue("f_call");
    assert!(p.relative_branch);
    assert_eq!(p.length, 5);
    assert_eq!(m.function("f_call").unwrap().kind, SymbolKind::Function);

    // The CLI shows the same verdicts.
    let v = list_json(&[exe.to_str().unwrap(), "--patchable", "--functions", "f_*"]);
    let funcs = v["modules"][0]["functions"].as_array().unwrap();
    assert_eq!(funcs.len(), 10);
    let int3 = funcs.iter().find(|f| f["name"] == "f_int3").unwrap();
    assert_eq!(int3["patchability"]["status"], "not_patchable");
    assert_eq!(int3["patchability"]["reason"]["kind"], "refused");
    let table =
        String::from_utf8(probe(&["list", exe.to_str().unwrap(), "--patchable", "-f", "f_int3"]).stdout)
            .unwrap();
    assert!(table.contains("no: `int3` at +0x1"), "{table}");
}

/// Bad input: each a clear error and a failing exit status, no panic.
#[test]
fn bad_input_is_a_clear_error() {
    let dir = Scratch::new("bad");
    let fails_with = |args: &[&str], needle: &str| {
        let out = probe(args);
        let err = String::from_utf8_lossy(&out.stderr);
        // 125: papirus-probe's own failure, in every subcommand (`--help`, Exit status).
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    fails_with(&["list", "/nonexistent/papirus/prog"], "No such file");
    fails_with(&["list", "no-such-program-papirus"], "not found");
    let text = dir.path("notes.txt");
    std::fs::write(&text, "not a program\n").unwrap();
    fails_with(&["list", text.to_str().unwrap()], "not an ELF file");
    fails_with(&["list", dir.0.path().to_str().unwrap()], "is a directory, not a regular file");
    fails_with(&["list", "--pid", "99999999"], "no process with pid 99999999");
    fails_with(&["list", "--pid=-5"], "no process with pid -5");
    // kthreadd (pid 2) is a kernel thread in the initial pid namespace.
    if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
        fails_with(&["list", "--pid", "2"], "kernel thread or a zombie");
    } else {
        papirus_testkit::skip("the kernel-thread case: pid 2 is not kthreadd in this pid namespace");
    }
    // A zombie: a child that exited and is not reaped yet.
    let mut zombie = Reaped(Command::new("true").spawn().unwrap());
    let pid = zombie.0.id();
    let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    for _ in 0..200 {
        if stat().contains(") Z ") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(stat().contains(") Z "), "child did not become a zombie: {}", stat());
    fails_with(&["list", "--pid", &pid.to_string()], "kernel thread or a zombie");
    let _ = zombie.0.wait();
    let me = std::env::current_exe().unwrap();
    fails_with(&["list", me.to_str().unwrap(), "--module", "nomatch"], "no module matches `nomatch`");
    // A stripped static executable has neither .symtab nor .dynsym.
    match Cc::from_text(dir.0.path(), "static.c", "int main(void) { return 0; }\n")
        .args(["-static", "-s"])
        .try_build(dir.0.path(), "static")
    {
        Ok(exe) => fails_with(&["list", exe.to_str().unwrap()], "no function symbols"),
        Err(e) => skip(format!("the symbol-less case: no static libc here: {e}")),
    }
    not_permitted();
    let out = probe(&["list"]);
    assert_eq!(out.status.code(), Some(125), "a usage error is papirus-probe's own failure");
}

/// Another user's process: listing it as `nobody` is refused with the reason.
fn not_permitted() {
    // Only root can switch to nobody.
    let uid = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix("Uid:").map(|r| r.split_whitespace().next().unwrap_or("").to_string())
        })
    });
    if uid.as_deref() != Some("0") {
        papirus_testkit::skip("the other-user case: needs root to run the tool as nobody");
        return;
    }
    let target = Reaped(Command::new("sleep").arg("30").spawn().unwrap());
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_papirus-probe"),
            "list",
            "--pid",
        ])
        .arg(target.0.id().to_string())
        .output();
    match out {
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("papirus-probe: error:") => {
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(125), "{err}");
            assert!(err.contains("cannot read /proc/") && err.contains("same uid or root"), "{err}");
        }
        Ok(o) => {
            assert!(!o.status.success(), "nobody listed root's process");
            eprintln!(
                "skipping the other-user case: nobody cannot run the tool here: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Err(e) => papirus_testkit::skip(format!("the other-user case: cannot run setpriv: {e}")),
    }
}
