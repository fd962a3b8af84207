//! A set's options: domain, granularity, attach, CPU, multiplexing.

use papirus_substrate::{Domain, Target};

use super::{EventSet, Granularity, Options};
use crate::error::{Error, Result, SetOp};
use crate::library::thread_id;

impl EventSet {
    fn set_option(&mut self, change: impl FnOnce(&mut Options) -> Result<()>) -> Result<()> {
        if self.running.is_some() {
            return Err(Error::IsRunning { op: SetOp::SetOption });
        }
        let old = self.options;
        change(&mut self.options)?;
        if let Err(e) = self.check_options().and_then(|()| self.reopen()) {
            self.options = old;
            self.reopen_or_clear();
            return Err(e);
        }
        Ok(())
    }

    fn check_options(&self) -> Result<()> {
        let o = &self.options;
        if let Some(e) = self.entries.iter().find(|e| e.overflow.is_some()) {
            check_overflow_options(o, &e.info.name)?;
        }
        if o.granularity == Granularity::System && o.attached.is_some() {
            return Err(Error::Combination {
                reason: "system-wide granularity counts a CPU, not a task: detach first".into(),
            });
        }
        if o.granularity == Granularity::System && o.cpu.is_none() {
            return Err(Error::Combination {
                reason: "system-wide granularity needs a CPU: call set_cpu first".into(),
            });
        }
        Ok(())
    }

    /// Sets the counting domain of every event (`None`: each event's default).
    pub fn set_domain(&mut self, domain: Option<Domain>) -> Result<()> {
        self.set_option(|o| {
            o.domain = domain;
            Ok(())
        })
    }

    /// Sets the granularity.
    pub fn set_granularity(&mut self, g: Granularity) -> Result<()> {
        self.set_option(|o| {
            o.granularity = g;
            Ok(())
        })
    }

    /// Counts process or thread `pid` instead of the owner (PAPI_attach).
    /// Fails with ESYS when it does not exist, EPERM when this process may
    /// not trace it.
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        if pid <= 0 {
            return Err(Error::Invalid {
                what: "pid",
                reason: format!("{pid}: a process or thread id is positive"),
            });
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Error::NoSuchProcess { pid });
        }
        self.set_option(|o| {
            o.attached = Some(pid);
            Ok(())
        })
    }

    /// Counts the owner again (PAPI_detach).
    pub fn detach(&mut self) -> Result<()> {
        self.set_option(|o| {
            o.attached = None;
            Ok(())
        })
    }

    /// Restricts counting to one CPU (`None`: any CPU).
    pub fn set_cpu(&mut self, cpu: Option<u32>) -> Result<()> {
        let cpus = self.lib.machine().cpus;
        if let Some(c) = cpu
            && c as usize >= cpus
        {
            return Err(Error::Invalid {
                what: "cpu",
                reason: format!("CPU {c} does not exist: this machine has CPUs 0-{}", cpus - 1),
            });
        }
        self.set_option(|o| {
            o.cpu = cpu;
            Ok(())
        })
    }

    /// Turns multiplexing on or off.
    pub fn set_multiplex(&mut self, on: bool) -> Result<()> {
        self.set_option(|o| {
            o.multiplex = on;
            Ok(())
        })
    }

    pub(super) fn target(&self) -> Target {
        let o = &self.options;
        match (o.granularity, o.attached, o.cpu) {
            (Granularity::System, _, Some(cpu)) => Target::Cpu(cpu),
            (_, Some(pid), None) => Target::Task(pid),
            (_, Some(pid), Some(cpu)) => Target::TaskOnCpu { pid, cpu },
            (_, None, cpu) => {
                let pid = if thread_id() == self.owner { 0 } else { self.owner };
                match (pid, cpu) {
                    (0, None) => Target::ThisThread,
                    (pid, None) => Target::Task(pid),
                    (pid, Some(cpu)) => Target::TaskOnCpu { pid, cpu },
                }
            }
        }
    }
}

/// PAPI's option rules for overflow: the kernel signals the thread that
/// owns a sampling descriptor's `F_SETOWN_EX`, which must be the counted
/// thread for the handler's address and context to be that thread's.
pub(super) fn check_overflow_options(o: &Options, event: &str) -> Result<()> {
    if let Some(pid) = o.attached {
        return Err(Error::Invalid {
            what: "overflow",
            reason: format!(
                "`{event}` overflows, and the set is attached to task {pid}: its samples would interrupt this set's owner thread with another task's addresses; detach, or sample that task from a set created on one of its threads"
            ),
        });
    }
    if o.granularity == Granularity::System {
        return Err(Error::Invalid {
            what: "overflow",
            reason: format!(
                "`{event}` overflows, and a system-wide set counts a CPU, not a thread that could receive the signal; use thread granularity"
            ),
        });
    }
    if o.granularity == Granularity::Process {
        return Err(Error::Combination {
            reason: format!(
                "`{event}` overflows, and process granularity (inherit) would send the samples of child tasks to this thread's handler; use thread granularity"
            ),
        });
    }
    Ok(())
}
