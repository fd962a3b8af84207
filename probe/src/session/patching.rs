//! Patching a stopped process: the patcher's view of its memory, and the
//! batch that instruments (or restores) every chosen function in one stop.

use nix::sys::mman::ProtFlags;

use super::ProbeError;
use crate::patch::{AddressSpace, FunctionSpec, Installed, Outcome, PatchError, Patcher, Refusal, Refused};
use crate::process::Process;

/// The target's memory as seen by the patcher: reads and code writes through
/// the ptrace helper (`/proc/PID/mem`), arenas by a remote `mmap` near the code.
#[derive(Debug)]
pub struct RemoteSpace<'a> {
    process: &'a mut Process,
}

impl<'a> RemoteSpace<'a> {
    /// The memory of a stopped process.
    pub fn new(process: &'a mut Process) -> Self {
        RemoteSpace { process }
    }
}

fn target_err(e: crate::Error) -> PatchError {
    PatchError::Target(e.to_string())
}

impl AddressSpace for RemoteSpace<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), PatchError> {
        self.process.read_memory(addr, buf).map_err(target_err)
    }

    fn write_code(&mut self, addr: u64, bytes: &[u8]) -> Result<(), PatchError> {
        self.process.write_memory(addr, bytes).map_err(target_err)
    }

    fn map_code_near(&mut self, near: u64, len: u64) -> Result<u64, PatchError> {
        self.process
            .mmap_near(near..near + 1, len, ProtFlags::PROT_READ | ProtFlags::PROT_EXEC)
            .map_err(target_err)
    }
}

/// Rounds of letting the target run when a thread is stopped inside the
/// bytes a jump would replace.
const PC_ROUNDS: usize = 20;
/// How long the target runs between rounds.
const PC_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Patches `specs` in the stopped process in one batch. A function some thread
/// is stopped inside (past its first byte, within the bytes the jump replaces)
/// is retried after letting the process run for a moment, up to
/// [`PC_ROUNDS`] times, then refused. The patches stay when this returns;
/// the outcome's window is the time the patcher held the target stopped.
pub(super) fn patch_stopped(p: &mut Process, specs: &[FunctionSpec]) -> Result<Outcome, ProbeError> {
    let mut out = Outcome::default();
    let mut todo = specs.to_vec();
    for round in 0..=PC_ROUNDS {
        if round > 0 {
            p.run_for(PC_PAUSE)?;
        }
        let mut pcs = Vec::new();
        for tid in p.threads() {
            pcs.extend(p.resume_pcs(tid)?);
        }
        let mut patcher = Patcher::new(RemoteSpace::new(p));
        patcher.set_thread_pcs(pcs);
        let outcome = patcher.instrument(&todo)?;
        patcher.keep();
        out.installed.extend(outcome.installed);
        out.arenas.extend(outcome.arenas);
        out.window += outcome.window;
        let (busy, other): (Vec<Refused>, Vec<Refused>) =
            outcome.refused.into_iter().partition(|r| r.reason == Refusal::ThreadInside);
        out.refused.extend(other);
        if busy.is_empty() || round == PC_ROUNDS {
            out.refused.extend(busy);
            break;
        }
        todo.retain(|f| busy.iter().any(|b| b.addr == f.addr && b.name == f.name));
    }
    Ok(out)
}

/// Restores patched functions in the stopped process.
pub(super) fn unpatch_stopped(p: &mut Process, installed: Vec<Installed>) -> Result<(), ProbeError> {
    let mut patcher = Patcher::adopt(RemoteSpace::new(p), installed);
    patcher.remove_all()?;
    Ok(())
}
