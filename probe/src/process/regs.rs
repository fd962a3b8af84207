//! Registers of a stopped thread: general-purpose (PTRACE_GETREGS) and the whole
//! FP/vector state (PTRACE_GETREGSET NT_X86_XSTATE, or NT_PRFPREG for x87/SSE only).

use nix::sys::ptrace::{self, regset};
use nix::unistd::Pid;

use super::{Process, sys};
use crate::error::{Error, Result};

/// General-purpose registers, as the kernel's `user_regs_struct`.
pub type Regs = libc::user_regs_struct;

/// A thread's XSAVE area as the kernel gives it (x87, SSE, AVX, AVX-512… per XCR0).
#[derive(Clone, PartialEq, Eq)]
pub struct XState(Vec<u8>);

/// Offsets in the legacy (FXSAVE) part of the area.
const MXCSR: usize = 24;
const XMM0: usize = 160;

impl XState {
    /// The raw area.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// MXCSR (SSE control and status).
    pub fn mxcsr(&self) -> u32 {
        self.0.get(MXCSR..MXCSR + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The low 128 bits of vector register `i` (0..16), little-endian bytes.
    pub fn xmm(&self, i: usize) -> Option<[u8; 16]> {
        let at = XMM0 + 16 * i;
        (i < 16).then(|| self.0.get(at..at + 16)?.try_into().ok()).flatten()
    }

    /// Sets the low 128 bits of vector register `i` (0..16); false when out of range.
    pub fn set_xmm(&mut self, i: usize, value: [u8; 16]) -> bool {
        let at = XMM0 + 16 * i;
        match self.0.get_mut(at..at + 16) {
            Some(slot) if i < 16 => {
                slot.copy_from_slice(&value);
                true
            }
            _ => false,
        }
    }
}

impl std::fmt::Debug for XState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XState").field("len", &self.0.len()).field("mxcsr", &self.mxcsr()).finish()
    }
}

impl Process {
    /// The general-purpose registers of thread `tid`.
    pub fn regs(&self, tid: i32) -> Result<Regs> {
        self.known(tid)?;
        ptrace::getregs(Pid::from_raw(tid)).map_err(|errno| Error::Ptrace {
            op: "PTRACE_GETREGS",
            tid,
            errno,
        })
    }

    /// Sets the general-purpose registers of thread `tid`.
    pub fn set_regs(&mut self, tid: i32, regs: &Regs) -> Result<()> {
        self.known(tid)?;
        ptrace::setregs(Pid::from_raw(tid), *regs).map_err(|errno| Error::Ptrace {
            op: "PTRACE_SETREGS",
            tid,
            errno,
        })
    }

    /// The full XSAVE area of thread `tid`.
    pub fn xstate(&self, tid: i32) -> Result<XState> {
        self.known(tid)?;
        sys::get_xstate(tid).map(XState).map_err(|errno| Error::Ptrace {
            op: "PTRACE_GETREGSET(NT_X86_XSTATE)",
            tid,
            errno,
        })
    }

    /// Sets the XSAVE area of thread `tid` (as read by [`Process::xstate`]).
    pub fn set_xstate(&mut self, tid: i32, state: &XState) -> Result<()> {
        self.known(tid)?;
        sys::set_xstate(tid, &state.0).map_err(|errno| Error::Ptrace {
            op: "PTRACE_SETREGSET(NT_X86_XSTATE)",
            tid,
            errno,
        })
    }

    /// The x87/SSE registers of thread `tid` (NT_PRFPREG, the FXSAVE layout).
    pub fn fpregs(&self, tid: i32) -> Result<libc::user_fpregs_struct> {
        self.known(tid)?;
        ptrace::getregset::<regset::NT_PRFPREG>(Pid::from_raw(tid)).map_err(|errno| Error::Ptrace {
            op: "PTRACE_GETREGSET(NT_PRFPREG)",
            tid,
            errno,
        })
    }

    fn known(&self, tid: i32) -> Result<()> {
        if self.threads.contains_key(&tid) {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                what: format!("{tid} is not a thread of pid {} held by papirus", self.pid),
            })
        }
    }
}
