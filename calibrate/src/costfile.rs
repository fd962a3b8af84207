//! The machine cost file: what every primitive costs here, for the probe
//! tool's cost model. Its schema is `calibrate/schema/costfile.schema.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::measure::Cost;
use crate::rows::Unavailable;

/// The schema version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One validation line of `--validate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// `PASS`, `FAIL` or `SKIP`.
    pub outcome: Outcome,
    /// What was measured against what was expected, or why it was skipped.
    pub detail: String,
}

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Outcome {
    /// Measured as expected.
    Pass,
    /// Measured, not as expected.
    Fail,
    /// Could not run here; the detail says why.
    Skip,
}

/// A machine cost file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostFile {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The program and version that wrote it.
    pub generator: String,
    /// The machine, as papirus-hwinfo describes it.
    pub machine: serde_json::Value,
    /// TSC ticks per second used to convert cycles to time.
    pub tsc_hz: f64,
    /// The CPU the measurements were pinned to, if any (`--cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_cpu: Option<usize>,
    /// Every primitive's cost.
    pub costs: Vec<Cost>,
    /// The rows that could not run on this machine, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<Unavailable>,
    /// The validation results, when `--validate` ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<Check>,
}

/// A cost file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a cost file.
    #[error("{path}: not a papirus cost file: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A cost file of another schema version.
    #[error(
        "{path}: cost file format_version {found}, this papirus reads {FORMAT_VERSION}: rerun papirus-calibrate --json"
    )]
    Version {
        /// The file.
        path: String,
        /// Its version.
        found: u32,
    },
}

impl CostFile {
    /// Reads and checks a cost file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref();
        let p = || path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io { path: p(), source })?;
        Self::from_json(&text).map_err(|e| match e {
            LoadError::Parse { source, .. } => LoadError::Parse { path: p(), source },
            LoadError::Version { found, .. } => LoadError::Version { path: p(), found },
            other => other,
        })
    }

    /// Parses a cost file from its JSON text.
    pub fn from_json(text: &str) -> Result<Self, LoadError> {
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let parse = |source| LoadError::Parse { path: "<text>".into(), source };
        let v: Version = serde_json::from_str(text).map_err(parse)?;
        if v.format_version != FORMAT_VERSION {
            return Err(LoadError::Version { path: "<text>".into(), found: v.format_version });
        }
        serde_json::from_str(text).map_err(parse)
    }

    /// The cost of the primitive named `name`.
    pub fn cost(&self, name: &str) -> Option<&Cost> {
        self.costs.iter().find(|c| c.name == name)
    }

    /// The median cost of `name` in nanoseconds per call: what a cost model
    /// multiplies by the number of calls.
    pub fn median_ns(&self, name: &str) -> Option<f64> {
        self.cost(name).map(|c| c.ns.median)
    }

    /// Writes the file as pretty JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_versions_and_bad_files_are_typed_errors() {
        let v2 = r#"{"format_version": 2, "generator": "x", "machine": {}, "tsc_hz": 1, "costs": []}"#;
        assert!(matches!(CostFile::from_json(v2), Err(LoadError::Version { found: 2, .. })));
        assert!(matches!(CostFile::from_json("{"), Err(LoadError::Parse { .. })));
        assert!(matches!(CostFile::load("/nonexistent/costs.json"), Err(LoadError::Io { .. })));
        let v1 = r#"{"format_version": 1, "generator": "x", "machine": {}, "tsc_hz": 1, "costs": []}"#;
        let f = CostFile::from_json(v1).unwrap();
        assert!(f.cost("baseline.rdtsc").is_none() && f.unavailable.is_empty());
        assert_eq!(f.median_ns("baseline.rdtsc"), None);
    }
}
