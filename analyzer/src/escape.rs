//! Escaping text for the SVG renders and report.html: one escaper, so a
//! name from the target reads the same (and is as safe) in both.

/// Appends `s` escaped for XML and HTML text and attribute values: the
/// markup characters as entities (`&#39;` for the apostrophe: XML and HTML
/// both know it), control characters dropped, but for tabs and newlines
/// when `keep_lines` (text shown in a `<pre>`).
pub(crate) fn push_escaped(o: &mut String, s: &str, keep_lines: bool) {
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            '\t' | '\n' if keep_lines => o.push(ch),
            c if c.is_control() => {}
            c => o.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_control_characters() {
        let mut o = String::new();
        push_escaped(&mut o, "<a href='x'>&\"\u{1}\n", false);
        assert_eq!(o, "&lt;a href=&#39;x&#39;&gt;&amp;&quot;");
        let mut o = String::new();
        push_escaped(&mut o, "a\tb\nc\u{7}", true);
        assert_eq!(o, "a\tb\nc");
    }
}
