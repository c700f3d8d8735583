//! Frame names for sampled addresses, with blazesym, cached per address:
//! a recording hits the same few thousand addresses again and again, and a
//! lookup in libtensorflow_cc's 1.2 M symbols is not free.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::debug;

use super::unwind::StackUnwinder;
use crate::symbolize::{AddrNames, JIT, UNKNOWN};

pub struct FrameNames {
    symbolizer: AddrNames,
    user: HashMap<u64, Arc<str>>,
    kernel: HashMap<u64, Arc<str>>,
    pub lookups: u64,
}

impl FrameNames {
    pub fn new(pid: i32) -> Self {
        FrameNames {
            symbolizer: AddrNames::new(pid),
            user: HashMap::new(),
            kernel: HashMap::new(),
            lookups: 0,
        }
    }

    /// Names every address of `addrs` not named yet, in one blazesym call.
    pub fn resolve_user(&mut self, addrs: &[u64], unwinder: &StackUnwinder) {
        let mut todo: Vec<u64> = Vec::new();
        for &a in addrs {
            if self.user.contains_key(&a) {
                continue;
            }
            if unwinder.is_jit(a) {
                self.user.insert(a, Arc::from(JIT));
            } else if !unwinder.is_mapped_code(a) {
                self.user.insert(a, Arc::from(UNKNOWN));
            } else {
                todo.push(a);
            }
        }
        todo.sort_unstable();
        todo.dedup();
        if todo.is_empty() {
            return;
        }
        self.lookups += todo.len() as u64;
        let names = match self.symbolizer.user::<Arc<str>>(&todo) {
            Ok(names) => names,
            Err(e) => {
                debug!("symbolizing {} addresses: {e}", todo.len());
                vec![Arc::from(UNKNOWN); todo.len()]
            }
        };
        for (a, n) in todo.into_iter().zip(names) {
            self.user.insert(a, n);
        }
    }

    /// Loads the kernel's symbols (blazesym reads /proc/kallsyms whole,
    /// ~60 ms of CPU here) so that the first kernel-mode sample of the
    /// recording does not: called before sampling starts.
    pub fn load_kernel_symbols(&mut self) {
        // Any kernel address will do: the resolver stays cached.
        self.resolve_kernel(&[0xffff_ffff_8100_0000]);
    }

    pub fn resolve_kernel(&mut self, addrs: &[u64]) {
        let mut todo: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        todo.sort_unstable();
        todo.dedup();
        if todo.is_empty() {
            return;
        }
        let names = match self.symbolizer.kernel::<String>(&todo) {
            Ok(names) => names
                .into_iter()
                .map(|n| Arc::from(format!("{n}_[k]")))
                .collect::<Vec<Arc<str>>>(),
            Err(e) => {
                debug!("symbolizing kernel addresses: {e}");
                vec![Arc::from("[kernel]_[k]"); todo.len()]
            }
        };
        for (a, n) in todo.into_iter().zip(names) {
            self.kernel.insert(a, n);
        }
    }

    pub fn user(&self, addr: u64) -> Arc<str> {
        self.user
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| Arc::from(UNKNOWN))
    }

    pub fn kernel(&self, addr: u64) -> Arc<str> {
        self.kernel
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| Arc::from("[kernel]_[k]"))
    }
}
