//! Where in a function an entry uprobe is cheap.
//!
//! x86-64 uprobes emulate a few instructions in the kernel (push, jumps,
//! calls, conditional branches) and single-step every other one out of line,
//! which costs a second trap. Measured on this project's CI VM (KVM, kernel
//! 6.18): ~0.7 us per hit on a `push`, ~11 us on anything single-stepped
//! (BENCHMARKS.md). glibc's file functions start with a single-thread check
//! (`cmpb $0, __libc_single_threaded(%rip); je ...`): probing the branch
//! right after it instead of the first instruction gives the same argument
//! registers and the same return address at `%rsp`, so entry and return
//! probes both still work, at a fifteenth of the cost.
//!
//! Only a short whitelist of leading instructions is skipped: ones that
//! write no memory, no stack or frame pointer and no argument register.
//! Anything else keeps the probe at the entry (correct, just slower).

/// How many bytes of leading instructions to skip so that the probe lands on
/// an instruction the kernel emulates; 0 when the entry is already one, or
/// when the prologue is not one we understand.
pub fn cheap_entry_offset(code: &[u8]) -> usize {
    let mut at = 0;
    // A handful of harmless instructions at most.
    for _ in 0..4 {
        let rest = code.get(at..).unwrap_or_default();
        if emulated(rest) {
            return at;
        }
        match harmless_len(rest) {
            Some(n) => at += n,
            None => return 0,
        }
    }
    0
}

/// Instructions the x86 uprobe code emulates without single-stepping:
/// push of a register, jmp/jcc rel8/rel32, call rel32.
fn emulated(code: &[u8]) -> bool {
    matches!(
        code,
        [0x50..=0x57, ..]
            | [0x41, 0x50..=0x57, ..]
            | [0x70..=0x7f, _, ..]
            | [0xeb, _, ..]
            | [0xe8 | 0xe9, _, _, _, _, ..]
            | [0x0f, 0x80..=0x8f, _, _, _, _, ..]
    )
}

/// Length of an instruction that only sets flags or a scratch register.
fn harmless_len(code: &[u8]) -> Option<usize> {
    match code {
        // cmpb $imm8, disp32(%rip)
        [0x80, 0x3d, _, _, _, _, _, ..] => Some(7),
        // cmpl $imm8, disp32(%rip)
        [0x83, 0x3d, _, _, _, _, _, ..] => Some(7),
        // mov %rcx, %r10 (the syscall convention's 4th argument)
        [0x49, 0x89, 0xca, ..] => Some(3),
        // test $imm8, %sil / %dil
        [0x40, 0xf6, 0xc6 | 0xc7, _, ..] => Some(4),
        // test $imm8, %dl / %cl / %al
        [0xf6, 0xc0..=0xc2, _, ..] => Some(3),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_glibc_single_thread_check() {
        // read: cmpb $0x0,0xe3331(%rip); je +0x17
        let read = [
            0x80, 0x3d, 0x31, 0x33, 0x0e, 0x00, 0x00, 0x74, 0x17, 0x31, 0xc0,
        ];
        assert_eq!(cheap_entry_offset(&read), 7);
        // pread64: cmpb ...; mov %rcx,%r10; je +0x14
        let pread = [
            0x80, 0x3d, 0x11, 0x52, 0x0e, 0x00, 0x00, 0x49, 0x89, 0xca, 0x74, 0x14,
        ];
        assert_eq!(cheap_entry_offset(&pread), 10);
        // __open_2: test $0x40,%sil; jne +0x15
        assert_eq!(cheap_entry_offset(&[0x40, 0xf6, 0xc6, 0x40, 0x75, 0x15]), 4);
    }

    #[test]
    fn keeps_entry_when_already_cheap_or_unknown() {
        // push %rbp
        assert_eq!(cheap_entry_offset(&[0x55, 0x48, 0x89, 0xe5]), 0);
        // push %r15
        assert_eq!(cheap_entry_offset(&[0x41, 0x57]), 0);
        // sub $0x78,%rsp: changes the stack, stays at the entry
        assert_eq!(cheap_entry_offset(&[0x48, 0x83, 0xec, 0x78, 0x74, 0x00]), 0);
        // a harmless instruction followed by an unknown one
        assert_eq!(cheap_entry_offset(&[0xf6, 0xc2, 0x40, 0x89, 0xd0]), 0);
        // truncated code
        assert_eq!(cheap_entry_offset(&[0x80, 0x3d, 0x00]), 0);
        assert_eq!(cheap_entry_offset(&[]), 0);
    }
}
