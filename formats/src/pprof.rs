//! pprof's `profile.proto`, gzip-compressed, as `go tool pprof`,
//! speedscope and Perfetto read it.
//!
//! Each distinct frame name becomes one `Function` and one `Location` with a
//! single `Line` (the location id equals the function id); samples list
//! their locations leaf first, as the format requires; string 0 is `""`.
//! The messages are derived here with `prost` (no `protoc`, no build
//! script), field numbers as in google/pprof's `proto/profile.proto`.

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message as _;

mod proto {
    //! The subset of `profile.proto` papirus writes.
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
    }
}

/// A label's value: a string, or a number with an optional unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelValue<'a> {
    /// `thread: worker-1`.
    Str(&'a str),
    /// `tid: 4242`, with a unit such as `bytes` or none.
    Num(i64, Option<&'a str>),
}

/// A key/value attached to a sample; `go tool pprof -tagfocus` filters on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label<'a> {
    /// The key (`pprof::` keys are reserved).
    pub key: &'a str,
    /// The value.
    pub value: LabelValue<'a>,
}

/// A sample whose values do not match the profile's sample types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueCountMismatch {
    /// Values given.
    pub given: usize,
    /// Sample types of the profile.
    pub expected: usize,
}

impl std::fmt::Display for ValueCountMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a pprof sample with {} values in a profile of {} sample types", self.given, self.expected)
    }
}

impl std::error::Error for ValueCountMismatch {}

/// Builds one profile: sample types, then samples, then [`Builder::write_gz`].
#[derive(Debug)]
pub struct Builder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<i64, u64>,
}

impl Builder {
    /// A profile whose samples carry one value per `(type, unit)`, e.g.
    /// `[("samples", "count"), ("cpu", "nanoseconds")]` as Go's CPU profiles.
    pub fn new(sample_types: &[(&str, &str)]) -> Builder {
        let mut b = Builder {
            p: proto::Profile { string_table: vec![String::new()], ..Default::default() },
            strings: HashMap::from([(String::new(), 0)]),
            functions: HashMap::new(),
        };
        b.p.sample_type = sample_types.iter().map(|(t, u)| b.value_type(t, u)).collect();
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType { r#type: self.string(kind), unit: self.string(unit) }
    }

    /// What one sample stands for: `("cpu", "nanoseconds", 1_000_000)` at 1 kHz.
    pub fn period(&mut self, kind: &str, unit: &str, period: i64) -> &mut Self {
        self.p.period_type = Some(self.value_type(kind, unit));
        self.p.period = period;
        self
    }

    /// When recording started (ns since the Unix epoch) and how long it ran.
    pub fn time(&mut self, start_unix_ns: i64, duration_ns: i64) -> &mut Self {
        self.p.time_nanos = start_unix_ns;
        self.p.duration_nanos = duration_ns;
        self
    }

    /// A free-text comment (`go tool pprof -comments` prints them).
    pub fn comment(&mut self, text: &str) -> &mut Self {
        let i = self.string(text);
        self.p.comment.push(i);
        self
    }

    /// The sample type viewers show first (by its type name).
    pub fn default_sample_type(&mut self, kind: &str) -> &mut Self {
        self.p.default_sample_type = self.string(kind);
        self
    }

    fn location(&mut self, name: &str) -> u64 {
        let n = self.string(name);
        if let Some(&id) = self.functions.get(&n) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        self.p.function.push(proto::Function { id, name: n, system_name: n });
        self.p.location.push(proto::Location { id, line: vec![proto::Line { function_id: id }] });
        self.functions.insert(n, id);
        id
    }

    /// Adds a sample: its stack (frame names, root first), one value per
    /// sample type, and labels.
    pub fn add<F: AsRef<str>>(
        &mut self,
        frames: &[F],
        values: &[i64],
        labels: &[Label<'_>],
    ) -> Result<&mut Self, ValueCountMismatch> {
        if values.len() != self.p.sample_type.len() {
            return Err(ValueCountMismatch { given: values.len(), expected: self.p.sample_type.len() });
        }
        let location_id = frames.iter().rev().map(|f| self.location(f.as_ref())).collect();
        let label = labels
            .iter()
            .map(|l| {
                let key = self.string(l.key);
                match l.value {
                    LabelValue::Str(s) => proto::Label { key, str: self.string(s), ..Default::default() },
                    LabelValue::Num(num, unit) => {
                        let num_unit = unit.map_or(0, |u| self.string(u));
                        proto::Label { key, num, num_unit, ..Default::default() }
                    }
                }
            })
            .collect();
        self.p.sample.push(proto::Sample { location_id, value: values.to_vec(), label });
        Ok(self)
    }

    /// The encoded protobuf, not compressed.
    pub fn encode(&self) -> Vec<u8> {
        self.p.encode_to_vec()
    }

    /// Writes the profile gzip-compressed, as pprof files are stored.
    pub fn write_gz<W: Write>(&self, out: W) -> io::Result<()> {
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&self.encode())?;
        gz.finish()?.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn decode(gz: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    #[test]
    fn round_trips_with_the_invariants_readers_check() {
        let mut b = Builder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
        b.period("cpu", "nanoseconds", 1_000_000).time(1_700_000_000_000_000_000, 2_000_000_000);
        b.comment("papirus test").default_sample_type("cpu");
        let thread = Label { key: "thread", value: LabelValue::Str("worker") };
        let tid = Label { key: "tid", value: LabelValue::Num(42, None) };
        b.add(&["main", "solve", "kernel"], &[3, 3_000_000], &[thread, tid]).unwrap();
        b.add(&["main", "solve"], &[1, 1_000_000], &[thread]).unwrap();
        assert_eq!(b.add(&["main"], &[1], &[]).unwrap_err(), ValueCountMismatch { given: 1, expected: 2 });
        let mut gz = Vec::new();
        b.write_gz(&mut gz).unwrap();
        assert_eq!(&gz[..2], b"\x1f\x8b", "gzip magic");
        let p = decode(&gz);
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        assert_eq!((s(p.sample_type[1].r#type), s(p.sample_type[1].unit)), ("cpu", "nanoseconds"));
        assert_eq!((p.period, s(p.default_sample_type)), (1_000_000, "cpu"));
        assert_eq!(p.function.len(), 3, "one function per distinct name");
        let mut ids: Vec<u64> = p.location.iter().map(|l| l.id).collect();
        ids.dedup();
        assert!(ids.iter().all(|&i| i != 0) && ids.len() == 3);
        let name_of = |loc: u64| {
            let f = p.location[loc as usize - 1].line[0].function_id;
            s(p.function[f as usize - 1].name)
        };
        let leaf_first: Vec<&str> = p.sample[0].location_id.iter().map(|&l| name_of(l)).collect();
        assert_eq!(leaf_first, ["kernel", "solve", "main"]);
        assert_eq!(p.sample[0].value, [3, 3_000_000]);
        assert_eq!((s(p.sample[0].label[0].str), p.sample[0].label[1].num), ("worker", 42));
        assert_eq!(s(p.comment[0]), "papirus test");
    }
}
