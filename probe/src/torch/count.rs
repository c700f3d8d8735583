//! Totals of counters that restart every epoch. The DataLoader counts the
//! batches it yielded in its iterator (`_num_yielded`), and that count
//! starts again at zero each epoch: a new iterator object when
//! `persistent_workers` is off (often at the address of the old one,
//! freed), the same object `_reset` when it is on. A total over the
//! recording is the sum of each iterator epoch's last value seen; reads
//! often enough (the stage sampler reads at every tick) lose at most what
//! the loop yields between the last read of an epoch and its end.

use std::collections::HashMap;

/// One counter's total across epochs and iterators.
#[derive(Debug, Clone, Default)]
pub struct EpochTotal {
    /// Sum of the finished epochs' last values.
    done: u64,
    /// Each iterator object's value at its last read: an old iterator
    /// still alive beside the new one keeps its count, read or not.
    last: HashMap<u64, u64>,
    /// Epochs that ended while we watched.
    pub epochs: u64,
}

impl EpochTotal {
    /// A read of `value` on the iterator at `addr`. A value below the last
    /// one at the same address starts an epoch (an iterator reset, or a
    /// new one where the old one was); a new address is a new iterator,
    /// and the epoch of the one read before it ended.
    pub fn see(&mut self, addr: u64, value: u64) {
        match self.last.insert(addr, value) {
            Some(v) if value < v => {
                self.done += v;
                self.epochs += 1;
            }
            Some(_) => {}
            None => self.epochs += u64::from(self.last.len() > 1),
        }
    }

    /// Everything counted so far, from the first read on.
    pub fn total(&self) -> u64 {
        self.done + self.last.values().sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_epochs_of_new_and_reset_iterators() {
        let mut t = EpochTotal::default();
        assert_eq!(t.total(), 0);
        t.see(0x10, 3);
        t.see(0x10, 7);
        assert_eq!(t.total(), 7);
        // A new iterator: the old one's 7 are kept.
        t.see(0x20, 2);
        assert_eq!((t.total(), t.epochs), (9, 1));
        // The same iterator reset (persistent workers).
        t.see(0x20, 5);
        t.see(0x20, 1);
        assert_eq!((t.total(), t.epochs), (13, 2));
        // The old one read again (both alive for a while): nothing twice.
        t.see(0x10, 7);
        t.see(0x20, 2);
        assert_eq!((t.total(), t.epochs), (14, 2));
        // A new iterator where a freed one was.
        t.see(0x10, 0);
        assert_eq!((t.total(), t.epochs), (14, 3));
    }
}
