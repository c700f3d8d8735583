//! Line numbers from a code object's line table, for a byte offset into
//! its bytecode: the three formats CPython has used, as its own
//! `PyCode_Addr2Line` reads them (Objects/codeobject.c of each version).

/// 3.9's `co_lnotab`: (address increment, signed line increment) pairs.
pub fn lnotab(table: &[u8], firstlineno: i32, addr: i64) -> i32 {
    let mut line = firstlineno;
    let mut at: i64 = 0;
    for pair in table.chunks_exact(2) {
        at += i64::from(pair[0]);
        if at > addr {
            break;
        }
        line += i32::from(pair[1] as i8);
    }
    line
}

/// 3.10's `co_linetable`: (byte length, signed line delta) pairs, a delta
/// of -128 meaning "no line". None where the table has no line.
pub fn linetable_310(table: &[u8], firstlineno: i32, addr: i64) -> Option<i32> {
    if addr < 0 {
        return Some(firstlineno);
    }
    let mut line = firstlineno;
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line += i32::from(delta);
            Some(line)
        };
        if start <= addr && addr < end {
            return here;
        }
    }
    None
}

/// 3.11+'s location table: entries whose first byte has bit 7 set, bits
/// 3-6 a kind and 0-2 the length in code units less one; the line delta
/// in the kind (one-line forms) or a signed varint (long and no-column
/// forms). None where the table has no line.
pub fn locations_311(table: &[u8], firstlineno: i32, addr: i64) -> Option<i32> {
    let mut line = firstlineno;
    let mut end: i64 = 0;
    let mut i = 0;
    while i < table.len() {
        let head = table[i];
        let kind = (head >> 3) & 15;
        let delta = match kind {
            13 | 14 => signed_varint(table.get(i + 1..).unwrap_or(&[])),
            10..=12 => i32::from(kind - 10),
            _ => 0,
        };
        line += delta;
        let start = end;
        end += (i64::from(head & 7) + 1) * 2;
        if start <= addr && addr < end {
            return (kind != 15).then_some(line);
        }
        i += 1;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

fn varint(b: &[u8]) -> u32 {
    let mut val: u32 = 0;
    let mut shift = 0;
    for &read in b {
        val |= u32::from(read & 63).checked_shl(shift).unwrap_or(0);
        if read & 64 == 0 {
            break;
        }
        shift += 6;
    }
    val
}

fn signed_varint(b: &[u8]) -> i32 {
    let u = varint(b);
    if u & 1 != 0 {
        -((u >> 1) as i32)
    } else {
        (u >> 1) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_pairs() {
        // Lines 10, 11 from byte 6, 13 from byte 20.
        let t = [6u8, 1, 14, 2];
        assert_eq!(lnotab(&t, 10, 0), 10);
        assert_eq!(lnotab(&t, 10, 6), 11);
        assert_eq!(lnotab(&t, 10, 19), 11);
        assert_eq!(lnotab(&t, 10, 20), 13);
        // A negative delta (a loop's condition above its body).
        let t = [4u8, 3, 4, 0xfe];
        assert_eq!(lnotab(&t, 1, 9), 2);
    }

    #[test]
    fn linetable_pairs() {
        // [0,4) line 5 (+0 from 5), [4,10) line 7, [10,12) none.
        let t = [4u8, 0, 6, 2, 2, 0x80];
        assert_eq!(linetable_310(&t, 5, 2), Some(5));
        assert_eq!(linetable_310(&t, 5, 4), Some(7));
        assert_eq!(linetable_310(&t, 5, 11), None);
        assert_eq!(linetable_310(&t, 5, 40), None);
    }

    #[test]
    fn location_entries() {
        // Entry 1: one-line form +1 (kind 11), 2 units, 2 column bytes.
        // Entry 2: no-column form (13), 1 unit, delta -1 (varint 3).
        // Entry 3: long form (14), 3 units, delta +70 (varint 140 = 12 | 64, 2),
        //          then end-line delta, columns.
        // Entry 4: no location (15), 1 unit.
        let t = [
            0x80 | 11 << 3 | 1,
            4,
            9,
            0x80 | 13 << 3,
            3,
            0x80 | 14 << 3 | 2,
            12 | 64,
            2,
            0,
            1,
            1,
            0x80 | 15 << 3,
        ];
        assert_eq!(locations_311(&t, 100, 0), Some(101));
        assert_eq!(locations_311(&t, 100, 3), Some(101));
        assert_eq!(locations_311(&t, 100, 4), Some(100));
        assert_eq!(locations_311(&t, 100, 6), Some(170));
        assert_eq!(locations_311(&t, 100, 11), Some(170));
        assert_eq!(locations_311(&t, 100, 12), None);
        assert_eq!(locations_311(&t, 100, 99), None);
    }
}
