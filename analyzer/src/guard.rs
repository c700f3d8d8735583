//! NaN-safe number guards. Every figure in a stats file can be zero,
//! negative, NaN or infinite; these keep the model's arithmetic total.

/// `x > 0`, false for NaN.
pub(crate) fn positive(x: f64) -> bool {
    x > 0.0
}

/// `Some(x)` for a finite positive number.
pub(crate) fn finite_pos(x: f64) -> Option<f64> {
    (x.is_finite() && x > 0.0).then_some(x)
}
