//! Reads the target's memory with process_vm_readv: no ptrace stop, no
//! probe; the target does not notice. Every read can fail (the object may be
//! freed under us), so every read returns a Result and callers validate.

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MemError {
    #[error("reading {len} bytes at {addr:#x}: {errno}")]
    Read {
        addr: u64,
        len: usize,
        errno: nix::errno::Errno,
    },
    #[error("short read at {addr:#x}: {got} of {len} bytes")]
    Short { addr: u64, len: usize, got: usize },
    #[error("string at {addr:#x} is not a plausible name (length {len})")]
    BadString { addr: u64, len: u64 },
}

/// The native-endian u64 at byte `at` of bytes read from the target with
/// one `Memory::read` of a whole object, or 0 past their end.
pub fn word_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pid: Pid,
}

impl Memory {
    pub fn new(pid: i32) -> Self {
        Memory {
            pid: Pid::from_raw(pid),
        }
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let len = buf.len();
        let remote = [RemoteIoVec {
            base: addr as usize,
            len,
        }];
        let mut local = [IoSliceMut::new(buf)];
        match process_vm_readv(self.pid, &mut local, &remote) {
            Ok(n) if n == len => Ok(()),
            Ok(n) => Err(MemError::Short { addr, len, got: n }),
            Err(errno) => Err(MemError::Read { addr, len, errno }),
        }
    }

    /// Reads each `(addr, buf)` in one call; the kernel stops at the first
    /// range it cannot read. Returns how many of the leading ranges were
    /// read whole.
    pub fn read_many(&self, parts: &mut [(u64, &mut [u8])]) -> usize {
        // The kernel's limit on ranges per call (UIO_MAXIOV).
        if parts.len() > 1024 {
            return 0;
        }
        let remote: Vec<RemoteIoVec> = parts
            .iter()
            .map(|(addr, b)| RemoteIoVec {
                base: *addr as usize,
                len: b.len(),
            })
            .collect();
        let lens: Vec<usize> = parts.iter().map(|(_, b)| b.len()).collect();
        let mut local: Vec<IoSliceMut> =
            parts.iter_mut().map(|(_, b)| IoSliceMut::new(b)).collect();
        let mut got = process_vm_readv(self.pid, &mut local, &remote).unwrap_or(0);
        let mut whole = 0;
        for len in lens {
            if got < len {
                break;
            }
            got -= len;
            whole += 1;
        }
        whole
    }

    pub fn u64(&self, addr: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    pub fn f64(&self, addr: u64) -> Result<f64, MemError> {
        self.u64(addr).map(f64::from_bits)
    }

    /// Reads a libstdc++ `std::string` (`{char* p; size_t len; ...}`) of at
    /// most `max` bytes.
    pub fn std_string(&self, addr: u64, max: u64) -> Result<String, MemError> {
        let p = self.u64(addr)?;
        let len = self.u64(addr + 8)?;
        self.std_string_from(addr, (p, len), max, (0, &[]))
    }

    /// The same from the string's header `(p, len)`, read already with the
    /// object holding it (at `addr`): the characters are taken from `held`
    /// (bytes read at `held.0`) when they lie there, as a short string's
    /// do, and read otherwise.
    pub fn std_string_from(
        &self,
        addr: u64,
        (p, len): (u64, u64),
        max: u64,
        held: (u64, &[u8]),
    ) -> Result<String, MemError> {
        if len == 0 || len > max || p == 0 {
            return Err(MemError::BadString { addr, len });
        }
        // `p` comes from the target's memory: no arithmetic on it may
        // overflow.
        let inside = p.checked_sub(held.0).and_then(|at| {
            let at = usize::try_from(at).ok()?;
            held.1.get(at..at.checked_add(usize::try_from(len).ok()?)?)
        });
        let buf = match inside {
            Some(b) => b.to_vec(),
            None => {
                let mut b = vec![0u8; len as usize];
                self.read(p, &mut b)?;
                b
            }
        };
        String::from_utf8(buf).map_err(|_| MemError::BadString { addr, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_from_held_bytes_or_memory() {
        let mem = Memory::new(std::process::id() as i32);
        let held = b"xxParallelMapV2yy";
        // The characters inside the bytes already read.
        let s = mem.std_string_from(0x1000, (0x1002, 13), 64, (0x1000, held));
        assert_eq!(s.ok().as_deref(), Some("ParallelMapV2"));
        // A pointer read from a target's memory can be anything: one near
        // the top of the address space is read (and fails), not a panic.
        let far = mem.std_string_from(0x1000, (u64::MAX - 3, 13), 64, (0x1000, held));
        assert!(far.is_err());
        // Ours, read from memory.
        let own = String::from("a heap string, not inline");
        let got = mem.std_string_from(0, (own.as_ptr() as u64, own.len() as u64), 64, (0, &[]));
        assert_eq!(got.ok().as_deref(), Some(own.as_str()));
    }
}
