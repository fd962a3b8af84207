//! What a set holds: adding events by preset or native name or code, and removing them.

use papirus_substrate::{Domain, EventAttr, Kind};

use super::overflow::Overflow;
use super::{EventInfo, EventSet};
use crate::derived::Derivation;
use crate::error::{Error, Result, SetOp};
use crate::native::{self, NATIVE_MASK};
use crate::preset::{Definition, PRESET_MASK, preset_by_code, preset_by_name};

#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) info: EventInfo,
    pub(super) attrs: Vec<EventAttr>,
    pub(super) hw_terms: usize,
    pub(super) overflow: Option<Overflow>,
}

/// What to add: a name or a code.
#[derive(Clone, Copy, Debug)]
enum Key<'a> {
    Name(&'a str),
    Code(u32),
}

/// The set entry of one resolved native event.
pub(super) fn native_entry(resolved: native::Resolved) -> Entry {
    let attr = resolved.parsed.attr;
    Entry {
        hw_terms: usize::from(attr.kind() == Kind::Hardware),
        info: EventInfo {
            code: resolved.code,
            name: resolved.name.clone(),
            preset: false,
            derivation: Derivation::NotDerived,
            terms: vec![resolved.name],
            note: None,
            unit: resolved.parsed.unit,
            scale: resolved.parsed.scale,
        },
        attrs: vec![attr],
        overflow: None,
    }
}

pub(super) fn preset_entry(name: &str, code: u32, def: &Definition) -> Result<Entry> {
    let mut attrs = Vec::with_capacity(def.terms.len());
    for t in &def.terms {
        let attr = match t.core_attr() {
            Some(a) => a,
            None => native::resolve(t.text())?.parsed.attr,
        };
        attrs.push(attr);
    }
    Ok(Entry {
        hw_terms: attrs.iter().filter(|a| a.kind() == Kind::Hardware).count(),
        info: EventInfo {
            code,
            name: name.to_string(),
            preset: true,
            derivation: def.derivation.clone(),
            terms: def.terms.iter().map(|t| t.text().to_string()).collect(),
            note: def.note.clone(),
            unit: None,
            scale: 1.0,
        },
        attrs,
        overflow: None,
    })
}

impl EventSet {
    /// Adds an event by name: a PAPI preset (`PAPI_TOT_CYC`, any case), or a
    /// native event in perf's syntax (`task-clock`, `msr/tsc/`, `r01c2`).
    /// Returns the event's code.
    pub fn add_named(&mut self, name: &str) -> Result<u32> {
        self.add(Key::Name(name))
    }

    /// Adds an event by code: a preset (`0x80000000 | index`) or a native
    /// code this process handed out.
    pub fn add_code(&mut self, code: u32) -> Result<u32> {
        self.add(Key::Code(code))
    }

    /// Adds several events by name, stopping at the first failure (the
    /// events before it stay added).
    ///
    /// A list of native events is opened once for the whole list, so adding
    /// n events costs n opens rather than n²/2 (closing a tracepoint waits
    /// for an RCU grace period: 100 tracepoints one by one took minutes).
    /// When that fails, or presets are in the list, the events are added one
    /// by one, which finds the culprit and applies each event's fallbacks.
    pub fn add_all<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> Result<Vec<u32>> {
        let names: Vec<&str> = names.into_iter().collect();
        if self.running.is_none() && names.len() > 1 && self.add_batch(&names).is_some() {
            return Ok(self.entries[self.entries.len() - names.len()..]
                .iter()
                .map(|e| e.info.code)
                .collect());
        }
        names.into_iter().map(|n| self.add_named(n)).collect()
    }

    /// Adds native events `names` with one reopen; `None` (and the set as
    /// before) when any is a preset, a duplicate, unknown, or fails to open.
    fn add_batch(&mut self, names: &[&str]) -> Option<()> {
        let mut codes: std::collections::HashSet<u32> = self.entries.iter().map(|e| e.info.code).collect();
        let mut batch = Vec::with_capacity(names.len());
        for n in names {
            if preset_by_name(n.trim()).is_some() {
                return None;
            }
            let entry = native_entry(native::resolve(n).ok()?);
            if !codes.insert(entry.info.code) {
                return None;
            }
            batch.push(entry);
        }
        let before = self.entries.len();
        self.entries.extend(batch);
        if self.reopen().is_ok() {
            return Some(());
        }
        self.entries.truncate(before);
        self.reopen_or_clear();
        None
    }

    fn add(&mut self, key: Key<'_>) -> Result<u32> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Add });
        }
        let preset = match key {
            Key::Name(n) => preset_by_name(n.trim()),
            Key::Code(c) if c & 0xC000_0000 == PRESET_MASK => {
                Some(preset_by_code(c).ok_or(Error::NoSuchCode { code: c })?)
            }
            Key::Code(_) => None,
        };
        if let Some(p) = preset {
            if self.entries.iter().any(|e| e.info.code == p.code()) {
                return Err(Error::Duplicate { event: p.name.to_string() });
            }
            return self.add_preset(p.name, p.code());
        }
        let resolved = match key {
            Key::Name(n) => native::resolve(n)?,
            Key::Code(c) if c & 0xC000_0000 == NATIVE_MASK => native::resolve_code(c)?,
            Key::Code(c) => return Err(Error::NoSuchCode { code: c }),
        };
        if self.entries.iter().any(|e| e.info.code == resolved.code) {
            return Err(Error::Duplicate { event: resolved.name });
        }
        let (code, modifiers) = (resolved.code, resolved.parsed.modifiers);
        let entry = native_entry(resolved);
        let fallback =
            (entry.attrs[0].domain_value() != Domain::USER && self.options.domain.is_none() && !modifiers)
                .then(|| entry.clone());
        match (self.push(entry), fallback) {
            (Ok(()), _) => Ok(code),
            // As perf does: a default domain with the kernel in it is refused
            // at perf_event_paranoid ≥ 2 without CAP_PERFMON; count user space.
            (Err(Error::Substrate(papirus_substrate::Error::Permission { .. })), Some(mut entry)) => {
                entry.attrs[0].domain(Domain::USER);
                entry.info.note = Some(
                    "user space only: counting the kernel is not permitted here (perf_event_paranoid ≥ 2 without CAP_PERFMON)"
                        .into(),
                );
                self.push(entry)?;
                Ok(code)
            }
            (Err(e), _) => Err(e),
        }
    }

    fn add_preset(&mut self, name: &str, code: u32) -> Result<u32> {
        let machine = self.lib.machine().clone();
        let defs: Vec<Definition> =
            self.lib.presets().definitions(&machine.cpu, name).into_iter().cloned().collect();
        if defs.is_empty() {
            return Err(Error::PresetUnavailable {
                name: name.to_string(),
                reason: format!("no definition for {} and no generic perf one", machine.cpu),
            });
        }
        let mut last = None;
        for def in defs {
            let entry = match preset_entry(name, code, &def) {
                Ok(e) => e,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match self.push(entry) {
                Ok(()) => return Ok(code),
                Err(e) => last = Some(e),
            }
        }
        let err =
            last.unwrap_or(Error::PresetUnavailable { name: name.into(), reason: "no definition".into() });
        // A preset that exists but cannot open here is "not available", with the reason.
        Err(match err {
            Error::Substrate(papirus_substrate::Error::Unsupported {
                hardware: true,
                ref event,
                errno,
                ..
            }) => {
                let reason = match &machine.no_hardware_reason {
                    Some(why) => format!("{why} (perf_event_open of `{event}` returned {errno})"),
                    None => err.to_string(),
                };
                Error::PresetUnavailable { name: name.to_string(), reason }
            }
            Error::Substrate(e @ papirus_substrate::Error::Unsupported { .. }) => {
                Error::PresetUnavailable { name: name.to_string(), reason: e.to_string() }
            }
            other => other,
        })
    }

    /// Opens the set with `entry` appended; keeps the old layout on failure.
    fn push(&mut self, entry: Entry) -> Result<()> {
        self.entries.push(entry);
        match self.reopen() {
            Ok(()) => Ok(()),
            Err(e) => {
                let bad = self.entries.pop();
                // The old layout was opened before and is unchanged; reopening restores it.
                self.reopen_or_clear();
                Err(match (e, bad) {
                    (Error::Substrate(papirus_substrate::Error::NoCounterSlot { .. }), Some(b)) => Error::Conflict {
                        event: b.info.name,
                        reason: "no free counter slot for it beside the set's other events (x86 has 4 debug \
                                 registers for breakpoints per thread); remove events or use another set on another thread"
                            .into(),
                    },
                    (e, _) => e,
                })
            }
        }
    }

    pub(super) fn reopen_or_clear(&mut self) {
        if self.reopen().is_err() {
            // Something outside changed (the attached task exited); keep the entries, closed.
            self.opened = None;
        }
    }

    /// Removes an event by name or code (as added). Fails with EINVAL when
    /// it is not in the set.
    pub fn remove_named(&mut self, name: &str) -> Result<()> {
        let code = match preset_by_name(name.trim()) {
            Some(p) => p.code(),
            None => native::code_of(name),
        };
        self.remove_code(code).map_err(|e| match e {
            Error::NotInSet { .. } => Error::NotInSet { event: name.to_string() },
            e => e,
        })
    }

    /// Removes the event with `code`.
    pub fn remove_code(&mut self, code: u32) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Remove });
        }
        let at = self
            .entries
            .iter()
            .position(|e| e.info.code == code)
            .ok_or_else(|| Error::NotInSet { event: format!("{code:#010x}") })?;
        let removed = self.entries.remove(at);
        if let Err(e) = self.reopen() {
            self.entries.insert(at, removed);
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// Removes every event (PAPI's cleanup); the set must be stopped.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Cleanup });
        }
        self.entries.clear();
        self.opened = None;
        Ok(())
    }
}

/// An event resolved as an event set resolves it: for a preset, the first
/// definition for this CPU whose terms open on this thread; for a native
/// name, the parser's description (user space only where the kernel
/// refuses its default domain). The one resolver of names to the
/// descriptions papirus opens: regions and the probe tool use it too.
#[derive(Clone, Debug)]
pub struct ResolvedEvent {
    /// What an event set lists for it.
    pub info: EventInfo,
    /// Its native terms as they open (preset terms in definition order).
    pub attrs: Vec<EventAttr>,
}

impl crate::library::Library {
    /// Resolves `name` (a preset or a native name) as
    /// [`EventSet::add_named`] does, opening it once on this thread (with no
    /// page mapped, so without waiting for the clock), and closes it again.
    /// Fails as `add_named` would.
    pub fn resolve_event(&self, name: &str) -> Result<ResolvedEvent> {
        let mut set = self.event_set();
        set.maps_pages = false;
        set.add_named(name)?;
        set.opened = None;
        let entry = set.entries.pop().ok_or_else(|| Error::Invalid {
            what: "event",
            reason: format!("`{name}` was added but the set kept no event"),
        })?;
        Ok(ResolvedEvent { info: entry.info, attrs: entry.attrs })
    }
}
