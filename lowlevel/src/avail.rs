//! What is available here: each preset with its definition and the reason
//! when it cannot be counted, and the native events that open. Used by
//! `papirus-avail` and `papirus-native-avail`.

use serde::Serialize;

use crate::error::Error;
use crate::library::Library;
use crate::native::{self, NativeEvent};
use crate::preset::{Definition, Preset, presets};

/// The version of the JSON layouts the tools print.
pub const FORMAT_VERSION: u32 = 1;

/// One preset on this machine.
#[derive(Clone, Debug, Serialize)]
pub struct PresetStatus {
    /// The preset.
    pub preset: &'static Preset,
    /// Its code.
    pub code: u32,
    /// Whether it can be counted here.
    pub available: bool,
    /// Whether the definition in use is derived from several terms.
    pub derived: bool,
    /// The definition in use (or the first candidate when none works).
    pub definition: Option<Definition>,
    /// Every candidate definition for this CPU, best first.
    pub candidates: Vec<Definition>,
    /// Why it cannot be counted.
    pub reason: Option<String>,
}

impl Library {
    /// Whether `preset` can be counted by the calling thread here, trying
    /// its definitions for this CPU in order (the same path as adding it to
    /// an event set).
    pub fn preset_status(&self, preset: &'static Preset) -> PresetStatus {
        let candidates: Vec<Definition> =
            self.presets().definitions(&self.machine().cpu, preset.name).into_iter().cloned().collect();
        let mut set = self.event_set();
        let (available, reason) = match set.add_named(preset.name) {
            Ok(_) => (true, None),
            Err(Error::PresetUnavailable { reason, .. }) => (false, Some(reason)),
            Err(e) => (false, Some(e.to_string())),
        };
        let used = set.events().into_iter().next();
        let definition = match &used {
            Some(info) => candidates
                .iter()
                .find(|d| d.terms.iter().map(|t| t.text()).eq(info.terms.iter().map(String::as_str)))
                .cloned(),
            None => candidates.first().cloned(),
        };
        PresetStatus {
            preset,
            code: preset.code(),
            available,
            derived: definition.as_ref().is_some_and(|d| d.derivation.is_derived()),
            definition,
            candidates,
            reason,
        }
    }

    /// [`Library::preset_status`] of every preset, in PAPI's order.
    pub fn preset_statuses(&self) -> Vec<PresetStatus> {
        presets().iter().map(|p| self.preset_status(p)).collect()
    }
}

/// A native event and whether it opens here.
#[derive(Clone, Debug, Serialize)]
pub struct NativeStatus {
    /// The event.
    #[serde(flatten)]
    pub event: NativeEvent,
    /// `Some(true)` when it opened for the calling thread, `Some(false)`
    /// when the kernel refused (see `reason`), `None` when not checked.
    pub counts: Option<bool>,
    /// The refusal.
    pub reason: Option<String>,
}

/// Every native event, each opened when `check` is set.
pub fn native_statuses(check: bool) -> crate::Result<Vec<NativeStatus>> {
    let mut list: Vec<NativeStatus> = native::enumerate()?
        .into_iter()
        .map(|event| NativeStatus { event, counts: None, reason: None })
        .collect();
    if check {
        list.iter_mut().for_each(check_one);
    }
    Ok(list)
}

/// Opens the event once for the calling thread and records the outcome.
pub fn check_one(st: &mut NativeStatus) {
    match native::resolve(&st.event.name).and_then(|r| native::check(&r.parsed.attr)) {
        Ok(()) => st.counts = Some(true),
        Err(e) => {
            st.counts = Some(false);
            st.reason = Some(e.to_string());
        }
    }
}
