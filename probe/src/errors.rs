//! How an error reaches the user: one line, and whether it was bad input
//! (exit status 2) or a failure (exit status 1). Every layer may use it.

use plumber_collector::statsfile;

use crate::target::TargetError;

/// Bad input from the user (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub fn usage(msg: String) -> anyhow::Error {
    UsageError(msg).into()
}

/// An error and its causes on one line, as `{:#}` joins them, less each
/// cause whose text the link above it already shows: the library errors
/// name their `source` in their own message (so that they read whole in a
/// log line), and would otherwise print it twice ("...: No such file or
/// directory (os error 2): No such file or directory (os error 2)").
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    let mut above = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line.push_str(&text);
        } else if !above.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        above = text;
    }
    line
}

pub fn is_usage_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<UsageError>()
            || c.is::<statsfile::StatsError>()
            || c.downcast_ref::<plumber_analyzer::AnalyzeError>()
                .is_some_and(|a| a.exit_code() == 2)
            || matches!(
                c.downcast_ref::<TargetError>(),
                Some(TargetError::NoSuchProcess(_) | TargetError::NoFramework { .. })
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn one_line_shows_a_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(statsfile::StatsError::Read {
            path: PathBuf::from("/x/stats.pb"),
            source: io,
        });
        assert_eq!(one_line(&e), "/x/stats.pb: cannot read: no such file");
    }

    #[test]
    fn one_line_keeps_context_and_causes_not_shown_above() {
        let e = anyhow::Error::new(std::io::Error::other("disk full"))
            .context("writing stats.pb")
            .context("saving the recording");
        assert_eq!(
            one_line(&e),
            "saving the recording: writing stats.pb: disk full"
        );
    }
}
