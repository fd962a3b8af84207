//! The high-level API's output under papirus, read by PAPI's own
//! `papi_hl_output_writer` (Debian's papi-tools).

use std::process::Command;

use papirus_testkit::{debian_package, runs, skip};

use crate::common::{Lib, assert_ok, assert_on_papirus, programs, run};

#[test]
fn hl_output_is_read_by_papis_writer() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let envs = [("PAPI_EVENTS", "perf::TASK-CLOCK,perf::PAGE-FAULTS"), ("PAPI_OUTPUT_DIRECTORY", dir)];
    let o = run(&programs()["hl"].papirus, Lib::Papirus, &envs);
    assert_ok("hl", &o);
    assert_on_papirus("hl", &o);
    let files: Vec<_> = std::fs::read_dir(out.path().join("papi_hl_output")).unwrap().collect();
    assert_eq!(files.len(), 1, "one rank file");
    let path = files[0].as_ref().unwrap().path();
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["papi_version"], "7.0.0.0");
    assert_eq!(v["event_definitions"]["perf::TASK-CLOCK"]["component"], "perf_event");
    let regions = &v["threads"]["0"]["regions"];
    let num = |x: &serde_json::Value| x.as_str().unwrap().parse::<i64>().unwrap();
    assert_eq!(regions["0"]["name"], "computation");
    assert_eq!(regions["1"]["name"], "inner");
    assert_eq!(regions["1"]["parent_region_id"], "0");
    assert_eq!(regions["2"]["name"], "computation");
    // computation: 500 + 300 + 200 fresh pages; inner: 300 before its read, 500 in all.
    let pf = |r: &str| num(&regions[r]["perf::PAGE-FAULTS"]);
    assert!((1000..1100).contains(&pf("0")), "{}", pf("0"));
    let inner = &regions["1"]["perf::PAGE-FAULTS"];
    assert!((500..560).contains(&num(&inner["region_value"])), "{inner}");
    assert!((300..340).contains(&num(&inner["read_1"])), "{inner}");
    assert!((100..130).contains(&pf("2")), "{}", pf("2"));
    let tc = num(&regions["0"]["perf::TASK-CLOCK"]);
    assert!(tc >= 20_000_000, "computation spun 20 ms of CPU: {tc}");

    if let Err(e) = debian_package("papi-tools", || runs("sh", &["-c", "command -v papi_hl_output_writer"])) {
        skip(format!("papi-tools (papi_hl_output_writer) is not available: {e}"));
        return;
    }
    let w = Command::new("papi_hl_output_writer")
        .args(["--source", "papi_hl_output", "--type", "summary"])
        .current_dir(out.path())
        .output()
        .unwrap();
    assert_ok("papi_hl_output_writer", &w);
    let sum: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("papi_sum.json")).unwrap()).unwrap();
    assert_eq!(sum["computation"]["Region count"], 2);
    assert_eq!(sum["inner"]["Region count"], 1);
    let total = sum["computation"]["perf::PAGE-FAULTS"]["total"].as_i64().unwrap();
    assert_eq!(total, pf("0") + pf("2"), "the writer sums papirus' counts");
    assert_eq!(sum["inner"]["perf::PAGE-FAULTS"].as_i64().unwrap(), num(&inner["region_value"]));
    assert!(sum["computation"]["CPU time in s"].as_f64().unwrap() > 0.0);
}
