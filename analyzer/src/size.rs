//! Parsing `--memory SIZE` style figures: `64G`, `64GiB`, `1.5T`, `512M`,
//! `123456` (bytes). Decimal suffixes (k, M, G, T) are powers of 1000, `i`
//! suffixes (KiB, MiB, GiB, TiB) powers of 1024.

use crate::error::AnalyzeError;

pub fn parse_size(s: &str) -> Result<u64, AnalyzeError> {
    let bad = || {
        AnalyzeError::InvalidOverride(format!(
            "size {s:?}: expected a number with an optional unit (e.g. 64G, 512MiB)"
        ))
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let mult = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        "ki" => 1024.0,
        "mi" => 1024.0 * 1024.0,
        "gi" => 1024.0 * 1024.0 * 1024.0,
        "ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let v = x * mult;
    if !v.is_finite() || v < 1.0 || v >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64G").unwrap(), 64_000_000_000);
        assert_eq!(parse_size("64GiB").unwrap(), 64 << 30);
        assert_eq!(parse_size("1.5T").unwrap(), 1_500_000_000_000);
        assert_eq!(parse_size("512 MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-5G").is_err());
    }
}
