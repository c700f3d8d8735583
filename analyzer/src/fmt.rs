//! Number formatting shared by the text, DOT and SVG renderers: about three
//! significant digits, never "NaN".

/// A number with about three significant digits.
pub fn num(x: f64) -> String {
    if x.is_nan() {
        return "n/a".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "∞".into() } else { "-∞".into() };
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e15 {
        format!("{x:.3e}")
    } else if a >= 100.0 {
        fixed(x, 0)
    } else if a >= 10.0 {
        fixed(x, 1)
    } else if a >= 1.0 {
        fixed(x, 2)
    } else if a >= 0.001 {
        fixed(x, 3)
    } else {
        format!("{x:.1e}")
    }
}

/// `x` with `d` decimals, through integers: the renderers format hundreds of
/// thousands of numbers for a large pipeline and `{:.N}` on floats is slow.
/// Rounds half away from zero; callers keep |x| < 1e15.
fn fixed(x: f64, d: u32) -> String {
    let m = 10u64.pow(d);
    let v = (x.abs() * m as f64).round() as u64;
    let sign = if x < 0.0 && v != 0 { "-" } else { "" };
    if d == 0 {
        format!("{sign}{v}")
    } else {
        format!("{sign}{}.{:0w$}", v / m, v % m, w = d as usize)
    }
}

/// A rate in root elements per second; None is unbounded.
pub fn rate(x: Option<f64>) -> String {
    match x {
        Some(r) if r.is_finite() => format!("{}/s", num(r)),
        _ => "unbounded".into(),
    }
}

/// A parallelism or core count: an integer when it is one.
pub fn count(x: f64) -> String {
    if x.is_finite() && (x - x.round()).abs() < 1e-9 && x.abs() < 1e15 {
        format!("{}", x.round() as i64)
    } else {
        num(x)
    }
}

/// A large count: `1.31 M` above a million.
pub fn big(x: f64) -> String {
    if x.is_finite() && x.abs() >= 1e6 {
        format!("{} M", num(x / 1e6))
    } else {
        count(x.round())
    }
}

/// Bytes in decimal units (kB, MB, GB, TB).
pub fn bytes(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let units = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (u, f) in units {
        if x.abs() >= f {
            return format!("{} {u}", num(x / f));
        }
    }
    format!("{} B", num(x))
}

/// A duration in s, ms or µs (and ns below a microsecond when
/// `ns_below_us`, else fractions of a µs); "0" for none.
pub fn duration(ns: f64, ns_below_us: bool) -> String {
    if ns <= 0.0 {
        "0".into()
    } else if ns >= 1e9 {
        format!("{} s", num(ns / 1e9))
    } else if ns >= 1e6 {
        format!("{} ms", num(ns / 1e6))
    } else if ns >= 1e3 || !ns_below_us {
        format!("{} µs", num(ns / 1e3))
    } else {
        format!("{ns} ns")
    }
}

/// A fraction as a percentage.
pub fn pct(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let p = x * 100.0;
    if p.abs() >= 10.0 || p == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(num(45.58), "45.6");
        assert_eq!(num(6.25), "6.25");
        assert_eq!(num(2000.0), "2000");
        assert_eq!(num(0.456), "0.456");
        assert_eq!(num(f64::NAN), "n/a");
        assert_eq!(num(-2.5), "-2.50");
        assert_eq!(num(0.0004), "4.0e-4");
        assert_eq!(num(99.96), "100.0");
        assert_eq!(num(1e20), "1.000e20");
        assert_eq!(rate(None), "unbounded");
        assert_eq!(count(8.0), "8");
        assert_eq!(count(7.29), "7.29");
        assert_eq!(bytes(135.168e9), "135 GB");
        assert_eq!(bytes(14.08e6), "14.1 MB");
        assert_eq!(pct(0.219), "22%");
    }
}
