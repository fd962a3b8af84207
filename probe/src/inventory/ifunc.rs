//! IFUNC symbols (`STT_GNU_IFUNC`, e.g. glibc's `strlen`, `memcpy@@GLIBC_2.14`):
//! the symbol's value is a resolver the loader runs once; what the process
//! calls is the implementation it returned. That is the code to instrument.
//!
//! The loader's answer is read from the process's memory, never by running
//! code in it: the module's own `R_X86_64_IRELATIVE` slot whose addend is
//! the resolver (what the module's internal calls go through), else an
//! importer's GOT slot for the symbol once bound (always with `BIND_NOW`).
//! An IFUNC nothing has bound yet (imported lazily, or by no one) gets the
//! answer its resolver would give: its instructions are followed without
//! running them, over the loader's CPU data in the process's memory
//! ([`evaluate_resolver`]); a resolver doing anything else is refused. An implementation must lie in the IFUNC's own module's
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

/// Every `Elf64_Rela` of `elf`'s `.rela*` sections as (offset, info, addend).
pub(super) fn relocations(elf: &ElfFile) -> impl Iterator<Item = [u64; 3]> + '_ {
    let data = elf.data();
    elf.sections()
        .iter()
        .filter(|s| s.name.starts_with(".rela") && s.entry_size == RELA_LEN as u64)
        .filter_map(move |s| {
            let start = s.file_offset as usize;
            start.checked_add(s.size as usize).and_then(|end| data.get(start..end))
        })
        .flat_map(|bytes| bytes.chunks_exact(RELA_LEN))
        .map(|r| {
            std::array::from_fn(|i| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap_or_default()))
        })
}

/// The (addend, slot) link-time addresses of `elf`'s IRELATIVE relocations.
pub fn irelative_slots(elf: &ElfFile) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = relocations(elf)
        .filter(|[_, info, _]| *info as u32 == R_X86_64_IRELATIVE)
        .map(|[offset, _, addend]| (addend, offset))
        .collect();
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
    // Not bound yet (imported lazily, or by no one): the resolver's choice,
    // read off the loader's CPU data the way the resolver reads it.
    let evaluated = || {
        let code = m.elf().bytes_at(f.link_address, f.size as usize)?;
        evaluate_resolver(code, f.address, read_u64).filter(|a| in_text(&a))
    };
    let address = match values.iter().find(in_text).copied().or_else(evaluated) {
        Some(a) => a,
        None => {
            return Err(match values.iter().find(|&&a| a != 0) {
                Some(a) => format!(
                    "IFUNC {}: its slots hold {a:#x}, not code of {} (an unbound PLT entry, or the vDSO), \
                     and its resolver does more than papirus evaluates without running it",
                    f.name,
                    m.basename()
                ),
                None => format!(
                    "IFUNC {}: no IRELATIVE or GOT slot holds its implementation, and its resolver does \
                     more than papirus evaluates without running it",
                    f.name
                ),
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

/// Most instructions [`evaluate_resolver`] follows.
const RESOLVER_STEPS: usize = 256;

/// The address the IFUNC resolver whose code is `code` (loaded at `ip`)
/// returns, found without running it: its instructions are followed one by
/// one, memory read through `read_u64` (the loader's CPU data, which it
/// fills before any IRELATIVE resolver runs). Only what glibc's resolvers
/// do is understood: loads, `lea`, `test`, `and`, `cmp`, conditional moves
/// and branches, `ret`. Anything else (a call, a store, an unknown
/// instruction or operand) gives `None`: no guess.
pub fn evaluate_resolver(code: &[u8], ip: u64, read_u64: &mut dyn FnMut(u64) -> Option<u64>) -> Option<u64> {
    use iced_x86::{ConditionCode, Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind, Register};
    let mut regs = [0u64; 16];
    // ZF, SF, CF, OF
    let mut flags: Option<(bool, bool, bool, bool)> = None;
    let index = |r: Register| {
        let full = r.full_register();
        (full.number() >= Register::RAX.number() && full.number() <= Register::R15.number())
            .then(|| full.number() - Register::RAX.number())
    };
    let high = |r: Register| matches!(r, Register::AH | Register::CH | Register::DH | Register::BH);
    let get = |regs: &[u64; 16], r: Register| -> Option<u64> {
        let v = regs[index(r)?];
        Some(match r.size() {
            1 if high(r) => (v >> 8) & 0xff,
            1 => v & 0xff,
            2 => v & 0xffff,
            4 => v & 0xffff_ffff,
            8 => v,
            _ => return None,
        })
    };
    let set = |regs: &mut [u64; 16], r: Register, x: u64| -> Option<()> {
        let i = index(r)?;
        let v = regs[i];
        regs[i] = match r.size() {
            1 if high(r) => (v & !0xff00) | ((x & 0xff) << 8),
            1 => (v & !0xff) | (x & 0xff),
            2 => (v & !0xffff) | (x & 0xffff),
            4 => x & 0xffff_ffff,
            8 => x,
            _ => return None,
        };
        Some(())
    };
    let mut dec = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    for _ in 0..RESOLVER_STEPS {
        if !dec.can_decode() {
            return None;
        }
        let i = dec.decode();
        if i.is_invalid() {
            return None;
        }
        let bits = match i.op0_kind() {
            OpKind::Memory => i.memory_size().size() as u32 * 8,
            _ => i.op0_register().size() as u32 * 8,
        };
        if bits > 64 {
            return None;
        }
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        // The second operand's value: a register, an immediate or a load.
        // Operand `k`'s value: a register, an immediate or a load.
        let mut operand = |regs: &[u64; 16], k: u32| -> Option<u64> {
            match i.op_kind(k) {
                OpKind::Register => get(regs, i.op_register(k)),
                OpKind::Immediate8
                | OpKind::Immediate32
                | OpKind::Immediate8to32
                | OpKind::Immediate8to64
                | OpKind::Immediate32to64
                | OpKind::Immediate16 => Some(i.immediate(1) & mask),
                OpKind::Memory => {
                    if i.memory_index() != Register::None || i.segment_prefix() != Register::None {
                        return None;
                    }
                    let addr = if i.is_ip_rel_memory_operand() {
                        i.ip_rel_memory_address()
                    } else {
                        get(regs, i.memory_base())?.wrapping_add(i.memory_displacement64())
                    };
                    Some(read_u64(addr)? & mask)
                }
                _ => None,
            }
        };
        // No stores: what is written would have to be read back.
        let reads_only =
            matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Endbr64 | Mnemonic::Test | Mnemonic::Cmp);
        if !reads_only
            && i.op_count() >= 1
            && i.op0_kind() != OpKind::Register
            && i.flow_control() == FlowControl::Next
        {
            return None;
        }
        match i.mnemonic() {
            Mnemonic::Endbr64 | Mnemonic::Nop => {}
            Mnemonic::Ret => return Some(regs[0]),
            Mnemonic::Mov if i.op_count() == 2 => {
                let v = operand(&regs, 1)?;
                set(&mut regs, i.op0_register(), v)?;
            }
            Mnemonic::Lea if i.is_ip_rel_memory_operand() => {
                set(&mut regs, i.op0_register(), i.ip_rel_memory_address())?;
            }
            Mnemonic::Test | Mnemonic::And | Mnemonic::Cmp if i.op_count() == 2 => {
                let a = operand(&regs, 0)?;
                let b = operand(&regs, 1)?;
                let sign = 1u64 << (bits - 1);
                let r = if i.mnemonic() == Mnemonic::Cmp { a.wrapping_sub(b) & mask } else { a & b };
                let (cf, of) = if i.mnemonic() == Mnemonic::Cmp {
                    (a < b, ((a ^ b) & (a ^ r) & sign) != 0)
                } else {
                    (false, false)
                };
                flags = Some((r == 0, r & sign != 0, cf, of));
                if i.mnemonic() == Mnemonic::And {
                    set(&mut regs, i.op0_register(), r)?;
                }
            }
            _ => {
                let cc = i.condition_code();
                let taken = match (cc, flags) {
                    (ConditionCode::None, _) => true,
                    (_, None) => return None,
                    (ConditionCode::e, Some(f)) => f.0,
                    (ConditionCode::ne, Some(f)) => !f.0,
                    (ConditionCode::s, Some(f)) => f.1,
                    (ConditionCode::ns, Some(f)) => !f.1,
                    (ConditionCode::b, Some(f)) => f.2,
                    (ConditionCode::ae, Some(f)) => !f.2,
                    (ConditionCode::be, Some(f)) => f.2 || f.0,
                    (ConditionCode::a, Some(f)) => !f.2 && !f.0,
                    (ConditionCode::l, Some(f)) => f.1 != f.3,
                    (ConditionCode::ge, Some(f)) => f.1 == f.3,
                    (ConditionCode::le, Some(f)) => f.0 || f.1 != f.3,
                    (ConditionCode::g, Some(f)) => !f.0 && f.1 == f.3,
                    _ => return None,
                };
                match i.mnemonic() {
                    Mnemonic::Jmp
                    | Mnemonic::Je
                    | Mnemonic::Jne
                    | Mnemonic::Js
                    | Mnemonic::Jns
                    | Mnemonic::Jb
                    | Mnemonic::Jae
                    | Mnemonic::Jbe
                    | Mnemonic::Ja
                    | Mnemonic::Jl
                    | Mnemonic::Jge
                    | Mnemonic::Jle
                    | Mnemonic::Jg => {
                        if i.op0_kind() != OpKind::NearBranch64 {
                            return None;
                        }
                        if taken {
                            let to = i.near_branch_target();
                            let off = to.checked_sub(ip).filter(|&o| o < code.len() as u64)?;
                            dec.set_ip(to);
                            dec.set_position(off as usize).ok()?;
                        }
                    }
                    Mnemonic::Cmove
                    | Mnemonic::Cmovne
                    | Mnemonic::Cmovs
                    | Mnemonic::Cmovns
                    | Mnemonic::Cmovb
                    | Mnemonic::Cmovae
                    | Mnemonic::Cmovbe
                    | Mnemonic::Cmova
                    | Mnemonic::Cmovl
                    | Mnemonic::Cmovge
                    | Mnemonic::Cmovle
                    | Mnemonic::Cmovg => {
                        let v = operand(&regs, 1)?;
                        let r = i.op0_register();
                        // A 32-bit cmov zero-extends even when it does not move.
                        let keep = get(&regs, r)?;
                        set(&mut regs, r, if taken { v } else { keep })?;
                    }
                    _ => return None,
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolver_is_followed_without_running_it() {
        #[rustfmt::skip]
        let code = [
            0x48, 0x8b, 0x05, 0xf9, 0x7f, 0, 0, // mov rax,[rip+0x7ff9]: the loader's data at 0x20000
            0x8b, 0x90, 0xa4, 0x01, 0, 0,       // mov edx,[rax+0x1a4]
            0xf6, 0xc6, 0x10,                   // test dh,0x10
            0x75, 0x08,                         // jne 0x101a
            0x48, 0x8d, 0x05, 0, 0x01, 0, 0,    // lea rax,[rip+0x100] (0x1119)
            0xc3,
            0x48, 0x8d, 0x05, 0, 0x02, 0, 0,    // lea rax,[rip+0x200] (0x1221)
            0xc3,
        ];
        // The loader's data pointer at 0x9000, and `tested` (with `noise`
        // around the bits tested) at `at`: each value leads to its choice.
        let follows = |code: &[u8], at: u64, noise: u64, cases: [(u64, u64); 2]| {
            for (tested, chosen) in cases {
                let mut mem = |a: u64| match a {
                    0x9000 => Some(0x20000),
                    _ if a == at => Some(tested | noise),
                    _ => None,
                };
                assert_eq!(evaluate_resolver(code, 0x1000, &mut mem), Some(chosen), "{tested:#x}");
            }
        };
        follows(&code, 0x201a4, 0xdead_0000_0000, [(0x1000, 0x1221), (0xefff, 0x1119)]);
        // A test of memory: test byte [rax+0xdc],0x20; je
        #[rustfmt::skip]
        let code2 = [
            0x48, 0x8b, 0x05, 0xf9, 0x7f, 0, 0,
            0xf6, 0x80, 0xdc, 0, 0, 0, 0x20,
            0x74, 0x08,
            0x48, 0x8d, 0x05, 0, 0x01, 0, 0, 0xc3,
            0x48, 0x8d, 0x05, 0, 0x02, 0, 0, 0xc3,
        ];
        follows(&code2, 0x200dc, 0xff00, [(0x20, 0x1117), (0xdf, 0x121f)]);
        // What it does not follow gives no answer: a call, an unreadable load, xor, a store.
        assert_eq!(evaluate_resolver(&[0x89, 0x07, 0xc3], 0x1000, &mut |_| Some(0)), None);
        let mut none = |_| None;
        assert_eq!(evaluate_resolver(&[0xe8, 0, 0, 0, 0, 0xc3], 0x1000, &mut none), None);
        assert_eq!(evaluate_resolver(&code, 0x1000, &mut none), None);
        assert_eq!(evaluate_resolver(&[0x31, 0xc0, 0xc3], 0x1000, &mut none), None);
    }

    /// The loader's own choices in this test process (libc's IRELATIVE
    /// slots, filled by running the resolvers) are what following each
    /// resolver without running it gives.
    #[test]
    fn following_libc_resolvers_gives_what_the_loader_chose_here() {
        use std::os::unix::fs::FileExt;
        let maps = papirus_substrate::maps::read(std::process::id() as i32).unwrap();
        let Some(m) = maps.iter().find(|m| m.offset == 0 && m.name.ends_with("/libc.so.6")) else {
            papirus_testkit::skip("no libc.so.6 mapped in this test process");
            return;
        };
        let elf = ElfFile::open(&m.name).unwrap();
        let bias = m.start; // libc's first PT_LOAD is at link-time address 0
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut read = |a: u64| {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b, a).ok().map(|()| u64::from_le_bytes(b))
        };
        let slots = irelative_slots(&elf);
        let mut checked = 0;
        for f in elf.functions().filter(|s| s.kind == papirus_substrate::elf::SymbolKind::Ifunc) {
            let Some(&(_, slot)) = slots.iter().find(|&&(addend, _)| addend == f.address) else { continue };
            let loader = read(slot + bias).unwrap();
            let code = elf.bytes_at(f.address, f.size as usize).unwrap();
            match evaluate_resolver(code, f.address + bias, &mut read) {
                Some(a) => {
                    assert_eq!(a, loader, "{}: followed {a:#x}, the loader chose {loader:#x}", f.name);
                    checked += 1;
                }
                None => eprintln!("{}: not followed", f.name),
            }
        }
        eprintln!("{checked} resolvers followed, each to what the loader chose");
        assert!(checked >= 20, "{checked} resolvers followed");
    }

    #[test]
    fn this_libc_has_irelative_slots_for_its_ifuncs() {
        let Some(elf) = crate::inventory::tests::system_libc() else { return };
        let slots = irelative_slots(&elf);
        let ifuncs: Vec<_> =
            elf.functions().filter(|s| s.kind == papirus_substrate::elf::SymbolKind::Ifunc).collect();
        assert!(!ifuncs.is_empty());
        let strlen = ifuncs.iter().find(|s| s.name == "strlen").expect("strlen is an IFUNC in glibc");
        assert!(slots.iter().any(|&(addend, _)| addend == strlen.address), "strlen's IRELATIVE slot");
    }
}
