//! The project's C programs, one per area, each run three ways.

use crate::common::{Lib, assert_ok, assert_on_papirus, kv, programs, run};

/// Runs program `name` on papirus both ways (its own header; Debian's
/// binary with papirus' library first), then on Debian's PAPI: when PAPI
/// passes it too, the results they print agree (time within 5 points).
fn both_ways(name: &str, envs: &[(&str, &str)]) {
    let p = &programs()[name];
    let mine = run(&p.papirus, Lib::Papirus, envs);
    assert_ok(&format!("{name} built on papirus' papi.h"), &mine);
    assert_on_papirus(name, &mine);
    let Some(deb) = &p.debian else {
        papirus_testkit::skip(format!(
            "{name}: Debian's libpapi-dev is not available: {:?}",
            crate::common::env().debian
        ));
        return;
    };
    let subst = run(deb, Lib::Papirus, envs);
    assert_ok(&format!("{name} built on Debian's papi.h, run on papirus"), &subst);
    assert_on_papirus(name, &subst);
    let real = run(deb, Lib::Debian, envs);
    if !real.status.success() {
        println!(
            "{name}: Debian's PAPI fails it here ({}), papirus passes:\n{}",
            real.status,
            String::from_utf8_lossy(&real.stderr).lines().take(5).collect::<Vec<_>>().join("\n")
        );
        return;
    }
    let (a, b) = (kv(&mine), kv(&real));
    for (k, v) in &a {
        let Some(w) = b.get(k) else { continue };
        if k == "library" {
            continue;
        }
        if k.ends_with("_percent") {
            let (x, y): (f64, f64) = (v.parse().unwrap(), w.parse().unwrap());
            assert!((x - y).abs() <= 5.0, "{name} {k}: papirus {x}, PAPI {y}");
        } else {
            assert_eq!(v, w, "{name} {k}: papirus and PAPI disagree");
        }
    }
    let agreed: Vec<&String> = a.keys().filter(|k| *k != "library" && b.contains_key(*k)).collect();
    println!("{name}: papirus and Debian's PAPI agree on {agreed:?}");
}

#[test]
fn eventsets_and_state_rules() {
    both_ways("eventsets", &[]);
}

#[test]
fn names_and_codes() {
    both_ways("names", &[]);
}

#[test]
fn options() {
    both_ways("options", &[]);
}

#[test]
fn components() {
    both_ways("components", &[]);
}

#[test]
fn timers() {
    both_ways("timers", &[]);
}

#[test]
fn overflow() {
    both_ways("overflow", &[]);
}

#[test]
fn profil_and_sprofil() {
    both_ways("profil", &[]);
}

#[test]
fn threads_pthreads_and_openmp() {
    both_ways("threads", &[]);
}

#[test]
fn fork_and_exec() {
    both_ways("forkexec", &[]);
}

#[test]
fn rates() {
    both_ways("rates", &[]);
}

#[test]
fn info_queries() {
    both_ways("info", &[]);
}
