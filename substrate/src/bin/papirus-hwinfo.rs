//! `papirus-hwinfo`: what this machine offers papirus — CPU, topology,
//! caches, TSC, hypervisor, hardware counters, perf PMUs — as a table, or
//! as JSON with `--json`.

use papirus_substrate::hwinfo::HwInfo;

const USAGE: &str = "usage: papirus-hwinfo [--json]";

fn main() {
    let mut json = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => {
                eprintln!("papirus-hwinfo: unknown argument `{other}`\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let info = HwInfo::collect();
    if json {
        match serde_json::to_string_pretty(&info) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("papirus-hwinfo: cannot encode JSON: {e}");
                std::process::exit(1);
            }
        }
    } else {
        print!("{info}");
    }
}
