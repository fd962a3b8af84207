//! Overflow handlers and profil on a set's events.

use std::sync::Arc;

use papirus_substrate::signal::{NotifierStats, Route};

use super::options::check_overflow_options;
use super::{EventRef, EventSet};
use crate::error::{Error, Result, SetOp};
use crate::overflow::{self, Dispatch, OverflowHandler, SampleQueue};
use crate::profil::{ProfilFlags, Profile, Region};

/// An event's overflow: its descriptor samples every `threshold` events.
#[derive(Clone, Debug)]
pub(super) struct Overflow {
    pub(super) threshold: u64,
    pub(super) dispatch: Dispatch,
}

impl EventSet {
    /// PAPI's overflow rules, then the change applied and the set reopened
    /// (the old state kept on failure).
    /// `dispatch` `None` (or threshold 0) turns overflow off.
    fn set_overflow(
        &mut self,
        event: EventRef<'_>,
        threshold: u64,
        flags: u32,
        dispatch: Option<Dispatch>,
    ) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        let i = self.index_of(event)?;
        let new = if let Some(d) = dispatch.filter(|_| threshold > 0) {
            let e = &self.entries[i];
            if let [_, _, ..] = e.attrs.as_slice() {
                return Err(Error::Invalid {
                    what: "overflow event",
                    reason: format!(
                        "`{}` is derived from {} native events ({}): perf samples one event, and a sum or difference of counters has no overflow point; set overflow on one of its native terms instead",
                        e.info.name,
                        e.attrs.len(),
                        e.info.terms.join(", ")
                    ),
                });
            }
            if i >= 64 {
                return Err(Error::Invalid {
                    what: "overflow event",
                    reason: format!(
                        "event #{i}: an overflow vector has 64 bits, so only the set's first 64 events can overflow"
                    ),
                });
            }
            overflow::check_request(&e.attrs[0], threshold, flags)?;
            check_overflow_options(&self.options, &e.info.name)?;
            Some(Overflow { threshold, dispatch: d })
        } else {
            None
        };
        let old = std::mem::replace(&mut self.entries[i].overflow, new);
        if let Err(e) = self.reopen() {
            self.entries[i].overflow = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// `PAPI_overflow`: calls `handler` on the counted thread every
    /// `threshold` events of `event` (a code, position or name in the set);
    /// threshold 0 turns overflow (or profil) of the event off. `flags`: 0 or
    /// [`OVERFLOW_HARDWARE`](crate::overflow::OVERFLOW_HARDWARE).
    ///
    /// The handler runs in signal context (see [`crate::overflow`]). The
    /// event keeps its one descriptor, now sampling, so its value in
    /// [`EventSet::read`] and [`EventSet::stop`] stays the exact count.
    ///
    /// Errors: EISRUN while running; ENOEVNT when `event` is not in the set;
    /// EINVAL for a derived event, a task-clock/cpu-clock period under
    /// 100 µs, unknown flags, or a set attached to another task or to a
    /// CPU; ECOMBO with process granularity; ENOSUPP for
    /// `OVERFLOW_FORCE_SW`.
    pub fn overflow<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        threshold: u64,
        flags: u32,
        handler: OverflowHandler,
    ) -> Result<()> {
        self.set_overflow(event.into(), threshold, flags, Some(Dispatch::Handler(handler)))
    }

    /// Like [`EventSet::overflow`], but each overflow is queued in `queue`
    /// for a normal thread to drain; a full queue counts the drop.
    pub fn overflow_deferred<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        threshold: u64,
        queue: Arc<SampleQueue>,
    ) -> Result<()> {
        self.set_overflow(event.into(), threshold, 0, Some(Dispatch::Deferred(queue)))
    }

    /// `PAPI_profil`: a PC histogram of `event` sampled every `threshold`
    /// events over one region (see [`crate::profil`]). Returns the profile
    /// being filled, or `None` when threshold 0 turned profiling off. The
    /// rules are [`EventSet::overflow`]'s.
    pub fn profil<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        region: Region,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Option<Arc<Profile>>> {
        self.sprofil(event, vec![region], threshold, flags)
    }

    /// `PAPI_sprofil`: like [`EventSet::profil`] over several regions.
    pub fn sprofil<'a>(
        &mut self,
        event: impl Into<EventRef<'a>>,
        regions: Vec<Region>,
        threshold: u64,
        flags: ProfilFlags,
    ) -> Result<Option<Arc<Profile>>> {
        let event = event.into();
        if threshold == 0 {
            self.set_overflow(event, 0, 0, None)?;
            return Ok(None);
        }
        // Refuses FORCE_SW and the EAR flags with ENOSUPP.
        let profile = Arc::new(Profile::new(regions, flags, threshold)?);
        self.set_overflow(event, threshold, 0, Some(Dispatch::Profile(profile.clone())))?;
        Ok(Some(profile))
    }

    /// The overflow threshold of `event`, 0 when it does not overflow.
    pub fn overflow_threshold<'a>(&self, event: impl Into<EventRef<'a>>) -> Result<u64> {
        let i = self.index_of(event)?;
        Ok(self.entries[i].overflow.as_ref().map_or(0, |o| o.threshold))
    }

    /// Signals, samples and losses the handler has seen for overflowing
    /// `event` since its descriptor was opened (the last overflow or
    /// membership change); `None` when it does not overflow.
    pub fn overflow_stats<'a>(&self, event: impl Into<EventRef<'a>>) -> Option<NotifierStats> {
        let i = self.index_of(event).ok()?;
        self.opened.as_ref()?.routes.get(i)?.as_ref().map(Route::stats)
    }

    /// Routes this set's overflows to real-time signal `signal` (default
    /// `SIGRTMAX - 3`, see [`papirus_substrate::signal`]). The set must be stopped.
    pub fn set_overflow_signal(&mut self, signal: i32) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        if !(libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal) {
            return Err(Error::Invalid {
                what: "overflow signal",
                reason: format!(
                    "{signal} is not a real-time signal ({}..={}): overflows need a queued signal",
                    libc::SIGRTMIN(),
                    libc::SIGRTMAX()
                ),
            });
        }
        let old = std::mem::replace(&mut self.signal, signal);
        if self.entries.iter().any(|e| e.overflow.is_some())
            && let Err(e) = self.reopen()
        {
            self.signal = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    /// The real-time signal this set's overflows use.
    pub fn overflow_signal(&self) -> i32 {
        self.signal
    }
}
