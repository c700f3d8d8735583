//! Object layouts of the target's TensorFlow build, derived at attach time
//! from its own machine code, never hard-coded for one wheel:
//!
//! * `model::Node::ToProto` copies every counter of a Node into a protobuf
//!   in source order (id, name, autotune, buffered_bytes, buffered_elements,
//!   bytes_consumed, bytes_produced, num_elements, processing_time, ...),
//!   then walks `inputs_`. That gives all Node offsets in one function.
//! * `DatasetBaseIterator::RecordElement` (`lock inc` num_elements through
//!   `node_`, `lock add` bytes produced, then the parent through `output_`)
//!   and `Node::record_stop` (`lock add` processing time) cross-check them:
//!   if the two sources disagree the build is not understood and we refuse
//!   (falling back to uprobes) rather than report wrong numbers.
//! * `DatasetBaseIterator::prefix()` is `lea X(%rdi)`: the prefix string.
//! * Parallel ops' `Iterator::CreateNode` copies the iterator's
//!   `shared_ptr<SharedState>` parallelism into the model parameter: the
//!   first shared_ptr member copied there is the knob.

use std::collections::{BTreeMap, HashMap, HashSet};

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LayoutError {
    #[error("{func}: {what} not found in its machine code (unsupported TensorFlow build)")]
    NotFound {
        func: &'static str,
        what: &'static str,
    },
    #[error("{what}: {a} says {x:#x}, {b} says {y:#x} (unsupported TensorFlow build)")]
    Disagree {
        what: &'static str,
        a: &'static str,
        x: u32,
        b: &'static str,
        y: u32,
    },
}

/// Offsets into `model::Node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NodeLayout {
    pub id: u32,
    pub name: u32,
    pub buffered_bytes: u32,
    pub buffered_elements: u32,
    pub bytes_consumed: u32,
    pub bytes_produced: u32,
    pub num_elements: u32,
    pub processing_time: u32,
    pub inputs: u32,
    pub output: u32,
}

/// Offsets into `DatasetBaseIterator` and parallel ops' iterators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IteratorLayout {
    /// `std::shared_ptr<model::Node> node_`.
    pub node: u32,
    /// `std::string prefix_`.
    pub prefix: u32,
    /// Model node name (e.g. `ParallelMapV2`) -> offset of the iterator's
    /// `shared_ptr<SharedState>` holding its parallelism.
    pub parallelism: BTreeMap<String, u32>,
    /// Model node name (`Prefetch`) -> offset of the iterator's
    /// `shared_ptr<SharedState>` holding its buffer size.
    #[serde(default)]
    pub buffer_size: BTreeMap<String, u32>,
}

/// Where a known-ratio model node keeps its ratio, per node class: the
/// class is told by the object's vtable (ELF vaddr of the `_ZTV` symbol in
/// the framework library).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RatioLayout {
    /// (vtable vaddr, offset of the `double` ratio) for `KnownRatio` and
    /// `AsyncKnownRatio`.
    pub classes: Vec<(u64, u32)>,
}

/// Registers (and rbp stack slots) holding a copy of one pointer.
struct Aliases {
    regs: HashSet<Register>,
    slots: HashSet<i64>,
}

const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

impl Aliases {
    fn of(reg: Register) -> Self {
        Aliases {
            regs: HashSet::from([reg]),
            slots: HashSet::new(),
        }
    }

    fn has(&self, r: Register) -> bool {
        r != Register::None && self.regs.contains(&r.full_register())
    }

    /// Memory operand `[alias + disp]` (no index): its displacement.
    fn mem_disp(&self, ins: &Instruction) -> Option<u32> {
        if ins.memory_index() == Register::None && self.has(ins.memory_base()) {
            u32::try_from(ins.memory_displacement64()).ok()
        } else {
            None
        }
    }

    fn step(&mut self, ins: &Instruction) {
        if ins.mnemonic() == Mnemonic::Call {
            for r in CALLER_SAVED {
                self.regs.remove(&r);
            }
            return;
        }
        if ins.op_count() == 0 || ins.op_kind(0) != OpKind::Register {
            // A spill: mov [rbp+d], reg.
            if ins.mnemonic() == Mnemonic::Mov
                && ins.op_count() == 2
                && ins.op_kind(0) == OpKind::Memory
                && ins.memory_base() == Register::RBP
                && ins.op_kind(1) == OpKind::Register
            {
                let d = ins.memory_displacement64() as i64;
                if self.has(ins.op_register(1)) {
                    self.slots.insert(d);
                } else {
                    self.slots.remove(&d);
                }
            }
            return;
        }
        let dst = ins.op_register(0).full_register();
        let keeps = match ins.mnemonic() {
            Mnemonic::Mov if ins.op_kind(1) == OpKind::Register => self.has(ins.op_register(1)),
            Mnemonic::Mov
                if ins.op_kind(1) == OpKind::Memory && ins.memory_base() == Register::RBP =>
            {
                self.slots.contains(&(ins.memory_displacement64() as i64))
            }
            // Compares and tests do not write their first operand.
            Mnemonic::Cmp | Mnemonic::Test => self.has(dst),
            _ => false,
        };
        if keeps {
            self.regs.insert(dst);
        } else {
            self.regs.remove(&dst);
        }
    }
}

fn decode(code: &[u8], ip: u64) -> Vec<Instruction> {
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    for ins in &mut d {
        if ins.is_invalid() {
            break;
        }
        out.push(ins);
    }
    out
}

fn is_load(ins: &Instruction) -> bool {
    ins.op_count() == 2 && ins.op_kind(0) == OpKind::Register && ins.op_kind(1) == OpKind::Memory
}

fn is_qword_reg(r: Register) -> bool {
    r.is_gpr64()
}

/// Node offsets from `model::Node::ToProto(ModelProto_Node*) const`, which
/// returns absl::Status through a hidden pointer: `this` is in rsi.
pub fn node_from_to_proto(code: &[u8], ip: u64) -> Result<NodeLayout, LayoutError> {
    const F: &str = "Node::ToProto";
    let mut a = Aliases::of(Register::RSI);
    // Loads from `this` in order: (mnemonic, is 64-bit load, disp).
    let mut loads: Vec<(Mnemonic, bool, u32)> = Vec::new();
    let mut inputs = None;
    for ins in decode(code, ip) {
        if ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        if is_load(&ins) {
            if let Some(d) = a.mem_disp(&ins) {
                loads.push((ins.mnemonic(), is_qword_reg(ins.op_register(0)), d));
            }
        }
        // `add this_copy, imm`: the address of `inputs_` (std::list head)
        // for the end-of-list test of the inputs loop.
        if inputs.is_none()
            && ins.mnemonic() == Mnemonic::Add
            && ins.op_kind(0) == OpKind::Register
            && a.has(ins.op_register(0))
            && matches!(
                ins.op_kind(1),
                OpKind::Immediate8to64 | OpKind::Immediate32to64
            )
        {
            inputs = u32::try_from(ins.immediate(1)).ok();
        }
        a.step(&ins);
    }
    let nf = |what| LayoutError::NotFound { func: F, what };
    // The first lea is the mutex (lock_shared); then set_id (mov), set_name
    // (lea of the std::string), then the counters in source order.
    let mut it = loads.iter().skip_while(|l| l.0 != Mnemonic::Lea).skip(1);
    let id = it
        .by_ref()
        .find(|l| l.0 == Mnemonic::Mov && l.1)
        .ok_or_else(|| nf("id"))?
        .2;
    let name = it
        .by_ref()
        .find(|l| l.0 == Mnemonic::Lea)
        .ok_or_else(|| nf("name"))?
        .2;
    let counters: Vec<u32> = it
        .filter(|l| l.0 == Mnemonic::Mov && l.1)
        .map(|l| l.2)
        .take(6)
        .collect();
    if counters.len() < 6 {
        return Err(nf("counters"));
    }
    Ok(NodeLayout {
        id,
        name,
        buffered_bytes: counters[0],
        buffered_elements: counters[1],
        bytes_consumed: counters[2],
        bytes_produced: counters[3],
        num_elements: counters[4],
        processing_time: counters[5],
        inputs: inputs.ok_or_else(|| nf("inputs_"))?,
        output: 0,
    })
}

/// What `DatasetBaseIterator::RecordElement(ctx, out)` (this in rdi) shows.
#[derive(Debug, PartialEq, Eq)]
pub struct RecordElement {
    pub node: u32,
    pub num_elements: u32,
    pub bytes_produced: u32,
    pub output: u32,
    pub bytes_consumed: u32,
}

pub fn record_element(code: &[u8], ip: u64) -> Result<RecordElement, LayoutError> {
    const F: &str = "DatasetBaseIterator::RecordElement";
    let mut a = Aliases::of(Register::RDI);
    // Registers holding `node_` (value: offset of node_ in the iterator) and
    // registers holding `node_->output_` (value: offset of output_).
    let mut node_regs: HashMap<Register, u32> = HashMap::new();
    let mut out_regs: HashMap<Register, u32> = HashMap::new();
    let (mut node, mut num_elements, mut bytes_produced, mut output, mut bytes_consumed) =
        (None, None, None, None, None);
    for ins in decode(code, ip) {
        if ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        let base = ins.memory_base().full_register();
        let disp = u32::try_from(ins.memory_displacement64()).ok();
        if ins.has_lock_prefix() && ins.op_count() >= 1 && ins.op_kind(0) == OpKind::Memory {
            match (ins.mnemonic(), node_regs.get(&base), out_regs.get(&base)) {
                (Mnemonic::Inc, Some(&n), _) if num_elements.is_none() => {
                    node = Some(n);
                    num_elements = disp;
                }
                (Mnemonic::Add, Some(&n), _) if bytes_produced.is_none() => {
                    node.get_or_insert(n);
                    bytes_produced = disp;
                }
                (Mnemonic::Add, None, Some(&o)) if bytes_consumed.is_none() => {
                    output = Some(o);
                    bytes_consumed = disp;
                }
                _ => {}
            }
        }
        if is_load(&ins) && ins.memory_index() == Register::None {
            let dst = ins.op_register(0).full_register();
            let from_node = node_regs.contains_key(&base);
            let from_this = a.has(base);
            node_regs.remove(&dst);
            out_regs.remove(&dst);
            if let Some(d) = disp {
                if from_this && ins.mnemonic() == Mnemonic::Mov {
                    node_regs.insert(dst, d);
                } else if from_node && ins.mnemonic() == Mnemonic::Mov {
                    out_regs.insert(dst, d);
                }
            }
        } else if ins.op_count() > 0 && ins.op_kind(0) == OpKind::Register {
            let dst = ins.op_register(0).full_register();
            if !matches!(ins.mnemonic(), Mnemonic::Cmp | Mnemonic::Test) {
                node_regs.remove(&dst);
                out_regs.remove(&dst);
            }
        }
        if ins.mnemonic() == Mnemonic::Call {
            for r in CALLER_SAVED {
                node_regs.remove(&r);
                out_regs.remove(&r);
            }
        }
        a.step(&ins);
    }
    let nf = |what| LayoutError::NotFound { func: F, what };
    Ok(RecordElement {
        node: node.ok_or_else(|| nf("node_"))?,
        num_elements: num_elements.ok_or_else(|| nf("num_elements"))?,
        bytes_produced: bytes_produced.ok_or_else(|| nf("bytes_produced"))?,
        output: output.ok_or_else(|| nf("output_"))?,
        bytes_consumed: bytes_consumed.ok_or_else(|| nf("bytes_consumed"))?,
    })
}

/// `Node::record_stop(long)`: the `lock add` into processing_time_.
pub fn record_stop(code: &[u8], ip: u64) -> Result<u32, LayoutError> {
    let mut a = Aliases::of(Register::RDI);
    for ins in decode(code, ip) {
        if ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        if ins.has_lock_prefix()
            && ins.mnemonic() == Mnemonic::Add
            && ins.op_kind(0) == OpKind::Memory
        {
            if let Some(d) = a.mem_disp(&ins) {
                return Ok(d);
            }
        }
        a.step(&ins);
    }
    Err(LayoutError::NotFound {
        func: "Node::record_stop",
        what: "processing_time",
    })
}

/// `DatasetBaseIterator::prefix() const`: `lea X(%rdi), %rax`.
pub fn prefix(code: &[u8], ip: u64) -> Result<u32, LayoutError> {
    for ins in decode(code, ip) {
        if ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        if ins.mnemonic() == Mnemonic::Lea
            && ins.memory_base() == Register::RDI
            && ins.memory_index() == Register::None
        {
            if let Ok(d) = u32::try_from(ins.memory_displacement64()) {
                return Ok(d);
            }
        }
    }
    Err(LayoutError::NotFound {
        func: "DatasetBaseIterator::prefix",
        what: "prefix_",
    })
}

/// A parallel op's `Iterator::CreateNode` (sret: this in rsi): the first
/// `shared_ptr` member copied (pointer at X, control block at X+8, whose
/// use count is then incremented).
pub fn create_node_shared_state(code: &[u8], ip: u64) -> Result<u32, LayoutError> {
    let mut a = Aliases::of(Register::RSI);
    let mut loads: Vec<(u32, Register, usize)> = Vec::new();
    for (i, ins) in decode(code, ip).iter().enumerate().take(400) {
        if ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        if is_load(ins) && ins.mnemonic() == Mnemonic::Mov {
            if let Some(d) = a.mem_disp(ins) {
                loads.push((d, ins.op_register(0).full_register(), i));
            }
        }
        // inc dword [ctrl+8] (use count), locked or not.
        if ins.mnemonic() == Mnemonic::Inc
            && ins.op_kind(0) == OpKind::Memory
            && ins.memory_displacement64() == 8
        {
            let ctrl = ins.memory_base().full_register();
            // The control block register was loaded from [this+X+8] and
            // [this+X] was loaded shortly before.
            if let Some(&(cd, _, ci)) = loads.iter().rev().find(|l| l.1 == ctrl) {
                if i - ci < 16 && cd >= 8 && loads.iter().any(|l| l.0 == cd - 8) {
                    return Ok(cd - 8);
                }
            }
        }
        a.step(ins);
    }
    Err(LayoutError::NotFound {
        func: "Iterator::CreateNode",
        what: "parallelism shared_ptr",
    })
}

/// A node class's `Ratio() const` accessor (this in rdi): the double it
/// returns, `movsd X(%rdi), %xmm0` before the first return, with `this`
/// not moved elsewhere first. Anything else (a computed ratio, a call) is
/// not an accessor of a field, and the build is not understood.
pub fn ratio_accessor(code: &[u8], ip: u64) -> Result<u32, LayoutError> {
    let nf = || LayoutError::NotFound {
        func: "KnownRatio::Ratio",
        what: "ratio_",
    };
    for ins in decode(code, ip).iter().take(8) {
        match ins.mnemonic() {
            Mnemonic::Push | Mnemonic::Pop => {}
            Mnemonic::Mov
                if ins.op_count() == 2
                    && ins.op_kind(1) == OpKind::Register
                    && ins.op_register(0) == Register::RBP
                    && ins.op_register(1) == Register::RSP => {}
            Mnemonic::Movsd | Mnemonic::Vmovsd
                if ins.op_count() == 2
                    && ins.op_kind(0) == OpKind::Register
                    && ins.op_register(0) == Register::XMM0
                    && ins.op_kind(1) == OpKind::Memory
                    && ins.memory_base() == Register::RDI
                    && ins.memory_index() == Register::None =>
            {
                return u32::try_from(ins.memory_displacement64()).map_err(|_| nf());
            }
            _ => return Err(nf()),
        }
    }
    Err(nf())
}

/// Combines the sources; every offset that two functions show must agree.
pub fn node_layout(
    to_proto: NodeLayout,
    re: &RecordElement,
    stop_pt: u32,
) -> Result<NodeLayout, LayoutError> {
    let check = |what, x: u32, y: u32, b| {
        if x == y {
            Ok(())
        } else {
            Err(LayoutError::Disagree {
                what,
                a: "Node::ToProto",
                x,
                b,
                y,
            })
        }
    };
    check(
        "num_elements",
        to_proto.num_elements,
        re.num_elements,
        "RecordElement",
    )?;
    check(
        "bytes_produced",
        to_proto.bytes_produced,
        re.bytes_produced,
        "RecordElement",
    )?;
    check(
        "bytes_consumed",
        to_proto.bytes_consumed,
        re.bytes_consumed,
        "RecordElement",
    )?;
    check(
        "processing_time",
        to_proto.processing_time,
        stop_pt,
        "Node::record_stop",
    )?;
    Ok(NodeLayout {
        output: re.output,
        ..to_proto
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Machine code assembled from the instruction sequences seen in the
    // tensorflow-cpu 2.21.0 wheel (see tf-internals.md), with other offsets
    // so the tests show derivation, not a memorised layout.
    fn asm(
        f: impl FnOnce(&mut iced_x86::code_asm::CodeAssembler) -> Result<(), iced_x86::IcedError>,
    ) -> Vec<u8> {
        let mut a = iced_x86::code_asm::CodeAssembler::new(64).expect("64-bit");
        f(&mut a).expect("assemble");
        a.assemble(0x1000).expect("assemble")
    }

    #[test]
    fn record_stop_finds_lock_add() {
        use iced_x86::code_asm::*;
        let code = asm(|a| {
            a.push(rbp)?;
            a.mov(rbp, rsp)?;
            a.mov(r14, rdi)?;
            a.call(0x2000u64)?;
            a.lock().add(qword_ptr(r14 + 0x90), rbx)?;
            a.ret()
        });
        assert_eq!(record_stop(&code, 0x1000).expect("found"), 0x90);
    }

    #[test]
    fn record_element_follows_node_and_output() {
        use iced_x86::code_asm::*;
        let code = asm(|a| {
            a.mov(rbx, rdi)?;
            a.call(0x2000u64)?;
            a.mov(r14, rax)?;
            a.mov(r12, qword_ptr(rbx + 0x10))?;
            a.lock().inc(qword_ptr(r12 + 0x88))?;
            a.call(0x2000u64)?;
            a.mov(rax, qword_ptr(rbx + 0x10))?;
            a.lock().add(qword_ptr(rax + 0x80), r14)?;
            a.mov(rax, qword_ptr(rbx + 0x10))?;
            a.mov(rax, qword_ptr(rax + 0x128))?;
            a.test(rax, rax)?;
            a.lock().add(qword_ptr(rax + 0x78), r14)?;
            a.ret()
        });
        let re = record_element(&code, 0x1000).expect("found");
        assert_eq!(
            re,
            RecordElement {
                node: 0x10,
                num_elements: 0x88,
                bytes_produced: 0x80,
                output: 0x128,
                bytes_consumed: 0x78
            }
        );
    }

    #[test]
    fn to_proto_reads_source_order_through_spills() {
        use iced_x86::code_asm::*;
        let code = asm(|a| {
            a.mov(rbx, rdx)?;
            a.mov(r14, rsi)?;
            a.lea(rdi, qword_ptr(rsi + 0x8))?;
            a.call(0x2000u64)?;
            a.mov(rax, qword_ptr(r14 + 0x20))?;
            a.lea(rsi, qword_ptr(r14 + 0x28))?;
            a.call(0x2000u64)?;
            a.movzx(eax, byte_ptr(r14 + 0x48))?;
            for d in [0x50, 0x58, 0x60, 0x68, 0x70, 0x78] {
                a.mov(rax, qword_ptr(r14 + d))?;
            }
            a.mov(qword_ptr(rbp - 0x38), r14)?;
            a.call(0x2000u64)?;
            a.mov(rbx, qword_ptr(rbp - 0x38))?;
            a.mov(r15, qword_ptr(rbx + 0x110))?;
            a.add(rbx, 0x110)?;
            a.ret()
        });
        let n = node_from_to_proto(&code, 0x1000).expect("found");
        assert_eq!((n.id, n.name), (0x20, 0x28));
        assert_eq!(n.buffered_bytes, 0x50);
        assert_eq!(n.processing_time, 0x78);
        assert_eq!(n.inputs, 0x110);
    }

    #[test]
    fn create_node_finds_shared_ptr_member() {
        use iced_x86::code_asm::*;
        let code = asm(|a| {
            a.mov(r15, rsi)?;
            a.mov(rcx, qword_ptr(r15 + 0xc8))?;
            a.mov(rsi, qword_ptr(r15 + 0x90))?;
            a.mov(rcx, qword_ptr(r15 + 0xd0))?;
            a.lock().inc(dword_ptr(rcx + 8))?;
            a.ret()
        });
        assert_eq!(
            create_node_shared_state(&code, 0x1000).expect("found"),
            0xc8
        );
    }

    #[test]
    fn create_node_finds_prefetch_buffer_size() {
        use iced_x86::code_asm::*;
        // Prefetch: the knob is first read for its value (min/max of the
        // parameter), then the shared_ptr is copied as one 16-byte move.
        let code = asm(|a| {
            a.mov(r14, rsi)?;
            a.mov(rax, qword_ptr(rsi + 0x150))?;
            a.vmovsd(xmm1, qword_ptr(rax))?;
            a.mov(rax, qword_ptr(rcx))?;
            a.mov(rax, qword_ptr(r14 + 0x158))?;
            a.vmovups(xmm2, xmmword_ptr(r14 + 0x150))?;
            a.test(rax, rax)?;
            a.lock().inc(dword_ptr(rax + 8))?;
            a.ret()
        });
        assert_eq!(
            create_node_shared_state(&code, 0x1000).expect("found"),
            0x150
        );
    }

    #[test]
    fn ratio_accessor_reads_the_returned_field() {
        use iced_x86::code_asm::*;
        let code = asm(|a| {
            a.push(rbp)?;
            a.mov(rbp, rsp)?;
            a.vmovsd(xmm0, qword_ptr(rdi + 0x158))?;
            a.pop(rbp)?;
            a.ret()
        });
        assert_eq!(ratio_accessor(&code, 0x1000).expect("found"), 0x158);
        let code = asm(|a| {
            a.movsd_2(xmm0, qword_ptr(rdi + 0x140))?;
            a.ret()
        });
        assert_eq!(ratio_accessor(&code, 0x1000).expect("found"), 0x140);
    }

    #[test]
    fn computed_ratio_is_not_an_accessor() {
        use iced_x86::code_asm::*;
        // A ratio computed through a call, or read through another pointer.
        let code = asm(|a| {
            a.push(rbp)?;
            a.mov(rbp, rsp)?;
            a.call(0x2000u64)?;
            a.vmovsd(xmm0, qword_ptr(rdi + 0x140))?;
            a.ret()
        });
        assert!(ratio_accessor(&code, 0x1000).is_err());
        let code = asm(|a| {
            a.mov(rax, qword_ptr(rdi + 0x10))?;
            a.vmovsd(xmm0, qword_ptr(rax + 0x140))?;
            a.ret()
        });
        assert!(ratio_accessor(&code, 0x1000).is_err());
    }

    #[test]
    fn disagreement_is_an_error() {
        let tp = NodeLayout {
            num_elements: 0x78,
            ..Default::default()
        };
        let re = RecordElement {
            node: 8,
            num_elements: 0x80,
            bytes_produced: 0,
            output: 0,
            bytes_consumed: 0,
        };
        assert!(node_layout(tp, &re, 0).is_err());
    }
}
