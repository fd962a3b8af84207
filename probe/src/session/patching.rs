//! Patching a stopped process: the patcher's view of its memory, and the
//! batch that instruments (or restores) every chosen function in one stop.

use nix::sys::mman::ProtFlags;

use super::ProbeError;
use crate::patch::arena::ARENA_NAME;
use crate::patch::{AddressSpace, FunctionSpec, Installed, Outcome, PatchError, Patcher, Refusal, Refused};
use crate::process::Process;

/// The target's memory as seen by the patcher: reads and code writes through
/// the ptrace helper (`/proc/PID/mem`), arenas by a remote `mmap` near the
/// code of a memfd named [`ARENA_NAME`] (a later detach finds pages an
/// earlier one left by that name).
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
    PatchError::Target(Box::new(e))
}

/// A patch error as the session's: the target's own (its end, an execve)
/// keeps its kind, so callers can tell a target that is gone.
fn patch_err(e: PatchError) -> ProbeError {
    match e {
        PatchError::Target(e) => ProbeError::Process(*e),
        e => e.into(),
    }
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
            .mmap_named_near(near..near + 1, len, ProtFlags::PROT_READ | ProtFlags::PROT_EXEC, ARENA_NAME)
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
///
/// The outcome holds every patch installed and every arena mapped, whatever
/// happens: a round that fails (the target unreadable, gone, or exec'd while
/// it ran between rounds) leaves the patches of earlier rounds in place, and
/// the process may have run through them, so the caller restores them as at
/// detach (the error comes beside the outcome, not instead of it).
pub(super) fn patch_stopped(p: &mut Process, specs: &[FunctionSpec]) -> (Outcome, Result<(), ProbeError>) {
    let mut out = Outcome::default();
    let mut todo = specs.to_vec();
    for round in 0..=PC_ROUNDS {
        if round > 0
            && let Err(e) = p.run_for(PC_PAUSE)
        {
            return (out, Err(e.into()));
        }
        let mut pcs = Vec::new();
        for tid in p.threads() {
            match p.resume_pcs(tid) {
                Ok(v) => pcs.extend(v),
                Err(e) => return (out, Err(e.into())),
            }
        }
        let mut patcher = Patcher::new(RemoteSpace::new(p));
        patcher.set_thread_pcs(pcs);
        let outcome = match patcher.instrument(&todo) {
            Ok(o) => o,
            Err(e) => {
                // None of this batch's jumps stayed; its arenas did.
                out.arenas.extend(patcher.arenas().iter().cloned());
                return (out, Err(patch_err(e)));
            }
        };
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
    (out, Ok(()))
}

/// Restores patched functions in the stopped process.
pub(super) fn unpatch_stopped(p: &mut Process, installed: Vec<Installed>) -> Result<(), ProbeError> {
    let mut patcher = Patcher::adopt(RemoteSpace::new(p), installed);
    patcher.remove_all().map_err(patch_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread sleeps inside the first bytes of `stuck`, so its patch waits
    /// for a later round; the program ends as soon as it sees `other`
    /// patched, so that round fails. `other`'s patch, installed in the first
    /// round, is still in what `patch_stopped` returns.
    #[test]
    fn a_failing_later_round_keeps_the_earlier_patches() {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let src = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
/* pause(2) in a loop, its syscall among the bytes a jump would replace. */
__attribute__((naked, noinline)) void *stuck(void *a) {
    __asm__("1: xor %eax, %eax\n mov $34, %al\n syscall\n jmp 1b\n");
}
__attribute__((noinline)) long other(long x) { return x * 3 + 1; }
int main(void) {
    unsigned char first = *(volatile unsigned char *)other;
    pthread_t t;
    pthread_create(&t, 0, stuck, 0);
    printf("ready %p %p\n", (void *)stuck, (void *)other);
    fflush(stdout);
    while (*(volatile unsigned char *)other == first) usleep(200);
    _exit(0);
}
"#;
        let exe = papirus_testkit::Cc::from_text(dir.path(), "rounds.c", src)
            .opt("-O1")
            .arg("-pthread")
            .build(dir.path(), "rounds");
        let mut child =
            std::process::Command::new(&exe).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addrs: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut p = Process::attach(child.id() as i32).unwrap();
        let spec = |name: &str, addr: u64, size: u64| FunctionSpec {
            name: name.into(),
            addr,
            size,
            // Never called: the program stops calling anything.
            hook: 0x1000,
            arg: 0,
            limit: 0,
        };
        let specs = [spec("stuck", addrs[0], 8), spec("other", addrs[1], 8)];
        let (outcome, result) = patch_stopped(&mut p, &specs);
        let err = result.expect_err("the later round should fail");
        assert!(matches!(err, ProbeError::Process(crate::Error::TargetExited { .. })), "{err}");
        assert_eq!(outcome.installed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["other"]);
        assert!(!outcome.arenas.is_empty());
        drop(p);
        // Reaped by papirus' wait already.
        let _ = child.wait();
    }
}
