//! Counting: start, stop, read, accum, reset, and each event's value from
//! its terms' readings by the counting core's estimator.

use papirus_substrate::read::{ReadMethod, ReadPath};

use super::open::{OpenGroups, StartBase, conflict_on_error_state};
use super::{EventSet, Granularity, Value, closed, self_key};
use crate::error::{Error, Result, SetOp};

impl EventSet {
    /// Resets and starts counting. Fails with EISRUN when running, EINVAL
    /// when empty, ECNFLCT when other running sets hold the counters.
    pub fn start(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::Start });
        }
        if self.entries.is_empty() {
            return Err(Error::EmptySet);
        }
        let hw = if self.options.multiplex { 0 } else { self.hardware_terms() };
        let id = self.id;
        let key = self_key(self.opened(SetOp::Start)?.target, self.owner);
        if hw > 0
            && let Err(used) = self.lib.claim(key, id, hw)
        {
            return Err(Error::Conflict {
                event: self.entries.iter().map(|e| e.info.name.as_str()).collect::<Vec<_>>().join(","),
                reason: format!(
                    "other running event sets on this target hold {used} of the {} hardware counters and this set needs {hw}; stop them first or turn on multiplexing",
                    self.lib.machine().hw_counters.unwrap_or(0)
                ),
            });
        }
        let opened = self.opened.as_mut().ok_or(Error::EmptySet)?;
        let zeroed = match opened.start {
            StartBase::AllZero => Ok(()),
            StartBase::ValuesAtStop => {
                rebase(opened);
                Ok(())
            }
            StartBase::ReadNow => snapshot(opened, false, true).map(drop),
        };
        let r = zeroed.and_then(|()| opened.groups.iter().try_for_each(|g| g.enable().map_err(Error::from)));
        if let Err(e) = r {
            for g in &opened.groups {
                let _ = g.disable();
            }
            if hw > 0 {
                self.lib.release(key, id);
            }
            return Err(e);
        }
        self.running = Some(key);
        self.claimed = hw > 0;
        Ok(())
    }

    /// Stops counting and returns the values since start (or the last
    /// reset/accum). Fails with ENOTRUN when not running.
    pub fn stop(&mut self) -> Result<Vec<i64>> {
        let mut v = vec![0; self.entries.len()];
        self.stop_into(&mut v)?;
        Ok(v)
    }

    /// Like [`EventSet::stop`], into `values` (one per event).
    pub fn stop_into(&mut self, values: &mut [i64]) -> Result<()> {
        let key = self.running.ok_or(Error::NotRunning { op: SetOp::Stop })?;
        self.check_len(values.len())?;
        let opened = self.opened(SetOp::Stop)?;
        let mut first_err = None;
        for g in &opened.groups {
            if let Err(e) = g.disable() {
                first_err.get_or_insert(Error::from(e));
            }
        }
        if std::mem::take(&mut self.claimed) {
            self.lib.release(key, self.id);
        }
        self.running = None;
        if let Some(e) = first_err {
            return Err(e);
        }
        self.read_values(values, None)?;
        let inherit = self.options.granularity == Granularity::Process;
        if let Some(o) = self.opened.as_mut() {
            o.start = if inherit { StartBase::ReadNow } else { StartBase::ValuesAtStop };
        }
        Ok(())
    }

    fn check_len(&self, got: usize) -> Result<()> {
        if got != self.entries.len() {
            return Err(Error::Buffer { got, expected: self.entries.len() });
        }
        Ok(())
    }

    /// The current values (no reset). Works on a stopped set too (the
    /// values at stop), as PAPI's read does.
    pub fn read(&mut self) -> Result<Vec<i64>> {
        let mut v = vec![0; self.entries.len()];
        self.read_into(&mut v)?;
        Ok(v)
    }

    /// Like [`EventSet::read`], into `values` without allocating.
    pub fn read_into(&mut self, values: &mut [i64]) -> Result<()> {
        self.check_len(values.len())?;
        self.read_values(values, None)
    }

    /// The current values with their scaling.
    pub fn read_detailed(&mut self) -> Result<Vec<Value>> {
        let n = self.entries.len();
        let mut v = vec![0; n];
        let mut d = vec![Value { value: 0, raw: 0, time_enabled: 0, time_running: 0 }; n];
        self.read_values(&mut v, Some(&mut d))?;
        Ok(d)
    }

    /// The current values and the real-time timestamp (TSC ticks, as
    /// [`real_cyc`](crate::real_cyc)) taken right after the read.
    pub fn read_ts(&mut self, values: &mut [i64]) -> Result<u64> {
        self.read_into(values)?;
        Ok(crate::library::real_cyc())
    }

    /// Adds the current values into `values` and resets the counters
    /// (PAPI_accum). Needs a running set.
    pub fn accum(&mut self, values: &mut [i64]) -> Result<()> {
        if self.running.is_none() {
            return Err(Error::NotRunning { op: SetOp::Accum });
        }
        self.check_len(values.len())?;
        let mut now = std::mem::take(&mut self.tmp);
        now.resize(values.len(), 0);
        let r = self.read_values(&mut now, None);
        if r.is_ok() {
            for (v, n) in values.iter_mut().zip(&now) {
                *v = v.saturating_add(*n);
            }
            if let Some(o) = self.opened.as_mut() {
                rebase(o);
            }
        }
        self.tmp = now;
        r
    }

    /// Zeroes the counters (running or stopped).
    pub fn reset(&mut self) -> Result<()> {
        let (running, user_space) = (self.running.is_some(), self.user_space);
        let opened = self.opened(SetOp::Reset)?;
        self.last_path = Some(snapshot(opened, running, user_space)?);
        Ok(())
    }

    /// Whether reads may take the user-space path (the default) or always
    /// use `read(2)`; may change at any time, running or not. Turned off,
    /// values are the kernel's own from then on, not held at the highest
    /// value returned before (see the [module documentation](super)): a
    /// reference to compare user-space reads with, or a way to rule them out.
    pub fn set_user_space_reads(&mut self, on: bool) {
        if self.user_space
            && !on
            && let Some(o) = &self.opened
        {
            o.readers.iter().for_each(|r| r.forget_high());
        }
        self.user_space = on;
    }

    /// Whether reads may take the user-space path.
    pub fn user_space_reads(&self) -> bool {
        self.user_space
    }

    /// How the last read, `read_ts`, `accum`, `stop` or `reset` obtained
    /// its values (`None` before the first): [`ReadPath::UserSpace`] when
    /// every group was read without a system call, [`ReadPath::Resync`]
    /// when a group's user-space base was resynchronised by one `read(2)`,
    /// [`ReadPath::Syscall`] when some group was read by `read(2)` only.
    pub fn read_path(&self) -> Option<ReadPath> {
        self.last_path
    }

    /// Per event, how each native term is read (see [`ReadMethod`]; its
    /// `Syscall` variant says why a term is read by `read(2)`). Empty when
    /// the set is closed.
    pub fn read_methods(&self) -> Vec<Vec<ReadMethod>> {
        self.opened.as_ref().map_or_else(Vec::new, OpenGroups::methods)
    }

    /// perf cannot load a value into a counter: always ENOSUPP.
    pub fn write(&mut self, _values: &[i64]) -> Result<()> {
        Err(Error::NotSupported {
            op: SetOp::Write,
            reason:
                "perf_event has no way to set a counter's value; use reset() to zero it, or keep an offset"
                    .into(),
        })
    }

    /// Reads the groups and turns each event's terms into its value since
    /// the base: each term's count by the core's estimator, then the
    /// event's derivation over them. A derived event's terms share a group,
    /// so they share one scaling.
    fn read_values(&mut self, values: &mut [i64], mut detail: Option<&mut [Value]>) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let opened = self.opened.as_mut().ok_or_else(|| closed(SetOp::Read))?;
        self.last_path = Some(read_groups(opened, self.running.is_some(), self.user_space)?);
        let (counted, raw) = &mut self.terms;
        for (i, entry) in self.entries.iter().enumerate() {
            counted.clear();
            raw.clear();
            let mut lead = None;
            for t in &opened.terms[i] {
                let m = t.member.index();
                let now = opened.counts[t.group].get(m).copied().unwrap_or_default();
                let then = opened.base[t.group].get(m).copied().unwrap_or_default();
                let e = now.since(&then);
                lead.get_or_insert(e);
                counted.push(saturating_i64(e.value));
                raw.push(saturating_i64(e.raw));
            }
            let value = entry.info.derivation.eval(counted);
            values[i] = value;
            if let Some(d) = detail.as_deref_mut() {
                let lead = lead.unwrap_or_default();
                let raw = entry.info.derivation.eval(raw);
                d[i] = Value { value, raw, time_enabled: lead.enabled, time_running: lead.running };
            }
        }
        Ok(())
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Makes the last readings the new base.
fn rebase(o: &mut OpenGroups) {
    for (base, counts) in o.base.iter_mut().zip(&o.counts) {
        base.clone_from(counts);
    }
}

/// Reads every group into `counts`, each by user space where it can
/// (`running`: the groups are enabled, and the set allows it), and returns
/// the path of the read: user space only when every group took it.
fn read_groups(o: &mut OpenGroups, running: bool, user_space: bool) -> Result<ReadPath> {
    let mut path = ReadPath::UserSpace;
    for ((group, reader), counts) in o.groups.iter().zip(&o.readers).zip(&mut o.counts) {
        let p = reader
            .read_group(group, running && user_space, counts)
            .map_err(|e| conflict_on_error_state(e, group))?;
        path = path.and(p);
    }
    Ok(path)
}

/// Reads every group and makes the readings the new base.
fn snapshot(o: &mut OpenGroups, running: bool, user_space: bool) -> Result<ReadPath> {
    let path = read_groups(o, running, user_space)?;
    rebase(o);
    Ok(path)
}
