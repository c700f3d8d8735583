//! Totals of counters that restart every epoch. The DataLoader counts the
//! batches it yielded in its iterator (`_num_yielded`), and that count
//! starts again at zero each epoch: a new iterator object when
//! `persistent_workers` is off (often at the address of the old one,
//! freed), the same object `_reset` when it is on. A total over the
//! recording is the sum of each iterator epoch's last value seen; reads
//! often enough (the stage sampler reads at every tick) lose at most what
//! the loop yields between the last read of an epoch and its end.
//!
//! Two things close an epoch's count where the reads cannot. With workers,
//! a map-style iterator's `_send_idx` stands still once the sampler ran
//! out: every batch sent is yielded before the epoch ends. Once one epoch
//! was seen so, an epoch last read with as many sent had run out too: at
//! an epoch's end the loop can take the batches in flight within a
//! millisecond or two, too fast for the reads to see them drain. Without, the
//! loop builds each batch itself, and an epoch's last `next()` raises
//! before it fetches an item (the sampler runs out first): a loop seen
//! building a batch after the last read will yield it. Without a training
//! step between batches the loop starts the next epoch within
//! microseconds of yielding the last batch: the reads missed it, about one
//! batch an epoch (-1.4% on 64-batch epochs), unless a tick saw it built.
//! Once one epoch's last batch was seen so, an epoch last read one short
//! of that count yielded its last batch too (`Learned`). Either inference
//! counts the batches in flight, or the last one, of a loop that breaks
//! out of an epoch just short of its end: not ones of any other epoch.

use std::collections::HashMap;

/// One read of an iterator's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The iterator object (its address: another iterator may be there
    /// later, see `first_worker`).
    pub iter: u64,
    /// `_num_yielded`: batches yielded this epoch.
    pub yielded: u64,
    /// `_send_idx` of a map-style iterator with workers: batches sent to
    /// them this epoch. None otherwise (an iterable dataset's workers are
    /// sent requests that end in no batch).
    pub sent: Option<u64>,
    /// The pid of the iterator's worker 0, when the read looked its
    /// workers up by name (a full read, not a count read) and it was
    /// started: another iterator at the same address has other workers.
    pub first_worker: Option<i32>,
}

impl Count {
    /// Batches sent to the workers and not yet yielded (0 when `sent` is
    /// not read).
    pub fn in_flight(&self) -> u64 {
        self.sent.map_or(0, |s| s.saturating_sub(self.yielded))
    }
}

/// One iterator's epoch as last read.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    yielded: u64,
    sent: Option<u64>,
    /// The sampler ran out: `sent` stood still while `yielded` rose below
    /// it. Every batch sent is yielded before such an epoch ends, so its
    /// last count is `sent`, even when the loop took the last ones
    /// between two reads.
    drained: bool,
    /// Another iterator took over: this epoch is over, counted with what
    /// was learned by then. Learned later, it would change a count that
    /// an earlier total, the window's start, already holds.
    over: Option<Learned>,
    /// The loop was seen building a batch of this epoch (map-style,
    /// without workers) since its count last rose: it will yield it, so
    /// the epoch's count is at least one more.
    building: bool,
    /// Its iterator's worker 0, once a read said (`Count::first_worker`).
    first_worker: Option<i32>,
}

impl Epoch {
    fn new(c: Count) -> Self {
        Epoch {
            yielded: c.yielded,
            sent: c.sent,
            drained: false,
            over: None,
            building: false,
            first_worker: c.first_worker,
        }
    }

    /// `c` is of another iterator than this epoch's, though at the same
    /// address: its first worker is another process.
    fn other_iterator(&self, c: &Count) -> bool {
        matches!((self.first_worker, c.first_worker), (Some(a), Some(b)) if a != b)
    }

    /// The epoch's count once it is over, with what earlier epochs said of
    /// the loader's epochs (`Learned`).
    fn last(&self, learned: Learned) -> u64 {
        match self.sent {
            Some(s) if self.drained || learned.ran_out == Some(s) => s.max(self.yielded),
            Some(_) => self.yielded,
            None => {
                let n = self.yielded + u64::from(self.building);
                if learned.built == Some(n + 1) {
                    n + 1
                } else {
                    n
                }
            }
        }
    }

    fn update(&mut self, c: Count) {
        if let (Some(s0), Some(s1)) = (self.sent, c.sent) {
            if s1 != s0 {
                self.drained = false;
            } else if c.yielded > self.yielded && s1 > c.yielded {
                self.drained = true;
            }
        }
        // The batch seen building may be the one now counted.
        if c.yielded > self.yielded {
            self.building = false;
        }
        self.yielded = c.yielded;
        self.sent = c.sent;
        self.first_worker = self.first_worker.or(c.first_worker);
    }
}

/// What ended epochs said of the loader's epochs: a map-style sampler
/// keeps its length, and the last batches of an epoch can go too fast for
/// the reads.
#[derive(Debug, Clone, Copy, Default)]
struct Learned {
    /// With workers: where the sampler ran out in the last epoch seen
    /// drained. An epoch last read with as many sent had run out too,
    /// though no read saw it drain: at the end the workers are idle and
    /// the loop can take the batches in flight within a millisecond or
    /// two.
    ran_out: Option<u64>,
    /// Without workers: the count of the last epoch whose last batch was
    /// seen building. An epoch last read one short of it yielded that
    /// batch too: the loop starts the next epoch microseconds after it,
    /// and a tick falls in its fetch only now and then.
    built: Option<u64>,
}

impl Learned {
    /// An epoch just closed (the same iterator restarted, or a new one
    /// took over): its count, and what its last read teaches of the
    /// epochs to come.
    fn closed(&mut self, e: &Epoch) -> u64 {
        let n = e.last(*self);
        if e.building {
            self.built = Some(n);
        }
        n
    }
}

/// One counter's total across epochs and iterators.
#[derive(Debug, Clone, Default)]
pub struct EpochTotal {
    /// Sum of the finished epochs' last values.
    done: u64,
    /// Each iterator object's epoch at its last read: an old iterator
    /// still alive beside the new one keeps its count, read or not.
    last: HashMap<u64, Epoch>,
    /// The iterator read last.
    current: Option<u64>,
    /// Epochs that ended while we watched.
    pub epochs: u64,
    /// The count of the epoch that ended last: where the next one will
    /// end too, on a map-style loader (its sampler's length).
    ended: Option<u64>,
    learned: Learned,
}

impl EpochTotal {
    /// A read of an iterator. A count below the last one at the same
    /// address starts an epoch (an iterator reset, or a new one where the
    /// old one was), as does another first worker there; a new address is
    /// a new iterator, and the epochs of the others are over.
    pub fn see(&mut self, c: Count) {
        // Every batch yielded was sent first: a read that says otherwise
        // was torn (the iterator changed under it) and says nothing.
        if c.sent.is_some_and(|s| c.yielded > s) {
            return;
        }
        let before = self.current.replace(c.iter);
        match self.last.get_mut(&c.iter) {
            // Another iterator where this one was: without persistent
            // workers the next epoch's is often where the last one's was
            // freed, and one first read only once it had yielded as many
            // is told by its workers (an 8-batch epoch lost in 70).
            Some(e) if c.yielded < e.yielded || e.other_iterator(&c) => {
                let n = self.learned.closed(e);
                self.done += n;
                self.epochs += 1;
                self.ended = Some(n);
                *e = Epoch::new(c);
            }
            Some(e) => {
                e.update(c);
                if e.drained {
                    self.learned.ran_out = e.sent;
                }
            }
            None => {
                // The epoch read last is the one that just ended (not an
                // old iterator read again after its epoch was over).
                let was = before.and_then(|i| self.last.get(&i));
                if let Some(e) = was.filter(|e| e.over.is_none()) {
                    self.ended = Some(self.learned.closed(e));
                }
                let learned = self.learned;
                for e in self.last.values_mut() {
                    e.over.get_or_insert(learned);
                }
                self.epochs += u64::from(!self.last.is_empty());
                self.last.insert(c.iter, Epoch::new(c));
            }
        }
    }

    /// The training loop was seen building a batch of a map-style loader
    /// without workers, after the last read: the iterator read last will
    /// yield it (see the module's comment). Only the loop's own fetch says
    /// so: an iterable dataset's last `next()` fetches and finds nothing,
    /// and a worker's fetch is no batch of this process's count.
    pub fn building(&mut self) {
        if let Some(e) = self.current.and_then(|i| self.last.get_mut(&i)) {
            if e.over.is_none() && e.sent.is_none() {
                e.building = true;
            }
        }
    }

    /// The count at which the last epoch that ended while we watched
    /// ended: None before one did.
    pub fn ended_at(&self) -> Option<u64> {
        self.ended
    }

    /// Where the sampler ran out in the last epoch seen drained: an epoch
    /// that sent as many closes there (see `Epoch::last`).
    pub fn ran_out(&self) -> Option<u64> {
        self.learned.ran_out
    }

    /// Everything counted so far, from the first read on.
    pub fn total(&self) -> u64 {
        self.done
            + self
                .last
                .values()
                .map(|e| match e.over {
                    Some(learned) => e.last(learned),
                    None => e.yielded,
                })
                .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(iter: u64, yielded: u64) -> Count {
        Count {
            iter,
            yielded,
            sent: None,
            first_worker: None,
        }
    }

    #[test]
    fn sums_epochs_of_new_and_reset_iterators() {
        let mut t = EpochTotal::default();
        assert_eq!(t.total(), 0);
        t.see(c(0x10, 3));
        t.see(c(0x10, 7));
        assert_eq!(t.total(), 7);
        // A new iterator: the old one's 7 are kept.
        t.see(c(0x20, 2));
        assert_eq!((t.total(), t.epochs), (9, 1));
        // The same iterator reset (persistent workers).
        t.see(c(0x20, 5));
        t.see(c(0x20, 1));
        assert_eq!((t.total(), t.epochs), (13, 2));
        // The old one read again (both alive for a while): nothing twice.
        t.see(c(0x10, 7));
        t.see(c(0x20, 2));
        assert_eq!((t.total(), t.epochs), (14, 2));
        // A new iterator where a freed one was.
        t.see(c(0x10, 0));
        assert_eq!((t.total(), t.epochs), (14, 3));
    }

    #[test]
    fn a_batch_seen_building_ends_its_epoch() {
        let mut t = EpochTotal::default();
        // Read at 14 of 16, seen building 15, then 15 read: nothing more.
        t.see(c(0x10, 14));
        t.building();
        t.see(c(0x10, 15));
        assert_eq!(t.total(), 15);
        // Seen building 16; the next read finds a new iterator at the
        // same address: the old epoch yielded it.
        t.building();
        assert_eq!(t.total(), 15, "a running epoch counts what it yielded");
        t.see(c(0x10, 0));
        assert_eq!((t.total(), t.epochs), (16, 1));
        // The same at a new address.
        t.see(c(0x10, 15));
        t.building();
        t.see(c(0x20, 1));
        assert_eq!((t.total(), t.epochs), (16 + 16 + 1, 2));
        // Not seen building, one short of an epoch that was: as that one
        // (see an_epoch_one_short_of_one_seen_built_yielded_its_last_batch).
        t.see(c(0x20, 15));
        t.see(c(0x30, 0));
        assert_eq!(t.total(), 16 + 16 + 16);
        // An old iterator read again after a new one took over: its epoch
        // is over, whatever the loop builds now.
        t.see(c(0x30, 3));
        t.see(c(0x40, 0));
        t.see(c(0x30, 3));
        t.building();
        assert_eq!(t.total(), 16 + 16 + 16 + 3);
    }

    #[test]
    fn the_last_epoch_says_where_the_next_ends() {
        let mut t = EpochTotal::default();
        t.see(c(0x10, 5));
        assert_eq!(t.ended_at(), None);
        // Reset where it was (persistent workers): ended at 16.
        t.see(c(0x10, 16));
        t.see(c(0x10, 2));
        assert_eq!(t.ended_at(), Some(16));
        // A new iterator: the one read last ended; an old one read again
        // after it does not move the figure.
        t.see(c(0x10, 15));
        t.building();
        t.see(c(0x20, 1));
        assert_eq!(t.ended_at(), Some(16));
        t.see(c(0x10, 15));
        t.see(c(0x30, 0));
        assert_eq!(t.ended_at(), Some(16));
    }

    fn s(iter: u64, yielded: u64, sent: u64) -> Count {
        Count {
            iter,
            yielded,
            sent: Some(sent),
            first_worker: None,
        }
    }

    #[test]
    fn a_drained_epoch_ends_at_what_was_sent() {
        let mut t = EpochTotal::default();
        // 16 batches an epoch, 4 in flight: sent reaches 16 at yield 12.
        t.see(s(0x10, 11, 15));
        t.see(s(0x10, 12, 16));
        t.see(s(0x10, 14, 16));
        // Still running: the count is what was yielded.
        assert_eq!(t.total(), 14);
        // Reset (persistent workers) before the last two were read.
        t.see(s(0x10, 1, 5));
        assert_eq!((t.total(), t.epochs), (17, 1));
        // A loop that breaks out while still sending keeps what it took.
        t.see(s(0x10, 6, 10));
        t.see(s(0x20, 0, 4));
        assert_eq!((t.total(), t.epochs), (16 + 6, 2));
        // A new iterator after a drained epoch elsewhere.
        t.see(s(0x20, 13, 16));
        t.see(s(0x20, 14, 16));
        t.see(s(0x30, 2, 6));
        assert_eq!(t.total(), 16 + 6 + 16 + 2);
        // A torn read (more yielded than sent) is not counted.
        t.see(s(0x30, 90, 7));
        assert_eq!(t.total(), 16 + 6 + 16 + 2);
    }

    #[test]
    fn an_epoch_one_short_of_one_seen_built_yielded_its_last_batch() {
        let mut t = EpochTotal::default();
        // One short, nothing learned yet: what was read.
        t.see(c(0x10, 15));
        t.see(c(0x10, 0));
        assert_eq!(t.total(), 15);
        // Its last batch seen building: 16, learned.
        t.see(c(0x10, 15));
        t.building();
        t.see(c(0x10, 0));
        assert_eq!(t.total(), 15 + 16);
        // One short of 16, at the same address and at a new one: 16.
        t.see(c(0x10, 15));
        t.see(c(0x10, 1));
        assert_eq!(t.total(), 15 + 16 + 16 + 1);
        t.see(c(0x10, 15));
        t.see(c(0x20, 0));
        assert_eq!(t.total(), 15 + 16 + 16 + 16);
        // Two short (a break): what was read.
        t.see(c(0x20, 14));
        t.see(c(0x20, 0));
        assert_eq!(t.total(), 15 + 16 + 16 + 16 + 14);
    }

    #[test]
    fn what_is_learned_later_leaves_ended_epochs_as_counted() {
        let mut t = EpochTotal::default();
        // Over (a new iterator) one short, before anything was learned.
        t.see(c(0x10, 15));
        t.see(c(0x20, 0));
        let before = t.total();
        assert_eq!(before, 15);
        // Then an epoch's last batch seen building: 16 learned. The first
        // epoch stays at 15, or a window's start (the total then) would
        // count its batch as the window's.
        t.see(c(0x20, 15));
        t.building();
        t.see(c(0x30, 0));
        assert_eq!(t.total(), 15 + 16);
    }

    #[test]
    fn an_epoch_that_sent_as_many_as_a_drained_one_ran_out_too() {
        let mut t = EpochTotal::default();
        // Last read with all 16 sent, not seen drained: what was yielded.
        t.see(s(0x10, 13, 15));
        t.see(s(0x10, 14, 16));
        t.see(s(0x10, 1, 3));
        assert_eq!(t.total(), 14 + 1);
        // Seen drained at 16: the sampler runs out there.
        t.see(s(0x10, 14, 16));
        t.see(s(0x10, 15, 16));
        t.see(s(0x10, 0, 2));
        assert_eq!(t.total(), 14 + 16);
        // Then an epoch last read at 14 of 16 sent ran out as well.
        t.see(s(0x10, 14, 16));
        t.see(s(0x20, 0, 2));
        assert_eq!(t.total(), 14 + 16 + 16);
        // One that stopped sending short of it (a break) did not.
        t.see(s(0x20, 6, 8));
        t.see(s(0x30, 0, 2));
        assert_eq!(t.total(), 14 + 16 + 16 + 6);
    }

    #[test]
    fn another_iterator_where_one_was_is_told_by_its_first_worker() {
        let w = |c: Count, pid: i32| Count {
            first_worker: Some(pid),
            ..c
        };
        let mut t = EpochTotal::default();
        // An 8-batch epoch at 0x10, its workers read (worker 0: pid 100).
        t.see(w(s(0x10, 2, 4), 100));
        t.see(s(0x10, 8, 8));
        // The next epoch's iterator at 0x20, then the one after it where
        // the first was freed, first read once it had yielded all 8.
        t.see(s(0x20, 8, 8));
        t.see(w(s(0x10, 8, 8), 200));
        assert_eq!((t.total(), t.epochs), (24, 2));
        // Read again, by count or with the same worker: the same epoch.
        t.see(s(0x10, 8, 8));
        t.see(w(s(0x10, 8, 8), 200));
        assert_eq!(t.total(), 24);
        // Its workers first read mid-epoch (the count fell: a new epoch
        // already): not another iterator.
        t.see(s(0x10, 1, 3));
        t.see(w(s(0x10, 3, 5), 300));
        assert_eq!(t.total(), 24 + 3);
    }
}
