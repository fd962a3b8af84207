//! Which events regions measure and where their reports go, fixed once per
//! process ([`Config::install`], or the environment at the first region).

use std::path::PathBuf;
use std::sync::OnceLock;

use papirus_lowlevel::derived::Derivation;
use papirus_lowlevel::{Library, native};
use papirus_substrate::{EventAttr, names};
use serde::{Deserialize, Serialize};

use super::RegionError;

/// The events measured when neither the caller nor the environment chooses.
pub const DEFAULT_EVENTS: [&str; 5] =
    ["task-clock", "page-faults", "context-switches", "cycles", "instructions"];

/// The built-in metrics every region has, before the events.
pub const TIME_METRICS: [&str; 2] = ["real_time_ns", "virtual_time_ns"];

/// Environment variable naming the events (papirus' own).
pub const ENV_EVENTS: &str = "PAPIRUS_EVENTS";
/// PAPI's variable, read when [`ENV_EVENTS`] is unset.
pub const ENV_PAPI_EVENTS: &str = "PAPI_EVENTS";
/// Environment variable naming the output directory.
pub const ENV_OUTPUT_DIRECTORY: &str = "PAPIRUS_OUTPUT_DIRECTORY";
/// The output directory when [`ENV_OUTPUT_DIRECTORY`] is unset.
pub const DEFAULT_OUTPUT_DIRECTORY: &str = "papirus_output";

/// How the region API is set up: events and output. Setters chain;
/// [`install`](Config::install) fixes the configuration for the process.
#[derive(Clone, Debug, Default)]
pub struct Config {
    events: Option<Vec<String>>,
    output_directory: Option<PathBuf>,
    write_at_exit: Option<bool>,
}

/// Where the event list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    /// [`Config::events`].
    Caller,
    /// `PAPIRUS_EVENTS`.
    PapirusEvents,
    /// `PAPI_EVENTS`.
    PapiEvents,
    /// [`DEFAULT_EVENTS`].
    Default,
}

/// An event the regions measure.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventDef {
    /// The name as requested (after PAPI spelling is translated).
    pub name: String,
    /// Whether it is a PAPI preset.
    pub preset: bool,
    /// How the value combines the native terms (PAPI's names).
    pub derivation: String,
    /// The native terms opened.
    pub terms: Vec<String>,
}

/// A requested event that is not measured, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Unavailable {
    /// The name as requested.
    pub name: String,
    /// Why it is not counted here.
    pub reason: String,
}

/// The process-wide setup, fixed at the first region or [`Config::install`].
#[derive(Debug)]
pub struct Setup {
    /// Where the events came from.
    pub source: EventSource,
    /// The events measured, in metric order after [`TIME_METRICS`].
    pub events: Vec<EventDef>,
    /// Requested events that are not measured.
    pub unavailable: Vec<Unavailable>,
    /// The output directory.
    pub output_directory: PathBuf,
    /// The low-level library (machine facts).
    pub library: Library,
    /// Per event: its native terms' perf descriptions and its derivation.
    pub(super) plans: Vec<(Vec<EventAttr>, Derivation)>,
    /// Metric names: [`TIME_METRICS`] then the events.
    pub metrics: Vec<String>,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

impl Config {
    /// A configuration that takes everything from the environment.
    pub fn new() -> Self {
        Config::default()
    }

    /// Measures these events (PAPI preset names or perf syntax) instead of
    /// the environment's or the defaults; every one must be countable.
    pub fn events<I, S>(&mut self, names: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.events = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Writes reports into `dir` instead of `$PAPIRUS_OUTPUT_DIRECTORY`
    /// (default [`DEFAULT_OUTPUT_DIRECTORY`] in the working directory).
    pub fn output_directory(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.output_directory = Some(dir.into());
        self
    }

    /// Whether to write the report when the process exits normally
    /// (default: yes).
    pub fn write_at_exit(&mut self, on: bool) -> &mut Self {
        self.write_at_exit = Some(on);
        self
    }

    /// Resolves the events and fixes the setup for this process. Fails when
    /// regions are already set up or a caller-chosen event cannot be counted.
    pub fn install(&self) -> Result<&'static Setup, RegionError> {
        if SETUP.get().is_some() {
            return Err(RegionError::AlreadyConfigured);
        }
        let setup = self.resolve()?;
        let at_exit = self.write_at_exit.unwrap_or(true);
        let mut installed = false;
        let s = SETUP.get_or_init(|| {
            installed = true;
            setup
        });
        if !installed {
            return Err(RegionError::AlreadyConfigured);
        }
        if at_exit {
            crate::report::register_at_exit();
        }
        Ok(s)
    }

    fn resolve(&self) -> Result<Setup, RegionError> {
        let library = papirus_lowlevel::init().map_err(|e| RegionError::Event {
            event: "(library initialisation)".into(),
            source: Box::new(e),
        })?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let (source, requested): (EventSource, Vec<String>) =
            match (&self.events, env(ENV_EVENTS), env(ENV_PAPI_EVENTS)) {
                (Some(list), _, _) => (EventSource::Caller, list.clone()),
                (None, Some(v), _) => (EventSource::PapirusEvents, split_list(&v)?),
                (None, None, Some(v)) => (EventSource::PapiEvents, split_list(&v)?),
                (None, None, None) => {
                    (EventSource::Default, DEFAULT_EVENTS.iter().map(|s| s.to_string()).collect())
                }
            };
        let mut events = vec![];
        let mut plans = vec![];
        let mut unavailable = vec![];
        for entry in requested {
            let resolved = translate(&entry).and_then(|name| {
                if events.iter().any(|e: &EventDef| e.name == name) {
                    return Err(RegionError::EventSyntax {
                        entry: entry.clone(),
                        reason: "listed twice".into(),
                    });
                }
                resolve_event(&library, &name)
            });
            match resolved {
                Ok((def, plan)) => {
                    events.push(def);
                    plans.push(plan);
                }
                Err(e) if source == EventSource::Caller => return Err(e),
                Err(e) => {
                    let reason = match &e {
                        RegionError::Event { source, .. } => source.to_string(),
                        other => other.to_string(),
                    };
                    if source != EventSource::Default {
                        eprintln!("papirus: region event `{entry}` dropped: {reason}");
                    }
                    unavailable.push(Unavailable { name: entry, reason });
                }
            }
        }
        let output_directory = self.output_directory.clone().unwrap_or_else(|| {
            env(ENV_OUTPUT_DIRECTORY).map_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIRECTORY), PathBuf::from)
        });
        let metrics =
            TIME_METRICS.iter().map(|s| s.to_string()).chain(events.iter().map(|e| e.name.clone())).collect();
        Ok(Setup { source, events, unavailable, output_directory, library, plans, metrics })
    }
}

/// The setup, made from the environment on first use. Events from the
/// environment that cannot be counted are dropped, so this fails only when
/// the low-level library cannot initialise.
pub fn setup() -> Result<&'static Setup, RegionError> {
    if let Some(s) = SETUP.get() {
        return Ok(s);
    }
    match Config::new().install() {
        // A concurrent first call won the race: use its setup.
        Err(RegionError::AlreadyConfigured) => SETUP.get().ok_or(RegionError::AlreadyConfigured),
        r => r,
    }
}

/// The setup, if regions are set up.
pub(super) fn current() -> Option<&'static Setup> {
    SETUP.get()
}

/// Whether regions have been set up in this process.
pub fn is_set_up() -> bool {
    SETUP.get().is_some()
}

/// Splits an event list as perf does ([`names::split_event_names`]: commas
/// inside `pmu/…/` terms stay), spaces stripped first as PAPI does.
pub fn split_list(v: &str) -> Result<Vec<String>, RegionError> {
    let v: String = v.split_whitespace().collect();
    names::split_event_names(&v)
        .map_err(|e| RegionError::EventSyntax { entry: v.clone(), reason: e.to_string() })
}

/// Translates PAPI's spellings: `NAME=delta` (the only type papirus
/// measures) and `perf::NAME` (perf's name, upper-cased by PAPI).
pub fn translate(entry: &str) -> Result<String, RegionError> {
    let (name, kind) = match entry.split_once('=') {
        Some((n, k)) if !n.contains('/') => (n, Some(k)),
        _ => (entry, None),
    };
    match kind {
        None | Some("delta") => {}
        Some(k) => {
            return Err(RegionError::EventSyntax {
                entry: entry.into(),
                reason: format!(
                    "event type `{k}` is not supported: regions measure deltas (`NAME=delta` or plain `NAME`)"
                ),
            });
        }
    }
    if let Some(rest) = name.strip_prefix("perf::") {
        if rest.is_empty() {
            return Err(RegionError::EventSyntax {
                entry: entry.into(),
                reason: "empty name after `perf::`".into(),
            });
        }
        // PAPI upper-cases perf's names; the hw-cache names keep their own case.
        return Ok(if native::resolve(rest).is_ok() { rest.to_string() } else { rest.to_ascii_lowercase() });
    }
    if name.is_empty() {
        return Err(RegionError::EventSyntax { entry: entry.into(), reason: "empty event name".into() });
    }
    Ok(name.to_string())
}

/// Resolves one event as an event set would (presets, perf syntax, the
/// reason an event cannot be counted), opening it once on this thread.
fn resolve_event(lib: &Library, name: &str) -> Result<(EventDef, (Vec<EventAttr>, Derivation)), RegionError> {
    let r = lib
        .resolve_event(name)
        .map_err(|source| RegionError::Event { event: name.to_string(), source: Box::new(source) })?;
    let def = EventDef {
        name: name.to_string(),
        preset: r.info.preset,
        derivation: r.info.derivation.papi_name().to_string(),
        terms: r.info.terms,
    };
    Ok((def, (r.attrs, r.info.derivation)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::RegionError;

    #[test]
    fn papi_spellings() {
        assert_eq!(translate("perf::TASK-CLOCK").unwrap(), "task-clock");
        assert_eq!(translate("PAPI_TOT_CYC=delta").unwrap(), "PAPI_TOT_CYC");
        assert_eq!(translate("cpu/event=0x3c/").unwrap(), "cpu/event=0x3c/");
        assert!(matches!(translate("x=instant"), Err(RegionError::EventSyntax { .. })));
        assert!(matches!(translate("perf::"), Err(RegionError::EventSyntax { .. })));
    }

    #[test]
    fn caller_events_must_all_work() {
        let err = Config::new().events(["page-faults", "no-such-event-x"]).resolve().unwrap_err();
        assert!(matches!(&err, RegionError::Event { event, .. } if event == "no-such-event-x"), "{err:?}");
        let ok = Config::new().events(["page-faults", "PAPI_TOT_CYC=delta"]).resolve();
        let no_pmu = papirus_lowlevel::init().unwrap().machine().hw_counters == Some(0);
        match ok {
            Ok(s) => {
                assert!(!no_pmu, "cycles resolved without a PMU");
                assert_eq!(s.metrics, ["real_time_ns", "virtual_time_ns", "page-faults", "PAPI_TOT_CYC"]);
            }
            Err(e) => {
                assert!(no_pmu, "{e}");
                assert!(e.to_string().contains("PAPI_TOT_CYC"), "{e}");
                println!("{e}");
            }
        }
        let s = Config::new().events(Vec::<String>::new()).resolve().unwrap();
        assert_eq!(s.metrics, TIME_METRICS);
        assert_eq!(s.source, EventSource::Caller);
    }
}
