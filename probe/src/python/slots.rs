//! Attribute slots and ints read for a caller that reads them again and
//! again (the DataLoader's counts): where an attribute's value pointer
//! lies, every name wanted found in one pass over the keys, and several
//! words or ints in one call to the kernel; and the headers of many
//! objects (a big namespace's values) a thousand to a call.

use super::code::read_string;
use super::objects::{
    digit_count, long_value, user_addr, Entry, LongError, ObjError, Objects, Slot, Storage,
};
use crate::mem::word_at;

impl Objects {
    /// Where the instance at `obj` keeps the value of its attribute `name`:
    /// the address of the pointer to it, which a caller may read again
    /// instead of looking the name up each time (valid while the instance
    /// keeps its attributes where they are: until its dict is resized or
    /// materialised, so it is to be looked up again now and then).
    /// With it, the key object when the slot is in a combined table's
    /// entry, where the key lies in the word before the
    /// value: a later read of both says whether the slot still holds this
    /// attribute (a table that grew leaves its old entries to be reused).
    pub fn attr_slot(&self, obj: u64, name: &str) -> Result<Option<(u64, Option<u64>)>, ObjError> {
        for (key, _, storage, slot) in self.attr_entries(obj)? {
            if self.key_is(key, name)? {
                let keyed = (storage == Storage::CombinedDict).then_some(key);
                return Ok(Some((slot, keyed)));
            }
        }
        Ok(None)
    }

    /// An int's value in one read, when `obj`'s type is `int_type` (an
    /// address a [`Objects::long`] of an int gave through
    /// [`Objects::type_of`]) and it has at most two digits; else as
    /// [`Objects::long`].
    pub fn long_of_type(&self, obj: u64, int_type: u64) -> Result<i128, ObjError> {
        let l = &self.lay;
        let mut b = vec![0u8; (l.long_digits + 8) as usize];
        self.mem.read(obj, &mut b)?;
        match self.small_long(&b, int_type) {
            Some(v) => v.map_err(|e| match e {
                LongError::TooLarge => ObjError::TooLarge(obj),
                LongError::Layout(w) => self.layout_err(w),
            }),
            None => self.long(obj),
        }
    }

    /// The value of an int read whole into `b`, if it is of type
    /// `int_type` with at most two digits; None otherwise.
    fn small_long(&self, b: &[u8], int_type: u64) -> Option<Result<i128, LongError>> {
        let l = &self.lay;
        let tag = word_at(b, l.long_tag as usize);
        match digit_count(l.minor, tag) {
            Some(n) if n <= 2 && word_at(b, l.ob_type as usize) == int_type => {
                let digits = b.get(l.long_digits as usize..l.long_digits as usize + 4 * n)?;
                Some(long_value(l.minor, tag, digits))
            }
            _ => None,
        }
    }

    /// Where a dict keeps the pointers to its tables: `ma_keys`,
    /// `ma_values`.
    pub fn dict_table_addrs(&self, dict: u64) -> [u64; 2] {
        [dict + self.lay.dict_keys, dict + self.lay.dict_values]
    }

    /// Reads each `(addr, buf)` in one call; how many of the leading ones
    /// were read whole.
    pub fn read_many(&self, parts: &mut [(u64, &mut [u8])]) -> usize {
        self.mem.read_many(parts)
    }

    /// The values of the ints at `objs`, all read in one call, when each
    /// is of type `int_type` with at most two digits; None otherwise.
    pub fn longs_of_type(&self, objs: &[u64], int_type: u64) -> Option<Vec<i128>> {
        let l = &self.lay;
        let len = (l.long_digits + 8) as usize;
        let mut bufs = vec![vec![0u8; len]; objs.len()];
        let mut parts: Vec<(u64, &mut [u8])> = objs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&o, b)| (o, b.as_mut_slice()))
            .collect();
        if !objs.iter().all(|&o| user_addr(o)) || self.read_many(&mut parts) != objs.len() {
            return None;
        }
        bufs.iter()
            .map(|b| self.small_long(b, int_type)?.ok())
            .collect()
    }

    /// Every attribute of the instance at `obj` as (key object, value),
    /// the keys not read: [`Objects::key_name`] names the ones wanted.
    pub fn attr_values(&self, obj: u64) -> Result<Vec<(u64, u64)>, ObjError> {
        Ok(self
            .attr_entries(obj)?
            .into_iter()
            .map(|(key, value, _, _)| (key, value))
            .collect())
    }

    /// The items of the dict at `d` as (key object, value), if it holds
    /// at most `most` (its `ma_used`, the word two before `ma_keys`, read
    /// first: a look through a frame's dicts skips the big ones).
    pub fn dict_items(&self, d: u64, most: u64) -> Result<Option<Vec<(u64, u64)>>, ObjError> {
        let used = self.mem.u64(d + self.lay.dict_keys - 16)?;
        if used > most {
            return Ok(None);
        }
        Ok(Some(
            self.dict_entries(d)?
                .into_iter()
                .map(|(key, value, _, _)| (key, value))
                .collect(),
        ))
    }

    /// An attribute's key as a string, if it is a `str`.
    pub fn key_name(&self, key: u64) -> Option<String> {
        (self.mem.u64(key + self.lay.ob_type).ok()? == self.str_type)
            .then(|| read_string(&self.mem, &self.off, key))
            .flatten()
    }

    /// [`Objects::attr_slot`] of each of `names`, the attribute table read
    /// once and every key's first bytes in one call (a lookup one name at
    /// a time reads each key before the one wanted: hundreds of reads for
    /// an iterator's dozen attributes).
    pub fn attr_slots(&self, obj: u64, names: &[&str]) -> Result<Vec<Option<Slot>>, ObjError> {
        let entries = self.attr_entries(obj)?;
        let ascii = self.off.ascii_size as usize;
        let len = ascii + names.iter().map(|n| n.len()).max().unwrap_or(0);
        let Some(bufs) = self.keys_read(&entries, len) else {
            // A short key near the end of its mapping: one at a time.
            return names.iter().map(|n| self.attr_slot(obj, n)).collect();
        };
        let mut out = vec![None; names.len()];
        for ((key, _, storage, slot), b) in entries.iter().zip(&bufs) {
            let Some(i) = names.iter().position(|n| self.key_bytes_are(b, n)) else {
                continue;
            };
            let keyed = (*storage == Storage::CombinedDict).then_some(*key);
            out[i] = Some((*slot, keyed));
        }
        Ok(out)
    }

    /// Whether the bytes read at a key, from its header on, are the str
    /// `name` (a compact ASCII string).
    fn key_bytes_are(&self, b: &[u8], name: &str) -> bool {
        let ascii = self.off.ascii_size as usize;
        let Some(text) = b.get(ascii..ascii + name.len()) else {
            return false;
        };
        if word_at(b, self.lay.ob_type as usize) != self.str_type
            || word_at(b, 16) != name.len() as u64
            || b.len() < 36
        {
            return false;
        }
        let state = u32::from_ne_bytes([b[32], b[33], b[34], b[35]]);
        let (kind, compact, is_ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
        kind == 1 && compact == 1 && is_ascii == 1 && text == name.as_bytes()
    }

    /// Which of `entries` has the key `name` (Some(None): none), every
    /// key's first bytes read in one call; None when that call fell short
    /// (a short key near the end of its mapping: then one at a time).
    pub(super) fn key_among(&self, entries: &[Entry], name: &str) -> Option<Option<usize>> {
        let bufs = self.keys_read(entries, self.off.ascii_size as usize + name.len())?;
        Some(bufs.iter().position(|b| self.key_bytes_are(b, name)))
    }

    /// The first `len` bytes of each entry's key, in one call; None when
    /// it fell short.
    fn keys_read(&self, entries: &[Entry], len: usize) -> Option<Vec<Vec<u8>>> {
        let mut bufs = vec![vec![0u8; len]; entries.len()];
        let mut parts: Vec<(u64, &mut [u8])> = entries
            .iter()
            .zip(bufs.iter_mut())
            .map(|(e, b)| (e.0, b.as_mut_slice()))
            .collect();
        (self.mem.read_many(&mut parts) == entries.len()).then_some(bufs)
    }

    /// Whether `key` is the str `name` (ASCII compact strings; others
    /// never equal a name looked up here).
    pub(super) fn key_is(&self, key: u64, name: &str) -> Result<bool, ObjError> {
        let ascii = u64::from(self.off.ascii_size);
        let mut b = vec![0u8; ascii as usize + name.len()];
        if self.mem.read(key, &mut b).is_err() {
            // The name's bytes may run past a short key's mapping.
            return Ok(read_string(&self.mem, &self.off, key).as_deref() == Some(name));
        }
        Ok(self.key_bytes_are(&b, name))
    }

    /// [`Objects::live_type`] of each of `objs`, their headers read up to
    /// 1,024 to a call: a big namespace's values cost a few calls to the
    /// kernel, not one each. A header the kernel could not read ends its
    /// call there: that one is None, and the next call starts after it.
    pub(super) fn live_types(&self, objs: &[u64]) -> Vec<Option<u64>> {
        let mut out = vec![None; objs.len()];
        let plausible: Vec<usize> = (0..objs.len())
            .filter(|&i| user_addr(objs[i]) && objs[i].is_multiple_of(8))
            .collect();
        in_calls(&plausible, 1024, |chunk| {
            let mut bufs = vec![[0u8; 16]; chunk.len()];
            let mut parts: Vec<(u64, &mut [u8])> = chunk
                .iter()
                .zip(bufs.iter_mut())
                .map(|(&i, b)| (objs[i], b.as_mut_slice()))
                .collect();
            let whole = self.mem.read_many(&mut parts);
            for (k, &i) in chunk.iter().enumerate().take(whole) {
                out[i] = self.header_type(&bufs[k]);
            }
            whole
        });
        out
    }
}

/// Calls `read` on consecutive runs of `items`, `most` at a time; `read`
/// says how many leading ones it read, and the next call starts past the
/// first it could not (a read of many ranges stops at an unreadable one).
fn in_calls(items: &[usize], most: usize, mut read: impl FnMut(&[usize]) -> usize) {
    let mut rest = items;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(most)];
        let whole = read(chunk).min(chunk.len());
        let next = if whole < chunk.len() {
            whole + 1
        } else {
            whole
        };
        rest = &rest[next..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_calls_go_past_what_fails() {
        let items: Vec<usize> = (0..10).collect();
        let mut calls = Vec::new();
        // 4 is unreadable: a call holding it stops before it.
        in_calls(&items, 4, |c| {
            calls.push(c.to_vec());
            c.iter().take_while(|&&i| i != 4).count()
        });
        assert_eq!(
            calls,
            vec![
                vec![0, 1, 2, 3],
                vec![4, 5, 6, 7],
                vec![5, 6, 7, 8],
                vec![9]
            ]
        );
    }
}
