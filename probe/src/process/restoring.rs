//! Remote code that restores its thread by itself, with no trap, fault or
//! single step anywhere: if papirus dies at any moment, the thread finishes
//! what it was given, puts every register back and goes on where it was.
//!
//! Two pieces of code, written by papirus into the target:
//!
//! - **The restore block**, in never-executed slack: the bytes between the
//!   end of a module's executable segment and the end of its last page
//!   (the program has no symbol there and never jumps or points there; 200
//!   bytes are needed, and libc, ld.so and most programs have several KiB).
//!   Written at the first remote operation, put back (the module file's own
//!   bytes) when the process is released:
//!
//!   ```text
//!   syscall                  ; a remote system call (rax, arguments set)
//!   mov r8, rax              ; its result, kept across what follows
//!   restore:                 ; a remote function's return comes here too
//!   rt_sigprocmask(SIG_SETMASK, &mask, 0, 8)
//!   mov rax..r11, [data]     ; every register the code above changes
//!   jmp [rip]                ; the thread's own rip
//!   data: mask rax rcx rdx rsi rdi r8 r9 r10 r11 rip
//!   ```
//!
//! - **The stub region**, mapped (by remote system calls through the block
//!   above) at the first remote function call: a read-only executable area
//!   whose code a function returns into, and a private stack the function
//!   runs on (the target's own stacks are never written: a thread may be on
//!   a small `sigaltstack` or coroutine stack with no room below its rsp):
//!
//!   ```text
//!   mov r8, rax; xrstor [xsave]; push [flags]; popfq
//!   mov rbx, rbp, r12..r15, rsp <- data; jmp [restore]
//!   data: xsave-pointer flags rbx rbp r12 r13 r14 r15 rsp restore; xsave area
//!   ```
//!
//! papirus writes the thread's own state into the data words, sets the
//! registers for the remote code, blocks every signal (so the target's
//! handlers never run on our context and no signal can cut the call short),
//! and follows the thread through its system-call stops. At the entry of the
//! `rt_sigprocmask` of the restore block it reads the result from r8, lets
//! that call put the thread's own mask back, stops the thread before any
//! signal is delivered and sets its exact registers. If papirus dies
//! anywhere on the way, the code runs to its end: the mask, vector state,
//! flags and every register are the thread's own again, and the thread
//! jumps to its own rip.
//!
//! No `rt_sigreturn` is involved, so the kernel's restart block stays as it
//! was: a thread asleep in `nanosleep` (interrupted with
//! `-ERESTART_RESTARTBLOCK`) sleeps on to its deadline afterwards. A system
//! call the thread was in is held rewound to its restart in the data words
//! (rax the call again, or `restart_syscall`; rip on the `syscall`), as the
//! kernel itself rewinds it when it resumes the thread without a handler;
//! papirus then sets the exact registers back so the kernel's restart logic
//! (EINTR or restart, by the handler's `SA_RESTART`) applies as without us.

use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::*;
use nix::errno::Errno;

use super::wait::{self, Event};
use super::{Process, Regs, sys};
use crate::error::{Error, Result};
use papirus_substrate::maps::{self, Mapping};

/// rflags bits: trap (single-step) and direction.
const TF: u64 = 1 << 8;
const DF: u64 = 1 << 10;

/// The stub region: its read-only code and data (the XSAVE area included),
/// then the private stack.
const CODE_LEN: u64 = 5 * 4096;
const REGION: u64 = CODE_LEN + 256 * 1024;
/// Where the XSAVE area lies in the stub region (64-byte aligned; the
/// kernel's area is at most 16 KiB).
const XSAVE_AT: u64 = 4096;
/// The return slot of a remote function: 8 below a 16-byte boundary (as
/// after a call), with room above it for the `push` of the restore.
const SLOT_BELOW_TOP: u64 = 24;

/// `rt_sigprocmask` and its `SIG_SETMASK`.
const SYS_RT_SIGPROCMASK: u64 = 14;
const SIG_SETMASK: i32 = 2;
/// `restart_syscall`: what a thread in a sleep restarted through the restart block resumes with.
const SYS_RESTART_SYSCALL: u64 = 219;
/// Kernel return codes that make a syscall restart at `rip - 2` with its own number.
const RESTART_SAME: [i64; 3] = [-512, -513, -514];
/// `-ERESTART_RESTARTBLOCK`: restarts through `restart_syscall`.
const RESTART_BLOCK: i64 = -516;

/// The first bytes of the restore block (`syscall; mov r8, rax; mov eax, 14`),
/// position-independent: found in slack, they are a copy a papirus that
/// died there left behind, not the module's bytes.
const SIGNATURE: [u8; 10] = [0x0f, 0x05, 0x49, 0x89, 0xc0, 0xb8, 0x0e, 0x00, 0x00, 0x00];

/// What a thread held for remote code was: its registers and signal mask.
struct Held {
    saved: Regs,
    mask: u64,
}

/// The restore block written at an address (see the module documentation).
#[derive(Debug, Clone)]
pub(super) struct Slack {
    /// Where the block lies; a remote system call starts here.
    pub at: u64,
    /// The bytes it replaced (the module file's), put back at release.
    original: Vec<u8>,
    /// Where a remote function's return continues (the mask restore).
    restore: u64,
    /// Just past the restore's `syscall`: its entry stop is where papirus takes over.
    mask_end: u64,
    /// The data words: mask, rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11, rip.
    data: u64,
}

/// The restore block assembled for address `at`.
fn slack_code(at: u64) -> std::result::Result<(Vec<u8>, [u64; 3]), IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut restore = a.create_label();
    let mut after = a.create_label();
    let mut words: Vec<CodeLabel> = (0..11).map(|_| a.create_label()).collect();
    a.syscall()?;
    a.mov(r8, rax)?;
    a.set_label(&mut restore)?;
    // No instruction here changes the flags: a system call leaves them as they were.
    a.mov(eax, SYS_RT_SIGPROCMASK as i32)?;
    a.mov(edi, SIG_SETMASK)?;
    a.lea(rsi, qword_ptr(words[0]))?;
    a.mov(edx, 0)?;
    a.mov(r10d, 8)?;
    a.syscall()?;
    a.set_label(&mut after)?;
    for (i, r) in [rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11].into_iter().enumerate() {
        a.mov(r, qword_ptr(words[i + 1]))?;
    }
    a.jmp(qword_ptr(words[10]))?;
    for w in &mut words {
        a.set_label(w)?;
        a.dq(&[0])?;
    }
    let r = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    Ok((r.inner.code_buffer.clone(), [r.label_ip(&restore)?, r.label_ip(&after)?, r.label_ip(&words[0])?]))
}

/// The stub's code assembled for address `at`; returns it and its data's address.
fn stub_code(at: u64) -> std::result::Result<(Vec<u8>, u64), IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut words: Vec<CodeLabel> = (0..10).map(|_| a.create_label()).collect();
    a.mov(r8, rax)?;
    a.mov(rcx, qword_ptr(words[0]))?;
    a.mov(eax, -1)?;
    a.mov(edx, -1)?;
    a.xrstor64(qword_ptr(rcx))?;
    a.push(qword_ptr(words[1]))?;
    a.popfq()?;
    for (i, r) in [rbx, rbp, r12, r13, r14, r15, rsp].into_iter().enumerate() {
        a.mov(r, qword_ptr(words[i + 2]))?;
    }
    a.jmp(qword_ptr(words[9]))?;
    for w in &mut words {
        a.set_label(w)?;
        a.dq(&[0])?;
    }
    let r = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    Ok((r.inner.code_buffer.clone(), r.label_ip(&words[0])?))
}

fn asm_error(e: IcedError) -> Error {
    Error::InvalidArgument { what: format!("assembling papirus' restore code: {e}") }
}

/// The state the thread goes back to by itself: its own, with a system call
/// it was in rewound to its restart (see the module documentation).
fn rewound(r: &Regs) -> Regs {
    let mut b = *r;
    if (r.orig_rax as i64) >= 0 {
        if RESTART_SAME.contains(&(r.rax as i64)) {
            (b.rax, b.rip) = (r.orig_rax, r.rip.wrapping_sub(2));
        } else if r.rax as i64 == RESTART_BLOCK {
            (b.rax, b.rip) = (SYS_RESTART_SYSCALL, r.rip.wrapping_sub(2));
        }
    }
    b
}

fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Process {
    /// The restore block, written at the first use.
    pub(super) fn slack(&mut self) -> Result<Slack> {
        if let Some(s) = &self.slack {
            return Ok(s.clone());
        }
        let probe = slack_code(0).map_err(asm_error)?.0.len() as u64;
        let (at, m) = self.find_slack(probe)?;
        let (code, [restore, mask_end, data]) = slack_code(at).map_err(asm_error)?;
        let mut original = self.read_vec(at, code.len())?;
        if original.starts_with(&SIGNATURE) {
            original = self.file_bytes(&m, at, code.len())?;
        }
        let slack = Slack { at, original, restore, mask_end, data };
        self.write_memory(at, &code)?;
        self.slack = Some(slack.clone());
        Ok(slack)
    }

    /// Puts the module's bytes back where the restore block was.
    pub(super) fn drop_slack(&mut self) {
        if let Some(s) = self.slack.take() {
            let _ = self.write_memory(s.at, &s.original);
        }
    }

    /// `len` bytes at `addr` as the file mapped at `m` holds them (zeros past its end).
    fn file_bytes(&self, m: &Mapping, addr: u64, len: usize) -> Result<Vec<u8>> {
        let file =
            papirus_substrate::input::read_module(self.pid, m, papirus_substrate::input::MODULE_LIMIT)?
                .unwrap_or_default();
        let off = (m.offset + (addr - m.start)) as usize;
        let mut out = vec![0; len];
        if let Some(b) = file.get(off..) {
            let n = b.len().min(len);
            out[..n].copy_from_slice(&b[..n]);
        }
        Ok(out)
    }

    /// Never-executed bytes for a block of `len` bytes: after the end of an
    /// executable `PT_LOAD` segment of a mapped module, up to the end of its
    /// page, inside the same executable mapping and clear of every other
    /// segment. libc first, then the loader, then the others.
    fn find_slack(&self, len: u64) -> Result<(u64, Mapping)> {
        let mappings = maps::read(self.pid)
            .map_err(|source| Error::Io { path: super::proc_path(self.pid, "maps"), source })?;
        let rank = |m: &Mapping| {
            let base = m.name.rsplit('/').next().unwrap_or("");
            if base.starts_with("libc.so") || base.starts_with("libc-") {
                0
            } else if base.starts_with("ld-linux") || base.starts_with("ld.so") {
                1
            } else {
                2
            }
        };
        let mut code: Vec<&Mapping> =
            mappings.iter().filter(|m| m.perms.exec && m.perms.read && m.file().is_some()).collect();
        code.sort_by_key(|m| rank(m));
        for m in code {
            let Some(base) = mappings.iter().find(|b| b.dev == m.dev && b.inode == m.inode && b.offset == 0)
            else {
                continue;
            };
            for (start, end) in self.segment_slack(base.start).unwrap_or_default() {
                if end - start >= len && m.start <= start && end <= m.end {
                    return Ok((start, m.clone()));
                }
            }
        }
        Err(Error::NotFound {
            what: format!("{len} bytes of code slack"),
            pid: self.pid,
            detail: "no executable segment of a mapped module ends far enough before its page's end: \
                     papirus runs no code in this process rather than risk a trap in it"
                .into(),
        })
    }

    /// The slack after each executable segment of the ELF module loaded at
    /// `base` (its program headers read from memory), clear of every segment.
    fn segment_slack(&self, base: u64) -> Option<Vec<(u64, u64)>> {
        let mut ehdr = [0u8; 64];
        self.read_memory(base, &mut ehdr).ok()?;
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        if ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 || u16_at(&ehdr, 54) != 56 || u16_at(&ehdr, 56) > 64 {
            return None;
        }
        let phdrs = self.read_vec(base + u64_at(&ehdr, 32), 56 * usize::from(u16_at(&ehdr, 56))).ok()?;
        // (vaddr, memsz, offset, executable) of each PT_LOAD.
        let loads: Vec<(u64, u64, u64, bool)> = phdrs
            .chunks_exact(56)
            .filter(|p| p[..4] == 1u32.to_le_bytes())
            .map(|p| (u64_at(p, 16), u64_at(p, 40), u64_at(p, 8), p[4] & 1 != 0))
            .collect();
        let first = loads.iter().find(|l| l.2 == 0)?;
        let bias = base.checked_sub(first.0 & !4095)?;
        let mut out = Vec::new();
        for &(vaddr, memsz, _, _) in loads.iter().filter(|l| l.3) {
            let end = bias.checked_add(vaddr)?.checked_add(memsz)?;
            let (start, page_end) = (end.next_multiple_of(64), end.next_multiple_of(4096));
            let clear = loads.iter().all(|&(v, s, _, _)| {
                let (a, b) = (bias + v, bias + v + s);
                b <= start || a >= page_end
            });
            if start < page_end && clear {
                out.push((start, page_end));
            }
        }
        Some(out)
    }

    /// The stub region, mapped and written at the first remote function call.
    pub(super) fn stub(&mut self) -> Result<u64> {
        if let Some(s) = self.stub {
            return Ok(s);
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let region =
            self.checked_syscall("mmap", libc::SYS_mmap, &[0, REGION, rw, flags as u64, u64::MAX, 0])?;
        let rx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let ready = stub_code(region)
            .map_err(asm_error)
            .and_then(|(code, _)| self.write_memory(region, &code))
            .and_then(|()| self.checked_syscall("mprotect", libc::SYS_mprotect, &[region, CODE_LEN, rx]));
        if let Err(e) = ready {
            let _ = self.checked_syscall("munmap", libc::SYS_munmap, &[region, REGION]);
            return Err(e);
        }
        self.stub = Some(region);
        Ok(region)
    }

    /// Unmaps the stub region (best effort, when a thread can still run code).
    pub(super) fn drop_stub(&mut self) {
        if let Some(region) = self.stub.take()
            && self.usable(self.worker).is_ok()
        {
            let _ = self.checked_syscall("munmap", libc::SYS_munmap, &[region, REGION]);
        }
    }

    /// A remote system call that fails with its errno as [`Error::RemoteSyscall`].
    pub(super) fn checked_syscall(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64> {
        let r = self.syscall(nr, args)?;
        if (-4095..0).contains(&r) {
            Err(Error::RemoteSyscall { name, pid: self.pid, errno: Errno::from_raw(-r as i32) })
        } else {
            Ok(r as u64)
        }
    }

    /// Runs system call `regs.rax` (arguments set) on `tid` through the
    /// restore block; returns its result. `tid` ends in an interrupt stop
    /// with its exact registers.
    pub(super) fn run_syscall(&mut self, tid: i32, mut regs: Regs) -> Result<u64> {
        let slack = self.slack()?;
        regs.rip = slack.at;
        let held = self.prepare(tid, regs, &slack)?;
        let out = self.follow(tid, slack.mask_end);
        self.finish(tid, held, out, None)
    }

    /// Calls the function at `regs.rip` (arguments set) on `tid`, on the
    /// private stack, returning into the stub; returns rax. `tid` ends in an
    /// interrupt stop with its exact registers and vector state.
    pub(super) fn run_function(&mut self, tid: i32, regs: Regs) -> Result<u64> {
        let slack = self.slack()?;
        let (regs, x) = self.function_frame(tid, regs, &slack)?;
        let held = self.prepare(tid, regs, &slack)?;
        let out = self.follow(tid, slack.mask_end);
        self.finish(tid, held, out, Some(&x))
    }

    /// Writes the stub's data for a function call on `tid` (what the stub
    /// restores: vector state, flags, callee-saved registers, rsp) and its
    /// return slot; returns `regs` on the private stack, and the vector state.
    fn function_frame(&mut self, tid: i32, mut regs: Regs, slack: &Slack) -> Result<(Regs, super::XState)> {
        let stub = self.stub()?;
        let s = self.regs(tid)?;
        let x = self.xstate(tid)?;
        let (_, data) = stub_code(stub).map_err(asm_error)?;
        let xsave = stub + XSAVE_AT;
        if x.as_bytes().len() as u64 > CODE_LEN - XSAVE_AT {
            return Err(Error::InvalidArgument {
                what: format!("thread {tid}: an XSAVE area of {} bytes does not fit", x.as_bytes().len()),
            });
        }
        let back = [xsave, s.eflags, s.rbx, s.rbp, s.r12, s.r13, s.r14, s.r15, s.rsp, slack.restore];
        self.write_memory(data, &words(&back))?;
        self.write_memory(xsave, x.as_bytes())?;
        let slot = stub + REGION - SLOT_BELOW_TOP;
        self.write_u64(slot, stub)?;
        regs.rsp = slot;
        regs.eflags &= !(TF | DF);
        Ok((regs, x))
    }

    /// Writes the thread's own state into the restore block's data, sets
    /// `regs` and blocks every signal: from here on the thread restores
    /// itself whenever papirus lets it go.
    fn prepare(&mut self, tid: i32, mut regs: Regs, slack: &Slack) -> Result<Held> {
        let saved = self.regs(tid)?;
        let mask =
            sys::get_sigmask(tid).map_err(|errno| Error::Ptrace { op: "PTRACE_GETSIGMASK", tid, errno })?;
        let b = rewound(&saved);
        let data = [mask, b.rax, b.rcx, b.rdx, b.rsi, b.rdi, b.r8, b.r9, b.r10, b.r11, b.rip];
        self.write_memory(slack.data, &words(&data))?;
        regs.orig_rax = u64::MAX;
        self.set_regs(tid, &regs)?;
        self.thread(tid).in_delivery = false;
        // Only now: a papirus that dies between the two leaves the code
        // running under the thread's own mask, never the thread blocked for good.
        sys::set_sigmask(tid, u64::MAX).map_err(|errno| Error::Ptrace {
            op: "PTRACE_SETSIGMASK",
            tid,
            errno,
        })?;
        Ok(Held { saved, mask })
    }

    /// After [`Process::follow`]: the thread back in an interrupt stop with
    /// its exact registers (on success, from the restore's `rt_sigprocmask`
    /// entry; on failure, best effort).
    fn finish(&mut self, tid: i32, held: Held, out: Result<u64>, x: Option<&super::XState>) -> Result<u64> {
        if !self.threads.contains_key(&tid) {
            return out;
        }
        match out {
            Ok(v) => {
                // The restore's rt_sigprocmask puts the thread's mask back; the
                // interrupt stops it before a signal is delivered (job-control
                // traps come first), and its exact registers go back.
                self.cont_and_interrupt(tid)?;
                self.wait_stopped([tid].into(), "stop after remote code")?;
                self.set_regs(tid, &held.saved)?;
                Ok(v)
            }
            Err(e) => {
                // Best effort: a fault of ours is discarded, the thread put back.
                if matches!(e, Error::RemoteFault { .. }) {
                    let _ =
                        self.cont_and_interrupt(tid).and_then(|()| self.wait_stopped([tid].into(), "stop"));
                }
                let _ = self.set_regs(tid, &held.saved);
                if let Some(x) = x {
                    let _ = self.set_xstate(tid, x);
                }
                let _ = sys::set_sigmask(tid, held.mask);
                Err(e)
            }
        }
    }

    /// Follows `tid` through its system calls until the entry of the
    /// restore's `rt_sigprocmask` (at `mask_end`); returns r8 there: the
    /// remote system call's or function's result.
    fn follow(&mut self, tid: i32, mask_end: u64) -> Result<u64> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            sys::ptrace(libc::PTRACE_SYSCALL, tid, 0, 0).map_err(|errno| Error::Ptrace {
                op: "PTRACE_SYSCALL",
                tid,
                errno,
            })?;
            let Some(ev) = wait::event(tid, deadline)? else {
                return Err(self.stuck(tid));
            };
            match ev {
                Event::Syscall => {
                    let r = self.regs(tid)?;
                    if r.rip == mask_end && r.orig_rax == SYS_RT_SIGPROCMASK {
                        return Ok(r.r8);
                    }
                }
                Event::Stopped => {}
                Event::Clone(new) => {
                    self.threads.entry(new).or_default();
                    self.wait_stopped([new].into(), "stop")?;
                }
                // Every other signal is blocked: a fault is the remote code's.
                Event::Signal(sig)
                    if matches!(
                        sig,
                        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP
                    ) =>
                {
                    let r = self.regs(tid)?;
                    let addr = nix::sys::ptrace::getsiginfo(nix::unistd::Pid::from_raw(tid))
                        .map_or(0, |info| sys::fault_addr(&info));
                    return Err(Error::RemoteFault { func: mask_end, tid, signal: sig, rip: r.rip, addr });
                }
                // SIGSTOP cannot be blocked: hold it for the target.
                Event::Signal(sig) => self.thread(tid).pending.push(sig),
                Event::Exiting(status) => {
                    self.thread(tid).exit = Some(status);
                    return Err(self.exited("remote execution", status));
                }
                Event::Gone(status) => {
                    self.threads.remove(&tid);
                    return Err(self.exited("remote execution", status));
                }
                Event::Exec => return Err(self.exec_error("remote execution")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    use super::*;

    fn disassemble(code: &[u8], ip: u64) -> Vec<String> {
        let mut f = IntelFormatter::new();
        Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
            .into_iter()
            .map(|i| {
                let mut s = String::new();
                f.format(&i, &mut s);
                s
            })
            .collect()
    }

    #[test]
    fn restore_block_reads_its_words_and_changes_no_flag() {
        let at = 0x7f00_0000_1040;
        let (code, [restore, mask_end, data]) = slack_code(at).unwrap();
        assert!(code.starts_with(&SIGNATURE));
        assert_eq!(code.len() as u64, data + 11 * 8 - at);
        let text = disassemble(&code[..(data - at) as usize], at);
        assert_eq!(text[0], "syscall");
        assert_eq!(text[1], "mov r8,rax");
        assert_eq!(restore, at + 5);
        // The mask restore's syscall ends at mask_end.
        let upto = disassemble(&code[..(mask_end - at) as usize], at);
        assert_eq!(upto.last().map(String::as_str), Some("syscall"));
        let f = |name: &str, i: u64| format!("{name},[{:X}h]", data + 8 * i);
        assert!(text.contains(&format!("lea rsi,[{data:X}h]")), "{text:?}");
        for (i, r) in ["rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11"].iter().enumerate() {
            assert!(text.contains(&format!("mov {}", f(r, i as u64 + 1))), "{r}: {text:?}");
        }
        assert!(text.contains(&format!("jmp qword ptr [{:X}h]", data + 80)), "{text:?}");
        // Nothing but the system calls (which return with the caller's flags) writes the flags.
        let mut d = Decoder::with_ip(64, &code[..(data - at) as usize], at, DecoderOptions::NONE);
        while d.can_decode() {
            let i = d.decode();
            if i.mnemonic() != iced_x86::Mnemonic::Syscall {
                assert_eq!(i.rflags_modified(), 0, "{i} changes flags");
            }
        }
        // Never more than the slack bound the finder asks for.
        assert!(code.len() <= 256);
    }

    #[test]
    fn stub_restores_vector_state_flags_and_callee_saved_registers() {
        let at = 0x7f00_0000_0000;
        let (code, data) = stub_code(at).unwrap();
        let text = disassemble(&code[..(data - at) as usize], at);
        let expect = [
            "mov r8,rax".to_string(),
            format!("mov rcx,[{data:X}h]"),
            "mov eax,0FFFFFFFFh".into(),
            "mov edx,0FFFFFFFFh".into(),
            "xrstor64 [rcx]".into(),
            format!("push qword ptr [{:X}h]", data + 8),
            "popfq".into(),
        ];
        assert_eq!(text[..7], expect);
        for (i, r) in ["rbx", "rbp", "r12", "r13", "r14", "r15", "rsp"].iter().enumerate() {
            assert_eq!(text[7 + i], format!("mov {r},[{:X}h]", data + 16 + 8 * i as u64));
        }
        assert_eq!(text[14], format!("jmp qword ptr [{:X}h]", data + 72));
    }

    #[test]
    fn a_syscall_the_thread_was_in_is_held_rewound() {
        let mut r: Regs = zeroed_regs();
        (r.orig_rax, r.rax, r.rip) = (0, (-512i64) as u64, 0x1002);
        assert_eq!((rewound(&r).rax, rewound(&r).rip), (0, 0x1000));
        (r.orig_rax, r.rax) = (35, (-516i64) as u64);
        assert_eq!((rewound(&r).rax, rewound(&r).rip), (SYS_RESTART_SYSCALL, 0x1000));
        // Finished (a result in rax) or in user space: as it is.
        (r.orig_rax, r.rax) = (0, 5);
        assert_eq!((rewound(&r).rax, rewound(&r).rip), (5, 0x1002));
        (r.orig_rax, r.rax) = (u64::MAX, (-512i64) as u64);
        assert_eq!(rewound(&r).rip, 0x1002);
    }

    /// A thread let go (as when papirus dies) at every point of a remote
    /// system call and of a remote function (before it runs, at each of its
    /// system-call stops, and in the last interrupt stop before its registers
    /// are set back): it finishes the code, restores itself, and the system
    /// call it was in (a read, or a sleep restarted through the kernel's
    /// restart block) goes on with every register as it was.
    #[test]
    fn a_thread_let_go_anywhere_in_remote_code_restores_itself() {
        use std::io::{BufRead, BufReader, Write};
        use std::process::{Command, Stdio};
        let dir = tempfile::tempdir().unwrap();
        let exe = papirus_testkit::Cc::new(papirus_testkit::target("guarded_syscall.c"))
            .arg("-pthread")
            .build(dir.path(), "guarded");
        for mode in ["read", "sleep"] {
            for function in [false, true] {
                // System-call stops on the way: the call's entry and exit, then
                // the restore's mask call; a function (frexp) makes none.
                let stops = if function { 1 } else { 3 };
                for k in 0..=stops + 1 {
                    let what = format!(
                        "{mode}, {}, let go after {k} stops",
                        if function { "function" } else { "syscall" }
                    );
                    let mut child = Command::new(&exe)
                        .arg(mode)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let mut out = BufReader::new(child.stdout.take().unwrap());
                    let mut line = String::new();
                    out.read_line(&mut line).unwrap();
                    assert_eq!(line.trim(), "ready");
                    let pid = child.id() as i32;
                    let nr = if mode == "read" { "0 " } else { "35 " };
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                    while !std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap().starts_with(nr) {
                        assert!(std::time::Instant::now() < deadline, "{what}: never in its system call");
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    let mut p = Process::attach(pid).unwrap();
                    p.set_worker(pid).unwrap();
                    let page = p
                        .mmap_anywhere(
                            4096,
                            nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                        )
                        .unwrap();
                    let slack = p.slack().unwrap();
                    let mut r = p.regs(pid).unwrap();
                    let regs = if function {
                        r.rip = p.module_function("libc.so", "frexp").unwrap();
                        (r.rdi, r.rax) = (page, 0);
                        p.function_frame(pid, r, &slack).unwrap().0
                    } else {
                        (r.rip, r.rax) = (slack.at, libc::SYS_getpid as u64);
                        r
                    };
                    p.prepare(pid, regs, &slack).unwrap();
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                    for _ in 0..k.min(stops) {
                        sys::ptrace(libc::PTRACE_SYSCALL, pid, 0, 0).unwrap();
                        assert_eq!(wait::event(pid, deadline).unwrap(), Some(Event::Syscall), "{what}");
                    }
                    if k > stops {
                        assert_eq!(p.regs(pid).unwrap().rip, slack.mask_end, "{what}");
                        p.cont_and_interrupt(pid).unwrap();
                        p.wait_stopped([pid].into(), "stop").unwrap();
                    }
                    p.vanish();
                    let mut stdin = child.stdin.take().unwrap();
                    if mode == "read" {
                        stdin.write_all(b"x").unwrap();
                    }
                    line.clear();
                    out.read_line(&mut line).unwrap();
                    assert_eq!(line.trim(), "ok 0", "{what}");
                    drop(stdin);
                    let mut rest = String::new();
                    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
                    let st = child.wait().unwrap();
                    assert!(st.success() && !rest.contains("FAIL"), "{what}: {st} {rest}");
                }
            }
        }
    }

    fn zeroed_regs() -> Regs {
        // user_regs_struct is plain integers; Default is not derived by libc.
        Regs {
            r15: 0,
            r14: 0,
            r13: 0,
            r12: 0,
            rbp: 0,
            rbx: 0,
            r11: 0,
            r10: 0,
            r9: 0,
            r8: 0,
            rax: 0,
            rcx: 0,
            rdx: 0,
            rsi: 0,
            rdi: 0,
            orig_rax: 0,
            rip: 0,
            cs: 0,
            eflags: 0,
            rsp: 0,
            ss: 0,
            fs_base: 0,
            gs_base: 0,
            ds: 0,
            es: 0,
            fs: 0,
            gs: 0,
        }
    }
}
