//! Entry/exit instrumentation by trampolines.
//!
//! Each chosen function's first instructions (after any `endbr64`) are
//! replaced by a `jmp rel32` to a trampoline in an [`arena`] near it. The
//! trampoline saves the general registers and flags, calls a hook of the
//! probe runtime with the function's id and its return-address slot, then
//! runs the displaced instructions (relocated by iced-x86's BlockEncoder) and
//! jumps back. The runtime's entry hook catches the exit by replacing the
//! return address (see papirus-probe-runtime's `hooks`).
//!
//! [`analyze::plan`] refuses, with a [`Refusal`], any function where this is
//! not safe. A [`Patcher`] patches a batch of functions at once and puts the
//! original bytes back on [`Patcher::remove_all`] or drop; trampolines stay
//! mapped, since live frames may still run through them.

pub mod analyze;
pub mod arena;
pub mod codegen;
pub mod space;

pub use analyze::{EntryPlan, Refusal};
pub use arena::Arena;
pub use space::{AddressSpace, LocalSpace};

/// Errors that stop a whole patch operation (a single function's problem is a [`Refusal`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// Opening a file the patcher needs.
    #[error("open {what}: {source}")]
    Open {
        /// The file.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Reading the target's memory.
    #[error("read target memory at {addr:#x}: {source}")]
    Read {
        /// Address.
        addr: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing the target's code.
    #[error("write target code at {addr:#x}: {source}")]
    Write {
        /// Address.
        addr: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// No free address range within ±2 GiB.
    #[error("no free memory within ±2 GiB of {near:#x} for trampolines")]
    NoRoom {
        /// The address to reach.
        near: u64,
    },
    /// Mapping an arena failed.
    #[error("map trampoline memory near {near:#x}: {source}")]
    Map {
        /// The address to reach.
        near: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// The target's own error (e.g. the process went away).
    #[error("{0}")]
    Target(String),
}

/// Unwinder entry points that get the runtime's `papirus_probe_unwind_begin`
/// hook (libgcc_s): each starts walking the stack, which must then hold real
/// return addresses.
pub const UNWIND_BEGIN: [&str; 4] =
    ["_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_Resume_or_Rethrow", "_Unwind_ForcedUnwind"];
/// Where a C++ catch begins (libstdc++): gets the runtime's `papirus_probe_catch` hook.
pub const CATCH_BEGIN: &str = "__cxa_begin_catch";

/// One function to instrument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    /// Name (for refusals and reports).
    pub name: String,
    /// Address of its first byte.
    pub addr: u64,
    /// Size of its body (from the symbol table).
    pub size: u64,
    /// The hook its trampoline calls.
    pub hook: u64,
    /// The hook's first argument (the function id for the entry hook).
    pub arg: u32,
}

/// A patched function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Name.
    pub name: String,
    /// Address of the jump.
    pub at: u64,
    /// Bytes the jump replaced.
    pub original: Vec<u8>,
    /// The trampoline.
    pub trampoline: u64,
}

/// A function left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Name.
    pub name: String,
    /// Address.
    pub addr: u64,
    /// Why.
    pub reason: Refusal,
}

/// What one [`Patcher::instrument`] call did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Functions patched.
    pub installed: Vec<Installed>,
    /// Functions refused.
    pub refused: Vec<Refused>,
}

/// Patches functions of one address space.
#[derive(Debug)]
pub struct Patcher<S: AddressSpace> {
    space: S,
    arenas: Vec<Arena>,
    installed: Vec<Installed>,
    pcs: Vec<u64>,
}

impl<S: AddressSpace> Patcher<S> {
    /// A patcher for `space`.
    pub fn new(space: S) -> Self {
        Patcher { space, arenas: Vec::new(), installed: Vec::new(), pcs: Vec::new() }
    }

    /// A patcher that owns patches made earlier (e.g. before detaching from
    /// and re-attaching to a process), so it can remove them.
    pub fn adopt(space: S, installed: Vec<Installed>) -> Self {
        Patcher { space, arenas: Vec::new(), installed, pcs: Vec::new() }
    }

    /// Gives up ownership of the patches without removing them (the program
    /// goes on running instrumented).
    pub fn keep(mut self) -> Vec<Installed> {
        std::mem::take(&mut self.installed)
    }

    /// Program counters of the target's stopped threads: a function whose
    /// displaced bytes hold one past their first byte is refused
    /// ([`Refusal::ThreadInside`]) rather than patched under that thread.
    pub fn set_thread_pcs(&mut self, pcs: Vec<u64>) {
        self.pcs = pcs;
    }

    /// The address space (e.g. to stop or resume the target around [`Patcher::instrument`]).
    pub fn space_mut(&mut self) -> &mut S {
        &mut self.space
    }

    /// Functions patched so far.
    pub fn installed(&self) -> &[Installed] {
        &self.installed
    }

    /// Arenas mapped so far.
    pub fn arenas(&self) -> &[Arena] {
        &self.arenas
    }

    /// Plans every function, writes all trampolines, then all jumps. Functions
    /// that cannot be patched are returned as refused; an error means the
    /// target could not be read or written, and nothing of this batch's jumps
    /// was written.
    pub fn instrument(&mut self, funcs: &[FunctionSpec]) -> Result<Outcome, PatchError> {
        let mut out = Outcome::default();
        let mut jumps = Vec::new();
        for f in funcs {
            let refuse = |reason| Refused { name: f.name.clone(), addr: f.addr, reason };
            if f.name.contains(".cold") {
                out.refused.push(refuse(Refusal::NotAnEntry));
                continue;
            }
            let mut code = vec![0; f.size as usize];
            self.space.read(f.addr, &mut code)?;
            let plan = match analyze::plan(&code, f.addr) {
                Ok(p) => p,
                Err(r) => {
                    out.refused.push(refuse(r));
                    continue;
                }
            };
            if self.pcs.iter().any(|&pc| pc > plan.at && pc < plan.resume()) {
                out.refused.push(refuse(Refusal::ThreadInside));
                continue;
            }
            let busy = |i: &Installed| i.at < plan.resume() && plan.at < i.at + i.original.len() as u64;
            if self.installed.iter().chain(&out.installed).any(busy) {
                out.refused.push(refuse(Refusal::AlreadyPatched));
                continue;
            }
            let arena = self.arena_for(plan.at)?;
            let tramp = self.arenas[arena].next();
            let bytes = match codegen::entry_trampoline(&plan, tramp, f.hook, f.arg) {
                Ok(b) if b.len() as u64 <= arena::TRAMPOLINE_MAX => b,
                Ok(b) => {
                    out.refused.push(refuse(Refusal::Relocation(format!("{} bytes of trampoline", b.len()))));
                    continue;
                }
                Err(r) => {
                    out.refused.push(refuse(r));
                    continue;
                }
            };
            let Some(jump) = codegen::entry_jump(&plan, tramp) else {
                out.refused.push(refuse(Refusal::Relocation("trampoline out of rel32 reach".into())));
                continue;
            };
            self.space.write_code(tramp, &bytes)?;
            self.arenas[arena].commit(bytes.len() as u64);
            jumps.push((plan.at, jump));
            out.installed.push(Installed {
                name: f.name.clone(),
                at: plan.at,
                original: plan.original,
                trampoline: tramp,
            });
        }
        for (i, (at, jump)) in jumps.iter().enumerate() {
            if let Err(e) = self.space.write_code(*at, jump) {
                // Leave nothing half-done: undo this batch's jumps.
                for inst in &out.installed[..i] {
                    let _ = self.space.write_code(inst.at, &inst.original);
                }
                return Err(e);
            }
        }
        self.installed.extend(out.installed.iter().cloned());
        Ok(out)
    }

    fn arena_for(&mut self, addr: u64) -> Result<usize, PatchError> {
        if let Some(i) = self.arenas.iter().position(|a| a.serves(addr)) {
            return Ok(i);
        }
        let base = self.space.map_code_near(addr, arena::ARENA_LEN)?;
        self.arenas.push(Arena { base, len: arena::ARENA_LEN, used: 0 });
        let i = self.arenas.len() - 1;
        if self.arenas[i].serves(addr) { Ok(i) } else { Err(PatchError::NoRoom { near: addr }) }
    }

    /// Puts every patched function's original bytes back. Trampolines stay
    /// mapped: frames inside them finish normally.
    pub fn remove_all(&mut self) -> Result<(), PatchError> {
        while let Some(i) = self.installed.last() {
            self.space.write_code(i.at, &i.original)?;
            self.installed.pop();
        }
        Ok(())
    }
}

impl<S: AddressSpace> Drop for Patcher<S> {
    fn drop(&mut self) {
        // Best effort: a target that is gone needs no restoring.
        let _ = self.remove_all();
    }
}
