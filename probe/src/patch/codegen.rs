//! Machine code papirus writes: entry trampolines and the jump to them.
//!
//! An entry trampoline, entered by the `jmp` that replaced the function's
//! first instructions, with the stack exactly as the caller left it:
//!
//! ```text
//! push rax; lahf; seto al; push rax                  ; status flags
//! push rcx rdx rsi rdi r8 r9 r10 r11                 ; what the code may rely on
//! mov edi, ARG; lea rsi, [rsp + 80]                    ; id, return-address slot
//! call [rip + hook]
//! pop …; pop rax; add al, 0x7f; sahf; pop rax
//! <displaced instructions, relocated>
//! jmp <first original instruction not displaced>
//! hook: dq HOOK
//! ```
//!
//! Callee-saved registers are the hook's to preserve (SysV ABI). Vector and
//! x87 registers are not saved: the runtime's hooks never touch them (checked
//! by disassembling them in papirus' tests). For the same reason the stack
//! is not realigned to 16 bytes and the direction flag not cleared (it is
//! clear at every function entry anyway): integer code needs neither, and
//! the runtime's one door to code that may use vector registers (a thread's
//! registration) realigns the stack itself. No red zone is skipped: at a
//! function's entry everything below the stack pointer belongs to the
//! callee, so neither the pushes nor the hook's frame can clobber live data
//! (this would not hold at a mid-function point).

use iced_x86::code_asm::*;
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Register};

use super::analyze::{EntryPlan, JMP_LEN, JMP8_LEN, Refusal};

/// Bytes from the trampoline's saved-register area to the return-address slot
/// (rax, the flags image and eight more registers).
const SAVED: i32 = 10 * 8;

/// Assembles the entry trampoline of `plan` for address `ip`, calling
/// `hook(arg, slot)` before the displaced instructions run.
pub fn entry_trampoline(plan: &EntryPlan, ip: u64, hook: u64, arg: u32) -> Result<Vec<u8>, Refusal> {
    build(plan, ip, hook, arg).map_err(Refusal::Relocation)
}

/// The fixed part of every trampoline (register saves, hook call, restores),
/// assembled once: trampolines differ only in the id, the distance to their
/// hook slot and their relocated instructions, so only those are encoded per
/// function (this keeps the target's stop short when thousands are patched).
struct Template {
    bytes: Vec<u8>,
    /// Offset of `mov edi, ARG`'s immediate.
    arg_at: usize,
    /// Offset of `call [rip + hook]`'s displacement.
    disp_at: usize,
    /// Offset just past that call (the base of the displacement).
    call_end: usize,
}

fn template() -> Result<&'static Template, String> {
    static T: std::sync::OnceLock<Result<Template, String>> = std::sync::OnceLock::new();
    T.get_or_init(assemble_template).as_ref().map_err(Clone::clone)
}

fn assemble_template() -> Result<Template, String> {
    let e = |e: IcedError| e.to_string();
    assemble_template_parts()
        .map_err(e)?
        .ok_or_else(|| "trampoline template without its id or hook call".into())
}

fn assemble_template_parts() -> Result<Option<Template>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut hook_ptr = a.create_label();
    let saved = [rcx, rdx, rsi, rdi, r8, r9, r10, r11];
    // Status flags without pushfq/popfq (popfq alone costs more than the rest
    // of the trampoline here): SF ZF AF PF CF via lahf/sahf, OF via seto.
    a.push(rax)?;
    a.lahf()?;
    a.seto(al)?;
    a.push(rax)?;
    for r in saved {
        a.push(r)?;
    }
    a.mov(edi, 0x7fff_ffff)?; // imm32 form whatever the id
    a.lea(rsi, qword_ptr(rsp + SAVED))?;
    a.call(qword_ptr(hook_ptr))?;
    for r in saved.into_iter().rev() {
        a.pop(r)?;
    }
    a.pop(rax)?;
    a.add(al, 0x7f)?; // OF = the saved seto bit
    a.sahf()?;
    a.pop(rax)?;
    a.set_label(&mut hook_ptr)?;
    a.dq(&[0])?;
    let mut bytes = a.assemble(0)?;
    bytes.truncate(bytes.len() - 8);
    let (mut arg_at, mut disp_at, mut call_end) = (None, None, None);
    let mut dec = Decoder::with_ip(64, &bytes, 0, DecoderOptions::NONE);
    while dec.can_decode() {
        let at = dec.position();
        let i = dec.decode();
        let offsets = dec.get_constant_offsets(&i);
        if i.code() == Code::Mov_r32_imm32 && i.op0_register() == Register::EDI {
            arg_at = Some(at + offsets.immediate_offset());
        } else if i.code() == Code::Call_rm64 && i.is_ip_rel_memory_operand() {
            disp_at = Some(at + offsets.displacement_offset());
            call_end = Some(at + i.len());
        }
    }
    Ok(match (arg_at, disp_at, call_end) {
        (Some(arg_at), Some(disp_at), Some(call_end)) => Some(Template { bytes, arg_at, disp_at, call_end }),
        _ => None,
    })
}

fn build(plan: &EntryPlan, ip: u64, hook: u64, arg: u32) -> Result<Vec<u8>, String> {
    let t = template()?;
    let block = relocated(plan, ip + t.bytes.len() as u64).map_err(|e| e.to_string())?;
    let mut out = t.bytes.clone();
    out[t.arg_at..t.arg_at + 4].copy_from_slice(&arg.to_le_bytes());
    out.extend_from_slice(&block);
    // The hook's address, 8-aligned, after the code.
    out.resize(out.len().next_multiple_of(8), 0xcc);
    let disp = i32::try_from(out.len() - t.call_end).map_err(|_| "trampoline too long".to_string())?;
    out[t.disp_at..t.disp_at + 4].copy_from_slice(&disp.to_le_bytes());
    out.extend_from_slice(&hook.to_le_bytes());
    Ok(out)
}

/// The displaced instructions relocated to `ip`, then the jump back (unless they end in a jump or return).
fn relocated(plan: &EntryPlan, ip: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    for (k, i) in plan.moved.iter().enumerate() {
        relocate(&mut a, plan, k, i)?;
    }
    let falls_through = plan.moved.last().is_none_or(|i| {
        !matches!(
            i.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        )
    });
    if falls_through {
        a.jmp(plan.resume())?;
    }
    a.assemble(ip)
}

/// Base of the stand-in addresses displaced instructions carry inside the
/// block encoder: non-canonical, so no data operand or branch of the program
/// can ever name one.
const COPY_IP: u64 = 0x8000_0000_0000_0000;

/// Adds displaced instruction `k` of `plan`.
///
/// iced's BlockEncoder maps every target equal to a block instruction's IP
/// onto that instruction's new position, data operands included: fed the
/// original IPs, `lea rax,[rip-7]` (a function taking its own address) would
/// point into the trampoline. So each displaced instruction carries a
/// stand-in IP ([`COPY_IP`] + k) that no operand names; RIP-relative data
/// operands keep their original absolute targets, and only branches from
/// the displaced code to a displaced instruction are pointed at the copy
/// (a loop back to the entry re-runs the copy without re-entering the hook).
///
/// A call (only ever the last displaced instruction of a prologue) becomes
/// "push the original return address; jmp": the callee returns into the
/// original code, whose unwind tables cover the return address, rather than
/// into the trampoline.
fn relocate(a: &mut CodeAssembler, plan: &EntryPlan, k: usize, i: &Instruction) -> Result<(), IcedError> {
    let mut j = *i;
    j.set_ip(COPY_IP + k as u64);
    // Only calls: iced counts `syscall` as a call too, and it stays as it is.
    if matches!(i.code(), Code::Call_rel32_64 | Code::Call_rm64) {
        let ret = i.next_ip();
        j.set_code(if i.code() == Code::Call_rel32_64 { Code::Jmp_rel32_64 } else { Code::Jmp_rm64 });
        a.lea(rsp, qword_ptr(rsp - 8))?;
        a.mov(dword_ptr(rsp), ret as u32)?;
        a.mov(dword_ptr(rsp + 4), (ret >> 32) as u32)?;
        a.add_instruction(j)?;
        return Ok(());
    }
    if matches!(i.flow_control(), FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch)
        && let Some(to) = plan.moved.iter().position(|m| m.ip() == i.near_branch_target())
    {
        j.set_near_branch64(COPY_IP + to as u64);
    }
    a.add_instruction(j)?;
    Ok(())
}

/// The bytes that replace the displaced instructions: `jmp rel32` to the
/// trampoline, then `int3` over the rest of the last displaced instruction;
/// under [`Tactic::Hop`](super::Tactic::Hop), the bytes of
/// [`EntryPlan::patched`]: `jmp rel8` at the entry, `jmp rel32` in the slot,
/// every other byte unchanged. `None` when the trampoline is out of a
/// rel32's reach.
pub fn entry_jump(plan: &EntryPlan, trampoline: u64) -> Option<Vec<u8>> {
    if let Some(slot) = plan.hop {
        let rel32 = i32::try_from(trampoline as i64 - (slot + JMP_LEN) as i64).ok()?;
        let rel8 = i8::try_from(slot as i64 - (plan.at + JMP8_LEN) as i64).ok()?;
        let mut out = plan.original.clone();
        let a = (plan.at - plan.start) as usize;
        out[a..a + 2].copy_from_slice(&[0xeb, rel8 as u8]);
        let s = (slot - plan.start) as usize;
        out[s] = 0xe9;
        out[s + 1..s + 5].copy_from_slice(&rel32.to_le_bytes());
        return Some(out);
    }
    let rel = i32::try_from(trampoline as i64 - (plan.at + JMP_LEN) as i64).ok()?;
    let mut out = vec![0xe9];
    out.extend_from_slice(&rel.to_le_bytes());
    out.resize(plan.moved_len as usize, 0xcc);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::analyze::plan;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn decode(bytes: &[u8], ip: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).into_iter().collect()
    }

    #[test]
    fn relocates_rip_relative_operands() {
        let f = 0x7000_0000_1000u64;
        // mov rax,[rip+0x100]; ret
        let p = plan(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0, 0xc3], 8, f).unwrap();
        let tip = f + 0x10_0000;
        let bytes = entry_trampoline(&p, tip, 0x1234_5678_9abc, 7).unwrap();
        let insns = decode(&bytes, tip);
        let load =
            insns.iter().find(|i| i.mnemonic() == Mnemonic::Mov && i.is_ip_rel_memory_operand()).unwrap();
        assert_eq!(load.ip_rel_memory_address(), f + 7 + 0x100);
        let back = insns.iter().find(|i| i.mnemonic() == Mnemonic::Jmp).unwrap();
        assert_eq!(back.near_branch_target(), f + 7, "back to the original code");
        assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Mov && i.immediate32() == 7), "id in edi");
        let hook = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap());
        assert_eq!(hook, 0x1234_5678_9abc);
        let jump = entry_jump(&p, tip).unwrap();
        assert_eq!(jump.len(), 7);
        assert_eq!(jump[0], 0xe9);
        assert!(jump[5..].iter().all(|&b| b == 0xcc));
        assert!(entry_jump(&p, f + (1 << 32)).is_none());
    }

    #[test]
    fn a_displaced_call_returns_to_the_original_code() {
        let f = 0x7000_0000_1000u64;
        // push rbx; call +0x40; ret
        let p = plan(&[0x53, 0xe8, 0x40, 0, 0, 0, 0xc3], 7, f).unwrap();
        let tip = f - 0x10_0000;
        let insns = decode(&entry_trampoline(&p, tip, 1, 0).unwrap(), tip);
        let jmps: Vec<_> = insns.iter().filter(|i| i.mnemonic() == Mnemonic::Jmp).collect();
        assert_eq!(jmps[0].near_branch_target(), f + 6 + 0x40, "the call became a jmp to its target");
        let pushed: Vec<_> = insns
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Mov && i.op0_kind() == iced_x86::OpKind::Memory)
            .collect();
        assert_eq!(pushed[0].immediate32(), (f + 6) as u32);
        assert_eq!(pushed[1].immediate32(), ((f + 6) >> 32) as u32);
        assert!(insns.iter().all(|i| i.mnemonic() != Mnemonic::Call || i.is_ip_rel_memory_operand()));
    }

    #[test]
    fn data_targets_inside_the_displaced_bytes_keep_their_address() {
        let f = 0x7000_0000_1000u64;
        let tip = f + 0x10_0000;
        // lea rax,[rip-7] (the function's own address); lea rcx,[rip+0]; ret
        let code = [0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff, 0x48, 0x8d, 0x0d, 0, 0, 0, 0, 0xc3];
        let p = plan(&code, code.len(), f).unwrap();
        assert_eq!(p.moved.len(), 1);
        let insns = decode(&entry_trampoline(&p, tip, 1, 0).unwrap(), tip);
        let leas: Vec<_> =
            insns.iter().filter(|i| i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand()).collect();
        assert_eq!(leas.len(), 1);
        assert_eq!(leas[0].ip_rel_memory_address(), f, "the function's own address");
        // Moved whole (a ret within 5 bytes): jne +1; ret; lea rax,[rip-10]; ret.
        let code = [0x75, 0x01, 0xc3, 0x48, 0x8d, 0x05, 0xf6, 0xff, 0xff, 0xff, 0xc3];
        let p = plan(&code, code.len(), f).unwrap();
        assert_eq!(p.tactic, crate::patch::Tactic::Whole);
        let insns = decode(&entry_trampoline(&p, tip, 1, 0).unwrap(), tip);
        let lea =
            insns.iter().find(|i| i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand()).unwrap();
        assert_eq!(lea.ip_rel_memory_address(), f);
        let jne = insns.iter().find(|i| i.mnemonic() == Mnemonic::Jne).unwrap();
        assert_eq!(jne.near_branch_target(), lea.ip(), "the inner branch lands in the copy");
        assert!(
            insns.iter().all(|i| i.mnemonic() != Mnemonic::Jmp),
            "a function moved whole never jumps back"
        );
    }

    #[test]
    fn a_loop_inside_a_whole_function_stays_in_the_copy() {
        let f = 0x7000_0000_1000u64;
        let tip = f + 0x10_0000;
        // dec edi; jne -4 (to +0); ret
        let code = [0xff, 0xcf, 0x75, 0xfc, 0xc3, 0x90, 0x90, 0x90];
        let p = plan(&code, 5, f).unwrap();
        let bytes = entry_trampoline(&p, tip, 1, 0).unwrap();
        let insns = decode(&bytes, tip);
        let dec = insns.iter().find(|i| i.mnemonic() == Mnemonic::Dec).unwrap();
        let jne = insns.iter().find(|i| i.mnemonic() == Mnemonic::Jne).unwrap();
        assert_eq!(jne.near_branch_target(), dec.ip(), "back to the copy, not to the hooked entry");
    }

    #[test]
    fn a_displaced_syscall_stays_a_syscall() {
        let f = 0x7000_0000_1000u64;
        // xor eax,eax; syscall; cmp rax,-4096; ret
        let code = [0x31, 0xc0, 0x0f, 0x05, 0x48, 0x3d, 0x00, 0xf0, 0xff, 0xff, 0xc3];
        let p = plan(&code, code.len(), f).unwrap();
        let tip = f + 0x10_0000;
        let insns = decode(&entry_trampoline(&p, tip, 1, 0).unwrap(), tip);
        assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Syscall));
        let back = insns.iter().find(|i| i.mnemonic() == Mnemonic::Jmp).unwrap();
        assert_eq!(back.near_branch_target(), f + 10);
    }
}
