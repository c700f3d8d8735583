//! Colours by op: every frame takes the hue of its root frame (`[op]`), a
//! shade picked from its own name; GIL frames in magenta; Python frames
//! (`function (file.py:line)`) in a dark blue of their own.
//!
//! inferno colours a frame from its name alone (its palette map is keyed by
//! function name), and the same function (`memcpy`) appears under several
//! ops, so the hue of a tower cannot be chosen through inferno's options.
//! Instead the SVG inferno wrote is recoloured: each frame's `<rect>`
//! carries its sample offset and width (`fg:x`, `fg:w`) and its row (`y`),
//! which place it under exactly one root frame (the row above "all").
//!
//! Hues are stable across graphs and runs: common tf.data op families have
//! a fixed hue, other names get one from an FNV hash (not std's
//! randomly-seeded hasher) of the op name.

use std::ops::Range;

use plumber_collector::stacks::{is_gil_frame, is_python_frame, OUTSIDE_PIPELINE};

use super::FlameOptions;

/// Twelve hues (degrees) far enough apart to tell towers apart; none in
/// 290..340, kept for the GIL.
const HUES: [f64; 12] = [
    0.0, 28.0, 45.0, 58.0, 85.0, 125.0, 165.0, 188.0, 205.0, 228.0, 250.0, 272.0,
];

/// Fixed hues (indices into [`HUES`]) of common op families, so a typical
/// pipeline's ops never share one.
const KNOWN: &[(&str, usize)] = &[
    ("Shuffle", 0),
    ("ShuffleAndRepeat", 0),
    ("Batch", 1),
    ("PaddedBatch", 1),
    ("ParallelBatch", 1),
    ("MapAndBatch", 1),
    ("Zip", 2),
    ("Take", 2),
    ("Skip", 2),
    ("TFRecord", 3),
    ("TextLine", 3),
    ("FixedLengthRecord", 3),
    ("Repeat", 4),
    ("Prefetch", 5),
    ("ParallelInterleave", 6),
    ("Interleave", 6),
    ("FlatMap", 6),
    ("TensorSlice", 7),
    ("Range", 7),
    ("Generator", 7),
    ("ParallelMap", 8),
    ("Map", 9),
    ("Root", 9),
    ("Cache", 10),
    ("Snapshot", 10),
    ("Filter", 11),
    ("Unbatch", 11),
];

const GIL: Rgb = Rgb(230, 30, 180);

/// Python frames: a dark blue, shaded by name, darker than any op's
/// (pastel) frames whatever their hue, so the Python part of a tower
/// stands out in every graph.
fn python_colour(name: &str) -> Rgb {
    let (a, _) = unit_pair(name);
    hsl(212.0, 0.55, 0.40 + 0.10 * a)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rgb(pub u8, pub u8, pub u8);

impl std::fmt::Display for Rgb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rgb({},{},{})", self.0, self.1, self.2)
    }
}

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Two numbers in [0, 1) from a name.
fn unit_pair(name: &str) -> (f64, f64) {
    let h = fnv1a(name);
    (
        (h & 0xffff) as f64 / 65536.0,
        ((h >> 16) & 0xffff) as f64 / 65536.0,
    )
}

/// `ParallelMapDatasetV2` / `ParallelMapV2` → `ParallelMap`.
fn family(op: &str) -> &str {
    let op = op.strip_suffix("Dataset").unwrap_or(op);
    let trimmed = op.trim_end_matches(|c: char| c.is_ascii_digit());
    match trimmed.strip_suffix('V') {
        Some(base) if trimmed.len() < op.len() && !base.is_empty() => {
            base.strip_suffix("Dataset").unwrap_or(base)
        }
        _ => op,
    }
}

/// The hue of a root frame (`[ParallelMapV2]`); `None` for
/// `[outside pipeline]` (greys).
pub(super) fn op_hue(root: &str) -> Option<f64> {
    if root == OUTSIDE_PIPELINE {
        return None;
    }
    let name = root
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(root);
    let fam = family(name);
    let i = KNOWN
        .iter()
        .find(|(k, _)| *k == fam)
        .map(|(_, i)| *i)
        .unwrap_or_else(|| (fnv1a(fam) % HUES.len() as u64) as usize);
    Some(HUES[i])
}

fn hsl(h: f64, s: f64, l: f64) -> Rgb {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = (h.rem_euclid(360.0)) / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    Rgb(to(r), to(g), to(b))
}

/// The colour of a frame under the root of hue `hue` (`None`: greys).
pub(super) fn frame_colour(hue: Option<f64>, name: &str, is_root: bool) -> Rgb {
    let (a, b) = unit_pair(name);
    match (hue, is_root) {
        (Some(h), true) => hsl(h, 0.70, 0.42),
        (Some(h), false) => hsl(h, 0.50 + 0.25 * a, 0.55 + 0.17 * b),
        (None, true) => hsl(0.0, 0.0, 0.50),
        (None, false) => hsl(0.0, 0.0, 0.64 + 0.16 * b),
    }
}

/// One frame of inferno's SVG.
struct FrameRect {
    /// Byte range of the `fill` attribute's value.
    fill: Range<usize>,
    x: u64,
    w: u64,
    y: i64,
    name: String,
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<(usize, &'a str)> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let len = tag[start..].find('"')?;
    Some((start, &tag[start..start + len]))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The frames of inferno's SVG: each is `<g><title>NAME (N unit, P%)</title>
/// <rect x=".." y=".." ... fill="rgb(..)" fg:x=".." fg:w=".."/>...</g>`
/// inside `<svg id="frames">`. `None` if the SVG is not laid out that way.
fn scan(svg: &str) -> Option<Vec<FrameRect>> {
    let mut pos = svg.find("<svg id=\"frames\"")?;
    let mut frames = Vec::new();
    while let Some(t) = svg[pos..].find("<title>") {
        let t0 = pos + t + "<title>".len();
        let t1 = t0 + svg[t0..].find("</title>")?;
        let title = &svg[t0..t1];
        let r0 = t1 + svg[t1..].find("<rect ")?;
        let r1 = r0 + svg[r0..].find("/>")?;
        let tag = &svg[r0..r1];
        let (fill_at, fill) = attr(tag, "fill")?;
        let x = attr(tag, "fg:x")?.1.parse().ok()?;
        let w = attr(tag, "fg:w")?.1.parse().ok()?;
        let y = attr(tag, "y")?.1.parse().ok()?;
        let name = match title.rfind(" (") {
            Some(i) => unescape(&title[..i]),
            None => unescape(title),
        };
        frames.push(FrameRect {
            fill: r0 + fill_at..r0 + fill_at + fill.len(),
            x,
            w,
            y,
            name,
        });
        pos = r1;
    }
    Some(frames)
}

/// The SVG with its frames recoloured by op and/or GIL frames highlighted;
/// unchanged (with a warning) if its layout is not the one expected.
pub(super) fn recolour(svg: &str, opts: &FlameOptions) -> String {
    let Some(frames) = scan(svg) else {
        tracing::warn!("flamegraph: unexpected SVG layout, colours left as inferno drew them");
        return svg.to_string();
    };
    // Rows: the bottom one (largest y) is "all", the next the root frames.
    let mut rows: Vec<i64> = frames.iter().map(|f| f.y).collect();
    rows.sort_unstable_by(|a, b| b.cmp(a));
    rows.dedup();
    let all_row = rows.first().copied();
    let root_row = rows.get(1).copied();
    let mut roots: Vec<(u64, u64, Option<f64>)> = frames
        .iter()
        .filter(|f| Some(f.y) == root_row)
        .map(|f| (f.x, f.x + f.w, op_hue(&f.name)))
        .collect();
    roots.sort_unstable_by_key(|r| r.0);

    let mut out = String::with_capacity(svg.len());
    let mut last = 0;
    for f in &frames {
        if Some(f.y) == all_row {
            continue;
        }
        let colour = if opts.highlight_gil && is_gil_frame(&f.name) {
            Some(GIL)
        } else if is_python_frame(&f.name) {
            Some(python_colour(&f.name))
        } else if opts.colors_by_op {
            // The root whose range holds this frame's start.
            let i = roots.partition_point(|r| r.0 <= f.x);
            i.checked_sub(1)
                .and_then(|i| roots.get(i))
                .filter(|r| f.x < r.1)
                .map(|r| frame_colour(r.2, &f.name, Some(f.y) == root_row))
        } else {
            None
        };
        if let Some(c) = colour {
            out.push_str(&svg[last..f.fill.start]);
            out.push_str(&c.to_string());
            last = f.fill.end;
        }
    }
    out.push_str(&svg[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        assert_eq!(family("ParallelMapV2"), "ParallelMap");
        assert_eq!(family("ParallelMapDatasetV2"), "ParallelMap");
        assert_eq!(family("BatchV2"), "Batch");
        assert_eq!(family("ParallelInterleaveV4"), "ParallelInterleave");
        assert_eq!(family("TFRecord"), "TFRecord");
        assert_eq!(family("PrefetchDataset"), "Prefetch");
        assert_eq!(family("V2"), "V2");
        assert_eq!(family("Dev"), "Dev");
    }

    #[test]
    fn hues_are_stable_and_distinct_for_a_typical_pipeline() {
        let ops = [
            "[TFRecord]",
            "[ParallelMapV2]",
            "[BatchV2]",
            "[Prefetch]",
            "[ShuffleDatasetV3]",
            "[Map]",
        ];
        let hues: Vec<f64> = ops.iter().filter_map(|o| op_hue(o)).collect();
        assert_eq!(hues.len(), ops.len());
        for (i, a) in hues.iter().enumerate() {
            for b in &hues[i + 1..] {
                assert!(a != b, "{hues:?}");
            }
        }
        assert_eq!(op_hue("[ParallelMapV2]"), op_hue("[ParallelMapDatasetV2]"));
        assert_eq!(op_hue(OUTSIDE_PIPELINE), None);
        // Unknown ops: from the FNV hash, never the GIL's magenta.
        let h = op_hue("[SomeCustomOp]").expect("hue");
        assert!(!(290.0..340.0).contains(&h));
        assert_eq!(Some(h), op_hue("[SomeCustomOp]"));
    }

    #[test]
    fn python_frames_have_their_own_colour() {
        let p = python_colour("slow_fn (train.py:42)");
        assert_eq!(p, python_colour("slow_fn (train.py:42)"));
        // Darker than every op frame's shade, and not the GIL's.
        let lum = |c: Rgb| u32::from(c.0) + u32::from(c.1) + u32::from(c.2);
        for root in ["[ParallelMapV2]", "[TFRecord]", "[Range]", "[BatchV2]"] {
            let op = frame_colour(op_hue(root), "slow_fn (train.py:42)", false);
            assert!(lum(p) < lum(op), "{p} vs {op}");
        }
        assert_ne!(p, GIL);
    }

    #[test]
    fn hsl_corners() {
        assert_eq!(hsl(0.0, 1.0, 0.5), Rgb(255, 0, 0));
        assert_eq!(hsl(120.0, 1.0, 0.5), Rgb(0, 255, 0));
        assert_eq!(hsl(240.0, 1.0, 0.5), Rgb(0, 0, 255));
        assert_eq!(hsl(0.0, 0.0, 0.5), Rgb(128, 128, 128));
    }
}
