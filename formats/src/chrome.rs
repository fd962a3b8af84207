//! Chrome Trace Event Format (JSON), streamed: the object form with
//! `traceEvents` first (how Perfetto recognizes it), complete (`X`) events
//! per thread, `process_name`/`thread_name` metadata, counter (`C`)
//! events, and `displayTimeUnit`/`otherData` after the events.
//!
//! Times are written in microseconds with three decimals from integer
//! nanoseconds, so nothing is lost to float formatting. Complete events
//! carry no `args`: speedscope keys frames by name and args, so per-call
//! args would split one function into many frames.

use std::io::{self, Write};

/// A JSON string literal for `s`.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Nanoseconds as the format's microseconds, exactly.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A Chrome trace being written to `W`.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    first: bool,
}

impl<W: Write> Writer<W> {
    /// Starts the file.
    pub fn new(mut out: W) -> io::Result<Writer<W>> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        Ok(Writer { out, first: true })
    }

    fn event(&mut self, body: &str) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(body.as_bytes())
    }

    /// Names process `pid`.
    pub fn process_name(&mut self, pid: u32, name: &str) -> io::Result<()> {
        let e = format!(
            r#"{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":{}}}}}"#,
            quoted(name)
        );
        self.event(&e)
    }

    /// Names thread `tid` of process `pid`.
    pub fn thread_name(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        let e = format!(
            r#"{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{}}}}}"#,
            quoted(name)
        );
        self.event(&e)
    }

    /// A complete event: `name` ran on thread `tid` from `start_ns` for `dur_ns`.
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        start_ns: u64,
        dur_ns: u64,
    ) -> io::Result<()> {
        let e = format!(
            r#"{{"ph":"X","name":{},"cat":{},"pid":{pid},"tid":{tid},"ts":{},"dur":{}}}"#,
            quoted(name),
            quoted(cat),
            us(start_ns),
            us(dur_ns)
        );
        self.event(&e)
    }

    /// A counter track `name` of process `pid` (counters are per process in
    /// the format: name a thread's counter after its thread) at `ts_ns`.
    pub fn counter(&mut self, pid: u32, name: &str, ts_ns: u64, value: u64) -> io::Result<()> {
        let e = format!(
            r#"{{"ph":"C","name":{},"pid":{pid},"tid":0,"ts":{},"args":{{"value":{value}}}}}"#,
            quoted(name),
            us(ts_ns)
        );
        self.event(&e)
    }

    /// Ends the file with its display unit and `other` (free metadata,
    /// a JSON object); returns the writer.
    pub fn finish(mut self, other: &serde_json::Value) -> io::Result<W> {
        write!(self.out, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{other}}}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_json_object_perfetto_and_speedscope_recognize() {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.process_name(7, "demo \"x\"").unwrap();
        w.thread_name(7, 8, "worker").unwrap();
        w.complete(7, 8, "main", "function", 1_234_567, 89).unwrap();
        w.counter(7, "tid 8: page-faults", 1_234_567, 12).unwrap();
        let bytes = w.finish(&serde_json::json!({"version": 1})).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("{\"traceEvents\":["), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0]["args"]["name"], "demo \"x\"");
        assert_eq!(ev[2]["ts"].as_f64(), Some(1234.567));
        assert_eq!(ev[2]["dur"].as_f64(), Some(0.089));
        assert!(ev[2].get("args").is_none(), "no args on complete events");
        assert_eq!(ev[3]["args"]["value"], 12);
        assert_eq!(v["otherData"]["version"], 1);
    }
}
