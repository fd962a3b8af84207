//! Which functions of a process to instrument: modules and globs to function specs.

use super::{ProbeError, TargetHooks};
use papirus_substrate::elf::SymbolKind;

use crate::inventory::{Function, Inventory, Module, Patchability, Reason, glob_match, ifunc, patchable};
use crate::patch::{CATCH_BEGIN, FunctionSpec, UNWIND_BEGIN};

/// Names that are never entry points reached by a call.
const NOT_CALLED: [&str; 3] = ["_start", "_dl_start", "_dl_start_user"];

/// Which functions to instrument.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Modules whose basename equals, or whose path contains, this; the main program when `None`.
    pub module: Option<String>,
    /// Function globs (stored or demangled names); every function when empty.
    pub functions: Vec<String>,
}

/// The chosen functions (names for the session; specs for the patcher, ids in order)
/// plus the unwinder's entry points. An IFUNC stands for the implementation
/// it resolved to, read from the target's memory with `read_u64`.
pub(super) fn select(
    inv: &Inventory,
    sel: &Selection,
    hooks: &TargetHooks,
    entry: Option<u64>,
    read_u64: &mut dyn FnMut(u64) -> Option<u64>,
) -> Result<(Vec<String>, Vec<FunctionSpec>), ProbeError> {
    let modules: Vec<_> = inv
        .modules
        .iter()
        .filter(|m| match &sel.module {
            Some(pat) => m.matches(pat),
            None => m.is_main,
        })
        .filter(|m| !m.basename().starts_with("libpapirus_probe_runtime"))
        .collect();
    let mut names = Vec::new();
    let mut specs = Vec::new();
    for m in &modules {
        for f in &m.functions {
            let wanted = sel.functions.is_empty()
                || sel.functions.iter().any(|g| {
                    glob_match(g, &f.name) || f.demangled.as_deref().is_some_and(|d| glob_match(g, d))
                });
            let called = !NOT_CALLED.contains(&f.name.as_str())
                && entry.is_none_or(|e| !(f.address..f.address + f.size).contains(&e));
            let ifunc = f.kind == SymbolKind::Ifunc;
            if !wanted || !called || f.size == 0 || !(ifunc || f.kind == SymbolKind::Function) {
                continue;
            }
            // A compat version (`memcpy@GLIBC_2.2.5`) beside the default one is not what callers bind to.
            if f.hidden_version && m.functions.iter().any(|g| g.name == f.name && !g.hidden_version) {
                continue;
            }
            let (name, addr, size, limit) = if ifunc {
                match ifunc::resolve(inv, m, f, read_u64) {
                    Ok(i) => (i.name, i.address, i.size, i.limit),
                    Err(why) => {
                        eprintln!("papirus-probe: refused {} at {:#x}: {why}", f.display_name(), f.address);
                        continue;
                    }
                }
            } else {
                // Entries other code jumps into past their first byte: only the file's code shows it.
                if let Patchability::NotPatchable { reason: r @ Reason::Entered { .. } } = m.patchability(f) {
                    eprintln!("papirus-probe: refused {} at {:#x}: {r}", f.display_name(), f.address);
                    continue;
                }
                (f.display_name().to_string(), f.address, f.size, limit(m, f))
            };
            specs.push(FunctionSpec {
                name: name.clone(),
                addr,
                size,
                hook: hooks.enter,
                arg: names.len() as u32,
                limit,
            });
            names.push(name);
        }
    }
    if specs.is_empty() {
        return Err(ProbeError::NothingSelected {
            modules: modules.iter().map(|m| m.basename()).collect::<Vec<_>>().join(", "),
            globs: if sel.functions.is_empty() { "*".into() } else { sel.functions.join(",") },
        });
    }
    // The unwinder and the C++ runtime, wherever they are loaded.
    for name in UNWIND_BEGIN.iter().copied().chain([CATCH_BEGIN]) {
        let hook = if name == CATCH_BEGIN { hooks.catch } else { hooks.unwind_begin };
        let found = inv.modules.iter().find_map(|m| m.function(name).filter(|f| f.size > 0).map(|f| (m, f)));
        if let Some((m, f)) = found {
            let limit = limit(m, f);
            specs.push(FunctionSpec {
                name: name.to_string(),
                addr: f.address,
                size: f.size,
                hook,
                arg: 0,
                limit,
            });
        }
    }
    Ok((names, specs))
}

/// Where the symbol after `f` starts in the process (0 when none).
fn limit(m: &Module, f: &Function) -> u64 {
    match patchable::next_symbol(m.elf(), f.link_address) {
        0 => 0,
        next => next.wrapping_add(m.load_bias),
    }
}
