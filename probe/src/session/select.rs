//! Which functions of a process to instrument: modules and globs to function specs.

use std::collections::{HashMap, HashSet};

use super::{ProbeError, TargetHooks};
use papirus_substrate::elf::SymbolKind;

use crate::inventory::{Function, Globs, Inventory, Module, Patchability, Reason, ifunc, patchable};
use crate::patch::{CATCH_BEGIN, FunctionSpec, Refusal, Refused, UNWIND_BEGIN};

/// Names that are never entry points reached by a call.
const NOT_CALLED: [&str; 3] = ["_start", "_dl_start", "_dl_start_user"];

/// The `--module` name of the main program (the executable itself).
pub const MAIN_MODULE: &str = "main";

/// Which functions to instrument.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Modules whose basename equals, or whose path contains, one of these
    /// ([`MAIN_MODULE`] names the main program); the main program alone when empty.
    pub modules: Vec<String>,
    /// Function globs (stored or demangled names); every function when empty.
    pub functions: Vec<String>,
    /// Function globs left out, even when `functions` matches them.
    pub exclude: Vec<String>,
}

impl Selection {
    fn wants_module(&self, m: &Module) -> bool {
        if self.modules.is_empty() {
            return m.is_main;
        }
        self.modules.iter().any(|p| if p == MAIN_MODULE { m.is_main } else { m.matches(p) })
    }
}

/// A [`Selection`]'s function globs, compiled.
struct FunctionGlobs {
    functions: Globs,
    exclude: Globs,
}

impl FunctionGlobs {
    fn new(sel: &Selection) -> Result<FunctionGlobs, crate::Error> {
        Ok(FunctionGlobs { functions: Globs::new(&sel.functions)?, exclude: Globs::new(&sel.exclude)? })
    }

    fn wants(&self, f: &Function) -> bool {
        let hit = |g: &Globs| g.is_match_either(&f.name, f.demangled.as_deref());
        (self.functions.is_empty() || hit(&self.functions)) && !hit(&self.exclude)
    }
}

/// Whether `name` is one of the unwinder entry points the runtime hooks itself.
pub(crate) fn is_internal_hook(name: &str) -> bool {
    name == CATCH_BEGIN || UNWIND_BEGIN.contains(&name)
}

/// Of two names of one address, the one a user would call: no leading
/// underscore, then the shorter.
fn preferred<'a>(a: &'a Function, b: &'a Function) -> &'a Function {
    let key = |f: &Function| (f.name.starts_with('_'), f.name.len());
    if key(b) < key(a) { b } else { a }
}

/// What [`select`] chose.
pub(super) struct Chosen {
    /// Names for the session, ids in order.
    pub names: Vec<String>,
    /// The patcher's specs, the unwinder's entry points last.
    pub specs: Vec<FunctionSpec>,
    /// Functions left out before patching, with why.
    pub left_out: Vec<Refused>,
}

/// The chosen functions plus the unwinder's entry points, and the ones left
/// out before patching. An IFUNC stands for the implementation it resolved
/// to, read from the target's memory with `read_u64`.
pub(super) fn select(
    inv: &Inventory,
    sel: &Selection,
    hooks: &TargetHooks,
    entry: Option<u64>,
    read_u64: &mut dyn FnMut(u64) -> Option<u64>,
) -> Result<Chosen, ProbeError> {
    let runtime = |m: &&Module| m.basename().starts_with("libpapirus_probe_runtime");
    let modules: Vec<&Module> = inv.modules.iter().filter(|m| !runtime(m) && sel.wants_module(m)).collect();
    if let Some(p) = sel.modules.iter().find(|p| *p != MAIN_MODULE && !modules.iter().any(|m| m.matches(p))) {
        return Err(ProbeError::NoModule { pattern: p.clone(), modules: module_names(inv) });
    }
    let globs = FunctionGlobs::new(sel)?;
    let mut names = Vec::new();
    let mut specs = Vec::new();
    let mut refused = Vec::new();
    let mut leave_out = |f: &Function, why: String| {
        refused.push(Refused {
            name: f.display_name().to_string(),
            addr: f.address,
            reason: Refusal::NotSelected(why),
        })
    };
    // Entry addresses chosen so far: IFUNCs can resolve to one implementation
    // (memmove and memcpy), or to a function chosen by its own name.
    let mut chosen = HashSet::new();
    for m in &modules {
        // Aliases share an address: patch it once, under the name a user would call.
        let mut by_addr: HashMap<u64, &Function> = HashMap::new();
        let mut order = Vec::new();
        for f in &m.functions {
            let called = !NOT_CALLED.contains(&f.name.as_str())
                && !is_internal_hook(&f.name)
                && entry.is_none_or(|e| !(f.address..f.address + f.size).contains(&e));
            let ifunc = f.kind == SymbolKind::Ifunc;
            if !called || f.size == 0 || !(ifunc || f.kind == SymbolKind::Function) || !globs.wants(f) {
                continue;
            }
            // A compat version (`memcpy@GLIBC_2.2.5`) beside the default one is not what callers bind to.
            if f.hidden_version && m.functions.iter().any(|g| g.name == f.name && !g.hidden_version) {
                continue;
            }
            by_addr.entry(f.address).and_modify(|kept| *kept = preferred(kept, f)).or_insert_with(|| {
                order.push(f.address);
                f
            });
        }
        for addr in order {
            let f = by_addr[&addr];
            let (name, addr, size, limit) = if f.kind == SymbolKind::Ifunc {
                match ifunc::resolve(inv, m, f, read_u64) {
                    Ok(i) => (i.name, i.address, i.size, i.limit),
                    Err(why) => {
                        leave_out(f, why.to_string());
                        continue;
                    }
                }
            } else {
                // Entries other code jumps into past their first byte: only the file's code shows it.
                if let Patchability::NotPatchable { reason: r @ Reason::Entered { .. } } = m.patchability(f) {
                    leave_out(f, r.to_string());
                    continue;
                }
                (f.display_name().to_string(), f.address, f.size, limit(m, f))
            };
            if !chosen.insert(addr) {
                continue;
            }
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
        let mut globs = if sel.functions.is_empty() { "*".to_string() } else { sel.functions.join(",") };
        if !sel.exclude.is_empty() {
            globs.push_str(&format!(" (excluding {})", sel.exclude.join(",")));
        }
        return Err(ProbeError::NothingSelected {
            modules: modules.iter().map(|m| m.basename()).collect::<Vec<_>>().join(", "),
            globs,
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
    Ok(Chosen { names, specs, left_out: refused })
}

/// Puts the functions matching one of `globs` (all when empty) first,
/// keeping their order, and renumbers the specs to match; returns how many
/// match (the runtime traces ids below that). The unwinder hooks keep their
/// argument.
pub(super) fn trace_first(names: &mut Vec<String>, specs: &mut [FunctionSpec], globs: &Globs) -> u64 {
    let traced = |n: &str| globs.is_empty() || globs.is_match(n);
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&i| !traced(&names[i]));
    let mut new_id = vec![0u32; names.len()];
    for (new, &old) in order.iter().enumerate() {
        new_id[old] = new as u32;
    }
    for s in specs.iter_mut().filter(|s| !is_internal_hook(&s.name)) {
        s.arg = new_id[s.arg as usize];
    }
    let count = names.iter().filter(|n| traced(n)).count() as u64;
    *names = order.into_iter().map(|i| std::mem::take(&mut names[i])).collect();
    count
}

/// The basenames of a process's modules, the main program marked, for error messages.
fn module_names(inv: &Inventory) -> String {
    inv.modules
        .iter()
        .map(|m| if m.is_main { format!("{} (`{MAIN_MODULE}`)", m.basename()) } else { m.basename() })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the symbol after `f` starts in the process (0 when none).
fn limit(m: &Module, f: &Function) -> u64 {
    match patchable::next_symbol(m.elf(), f.link_address) {
        0 => 0,
        next => next.wrapping_add(m.load_bias),
    }
}
