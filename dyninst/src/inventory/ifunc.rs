//! IFUNC symbols (`STT_GNU_IFUNC`, e.g. glibc's `strlen`, `memcpy@@GLIBC_2.14`):
//! the symbol's value is a resolver the loader runs once; what the process
//! calls is the implementation it returned. That is the code to instrument.
//!
//! The loader's answer is read from the process's memory, never recomputed
//! and never by running code in it: the module's own `R_X86_64_IRELATIVE`
//! slot whose addend is the resolver (what the module's internal calls go
//! through), else an importer's GOT slot for the symbol once bound (always
//! with `BIND_NOW`). An implementation must lie in the IFUNC's own module's
//! text; anything else is refused with the reason. Sibling routines enter
//! one another a few bytes in (glibc's `__mempcpy_*` jumps to
//! `__memmove_*+3`): what the module scan finds around the implementation
//! goes to the patcher ([`crate::patch::note_around`]), which then takes a
//! 2-byte hop there ([`crate::patch::Tactic::Hop`]) or refuses.

use papirus_substrate::elf::ElfFile;

use super::{Function, Inventory, Module, patchable};

/// `R_X86_64_IRELATIVE`
const R_X86_64_IRELATIVE: u32 = 37;
/// Size of an `Elf64_Rela`.
const RELA_LEN: usize = 24;
/// Bound on an implementation's size when no symbol gives it (glibc's string
/// routines are a few KiB): how far its code is read and scanned.
const IMPL_MAX: u64 = 64 << 10;

/// The implementation an IFUNC resolved to in a live process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Implementation {
    /// Run-time address.
    pub address: u64,
    /// Its size: its own symbol's, else up to the next symbol (at most 64 KiB).
    pub size: u64,
    /// Where the next symbol starts (run time; 0 when none).
    pub limit: u64,
    /// `strlen -> __strlen_avx2` when a symbol names it, else `strlen -> libc.so.6+0x156200`.
    pub name: String,
}

/// The (addend, slot) link-time addresses of `elf`'s IRELATIVE relocations.
pub fn irelative_slots(elf: &ElfFile) -> Vec<(u64, u64)> {
    let data = elf.data();
    let mut out = Vec::new();
    for s in elf.sections().iter().filter(|s| s.name.starts_with(".rela") && s.entry_size == RELA_LEN as u64)
    {
        let start = s.file_offset as usize;
        let Some(bytes) = start.checked_add(s.size as usize).and_then(|end| data.get(start..end)) else {
            continue;
        };
        for r in bytes.chunks_exact(RELA_LEN) {
            let word = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            if word(1) as u32 == R_X86_64_IRELATIVE {
                out.push((word(2), word(0)));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Resolves IFUNC `f` of module `m` in the process whose memory `read_u64` reads.
pub fn resolve(
    inv: &Inventory,
    m: &Module,
    f: &Function,
    read_u64: &mut dyn FnMut(u64) -> Option<u64>,
) -> Result<Implementation, String> {
    let text = m.text.clone().ok_or("the module has no .text")?;
    let mut slots: Vec<u64> = irelative_slots(m.elf())
        .into_iter()
        .filter(|&(addend, _)| addend == f.link_address)
        .map(|(_, slot)| slot.wrapping_add(m.load_bias))
        .collect();
    // An importer's GOT slot: bound once it holds an address outside its PLT.
    slots.extend(inv.modules.iter().flat_map(|i| &i.plt).filter(|p| p.name == f.name).map(|p| p.got));
    let values: Vec<u64> = slots.into_iter().filter_map(&mut *read_u64).collect();
    let in_text = |a: &&u64| text.contains(*a) && **a != f.address;
    let address = match values.iter().find(in_text) {
        Some(&a) => a,
        None => {
            return Err(match values.iter().find(|&&a| a != 0) {
                Some(a) => format!(
                    "IFUNC {}: its slots hold {a:#x}, not code of {} (an unbound PLT entry, or the vDSO)",
                    f.name,
                    m.basename()
                ),
                None => format!("IFUNC {}: no IRELATIVE or GOT slot holds its implementation", f.name),
            });
        }
    };
    let link = address - m.load_bias;
    let named = m.functions.iter().find(|g| g.address == address && g.size > 0 && g.kind != f.kind);
    let next = patchable::next_symbol(m.elf(), link);
    let end = if next > link { next } else { text.end - m.load_bias };
    let size = named.map_or((end - link).min(IMPL_MAX), |g| g.size);
    let target =
        named.map_or_else(|| format!("{}+{link:#x}", m.basename()), |g| g.display_name().to_string());
    // Sibling routines jump into one another's first bytes (glibc's
    // mempcpy enters memmove 3 bytes in): such an entry is kept by a 2-byte
    // hop, else refused. Any branch counts, the implementation's own too:
    // its extent is not known.
    let tail = crate::patch::analyze::PADDING_MAX;
    let code = m.elf().bytes_at(link, size as usize + tail).or_else(|| m.elf().bytes_at(link, size as usize));
    if let Some(code) = code {
        let at = crate::patch::analyze::entry_point(code, size as usize, link);
        let around = patchable::around(m.elf(), link..link, at, size + tail as u64);
        if around.entry != 0 {
            let head = &code[..code.len().min(size as usize).min(patchable::HEAD_LEN)];
            crate::patch::note_around(address, head, patchable::shifted(&around, m.load_bias));
            let (near_at, near) = patchable::near(m.elf(), link, code);
            if let Err(crate::patch::Refusal::Entered { why, .. }) =
                crate::patch::decide_around(&f.name, near, near_at, size, link, next, &around)
            {
                let module = m.basename();
                let to = around.entry;
                let from = patchable::entered(&patchable::branches(m.elf()), link..link, at, to + 1)
                    .map_or(0, |e| e.0);
                return Err(format!(
                    "IFUNC {} resolves to {module}+{link:#x}, and the code at {module}+{from:#x} branches to \
                     {module}+{to:#x}, inside the bytes the jump would overwrite, and no 2-byte hop fits: {why}",
                    f.name
                ));
            }
        }
    }
    Ok(Implementation {
        address,
        size,
        limit: if next > link { next.wrapping_add(m.load_bias) } else { 0 },
        name: format!("{} -> {target}", f.display_name()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_libc_has_irelative_slots_for_its_ifuncs() {
        let Ok(elf) = ElfFile::open("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("no /lib/x86_64-linux-gnu/libc.so.6 here");
            return;
        };
        let slots = irelative_slots(&elf);
        let ifuncs: Vec<_> =
            elf.functions().filter(|s| s.kind == papirus_substrate::elf::SymbolKind::Ifunc).collect();
        assert!(!ifuncs.is_empty());
        let strlen = ifuncs.iter().find(|s| s.name == "strlen").expect("strlen is an IFUNC in glibc");
        assert!(slots.iter().any(|&(addend, _)| addend == strlen.address), "strlen's IRELATIVE slot");
    }
}
