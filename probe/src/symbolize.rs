//! Names of code addresses, the target's and the kernel's, with blazesym
//! (demangled, as its default symbolizer does): address -> name, where
//! `symbols` goes name -> address. The stack sampler names its samples
//! with it on its worker thread (caching per address), usage the stacks
//! of lock sites and file reads on the main thread after the recording:
//! each holds an instance of its own, and both name frames the same way.

use blazesym::symbolize::source::{Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::Pid;

/// An address in executable memory of no file (JIT code).
pub const JIT: &str = "[jit]";
/// An address no symbol covers, or that could not be looked up.
pub const UNKNOWN: &str = "[unknown]";

pub struct AddrNames {
    pid: i32,
    symbolizer: Symbolizer,
}

impl AddrNames {
    /// Names addresses of process `pid` (and of the kernel).
    pub fn new(pid: i32) -> Self {
        AddrNames {
            pid,
            symbolizer: Symbolizer::new(),
        }
    }

    /// One name per address of the target, [`UNKNOWN`] for those no
    /// symbol covers, in one blazesym call.
    pub fn user<T: for<'s> From<&'s str>>(&self, addrs: &[u64]) -> Result<Vec<T>, blazesym::Error> {
        let src = Source::Process(Process::new(Pid::from(self.pid as u32)));
        self.names(&src, addrs)
    }

    /// One name per kernel address, [`UNKNOWN`] for those no symbol covers.
    pub fn kernel<T: for<'s> From<&'s str>>(
        &self,
        addrs: &[u64],
    ) -> Result<Vec<T>, blazesym::Error> {
        self.names(&Source::Kernel(Kernel::default()), addrs)
    }

    fn names<T: for<'s> From<&'s str>>(
        &self,
        src: &Source<'_>,
        addrs: &[u64],
    ) -> Result<Vec<T>, blazesym::Error> {
        let syms = self.symbolizer.symbolize(src, Input::AbsAddr(addrs))?;
        Ok(syms
            .iter()
            .map(|s| match s {
                Symbolized::Sym(s) => T::from(&*s.name),
                Symbolized::Unknown(_) => T::from(UNKNOWN),
            })
            .collect())
    }
}
