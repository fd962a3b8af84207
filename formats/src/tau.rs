//! TAU profile directories: one `MULTI__<metric>` directory per metric,
//! one `profile.<node>.<context>.<thread>` file per thread in each, as TAU
//! writes them and ParaProf, TAU's `pprof` and Hatchet (`GraphFrame.from_tau`)
//! read them.
//!
//! Each file lists a synthetic root, `.TAU application`, first (its figures
//! whole numbers: Hatchet parses them as integers), then every function
//! (flat figures) and every call path (`.TAU application => main => solve`,
//! group `TAU_CALLPATH`), then `0 aggregates`. The `Metric Name` attribute
//! leads the metadata (Hatchet takes the first `<value>` as the metric).
//! Times are microseconds, as TAU's; counts are raw.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

/// The synthetic root every call path starts from.
pub const ROOT: &str = ".TAU application";

/// One line of a profile: a function's figures or a call path's.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The function (flat entries) or the path from below the root, root first.
    pub path: Vec<String>,
    /// Calls.
    pub calls: u64,
    /// Calls it made to instrumented functions.
    pub subrs: u64,
    /// Exclusive value per metric.
    pub excl: Vec<f64>,
    /// Inclusive value per metric.
    pub incl: Vec<f64>,
}

/// One thread's profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    /// TAU's node (a process: MPI rank, here the measured process' index).
    pub node: u32,
    /// TAU's context (0).
    pub context: u32,
    /// TAU's thread index within the node.
    pub thread: u32,
    /// Flat per-function entries.
    pub functions: Vec<Entry>,
    /// Call-path entries.
    pub paths: Vec<Entry>,
    /// Metadata attributes (name, value) after the metric name.
    pub metadata: Vec<(String, String)>,
}

/// Characters TAU replaces in a metric's directory name.
fn dir_name(metric: &str) -> String {
    metric.chars().map(|c| if "/\\?%*:|\"<> ".contains(c) { '_' } else { c }).collect()
}

/// A name as a profile line can carry it (no double quotes, no line breaks).
fn name(s: &str) -> Cow<'_, str> {
    crate::one_field(s, '"', '\'')
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The text of one thread's file for metric `m` (index into the entries' values).
fn file(t: &Thread, metric: &str, m: usize) -> String {
    let mut out = String::new();
    let lines = 1 + t.functions.len() + t.paths.len();
    let _ = writeln!(out, "{lines} templated_functions_MULTI_{}", dir_name(metric));
    let mut meta = format!("<attribute><name>Metric Name</name><value>{}</value></attribute>", xml(metric));
    for (k, v) in &t.metadata {
        let _ = write!(meta, "<attribute><name>{}</name><value>{}</value></attribute>", xml(k), xml(v));
    }
    let _ = writeln!(out, "# Name Calls Subrs Excl Incl ProfileCalls # <metadata>{meta}</metadata>");
    let top: Vec<&Entry> = t.paths.iter().filter(|e| e.path.len() == 1).collect();
    let subrs: u64 = top.iter().map(|e| e.calls).sum();
    let incl: f64 = top.iter().map(|e| e.incl.get(m).copied().unwrap_or(0.0)).sum();
    let _ = writeln!(out, "\"{ROOT}\" 1 {subrs} 0 {incl:.0} 0 GROUP=\"TAU_DEFAULT\" ");
    let mut line = |n: &str, e: &Entry, group: &str| {
        let value = |v: &[f64]| v.get(m).copied().unwrap_or(0.0).max(0.0);
        let (calls, subrs, excl, incl) = (e.calls, e.subrs, value(&e.excl), value(&e.incl));
        let _ = writeln!(out, "\"{n}\" {calls} {subrs} {excl} {incl} 0 GROUP=\"{group}\" ");
    };
    for e in &t.functions {
        line(&e.path.last().map_or(Cow::Borrowed(""), |s| name(s)), e, "TAU_USER");
    }
    for e in &t.paths {
        let mut p = ROOT.to_string();
        for f in &e.path {
            p.push_str(" => ");
            p.push_str(&name(f));
        }
        line(&p, e, "TAU_USER|TAU_CALLPATH");
    }
    out.push_str("0 aggregates\n");
    out
}

/// Writes the profile of `threads` for `metrics` (the first should be
/// `TIME`) into the directory `dir`, which must not exist yet (so nothing
/// of an older profile mixes in); nothing is left when a write fails.
pub fn write_dir(dir: &Path, metrics: &[String], threads: &[Thread]) -> io::Result<()> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if std::fs::symlink_metadata(dir).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists: a TAU profile goes into a new directory", dir.display()),
        ));
    }
    // Built in a fresh private directory beside it, then renamed into place.
    let tmp = tempfile::Builder::new().prefix(".papirus-tau-").tempdir_in(parent)?;
    for (m, metric) in metrics.iter().enumerate() {
        let sub = tmp.path().join(format!("MULTI__{}", dir_name(metric)));
        std::fs::create_dir(&sub)?;
        for t in threads {
            let path = sub.join(format!("profile.{}.{}.{}", t.node, t.context, t.thread));
            std::fs::write(path, file(t, metric, m))?;
        }
    }
    let kept = tmp.keep();
    std::fs::rename(&kept, dir).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&kept);
    })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &[&str], calls: u64, subrs: u64, excl: f64, incl: f64) -> Entry {
        Entry {
            path: path.iter().map(|s| s.to_string()).collect(),
            calls,
            subrs,
            excl: vec![excl, excl * 2.0],
            incl: vec![incl, incl * 2.0],
        }
    }

    #[test]
    fn writes_tau_s_grammar() {
        let t = Thread {
            node: 0,
            context: 0,
            thread: 1,
            functions: vec![
                entry(&["main"], 1, 3, 100.0, 1000.0),
                entry(&["solve \"x\""], 3, 0, 900.0, 900.0),
            ],
            paths: vec![
                entry(&["main"], 1, 3, 100.0, 1000.0),
                entry(&["main", "solve \"x\""], 3, 0, 900.0, 900.0),
            ],
            metadata: vec![("Node Name".into(), "a<b".into())],
        };
        let text = file(&t, "TIME", 0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "5 templated_functions_MULTI_TIME");
        assert!(lines[1].starts_with("# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value>"));
        assert!(lines[1].contains("<value>a&lt;b</value>"));
        assert_eq!(lines[2], "\".TAU application\" 1 1 0 1000 0 GROUP=\"TAU_DEFAULT\" ");
        assert_eq!(lines[4], "\"solve 'x'\" 3 0 900 900 0 GROUP=\"TAU_USER\" ");
        assert_eq!(
            lines[6],
            "\".TAU application => main => solve 'x'\" 3 0 900 900 0 GROUP=\"TAU_USER|TAU_CALLPATH\" "
        );
        assert_eq!(lines[7], "0 aggregates");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("tau");
        write_dir(&out, &["TIME".into(), "page-faults/u".into()], std::slice::from_ref(&t)).unwrap();
        assert!(out.join("MULTI__TIME/profile.0.0.1").is_file());
        let faults = std::fs::read_to_string(out.join("MULTI__page-faults_u/profile.0.0.1")).unwrap();
        assert!(faults.contains("\"main\" 1 3 200 2000 0"), "{faults}");
        assert!(write_dir(&out, &["TIME".into()], &[t]).is_err(), "an existing directory is not reused");
    }
}
