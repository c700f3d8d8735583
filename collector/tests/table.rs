//! Golden tests of the end-of-recording table. Regenerate the expected files
//! with `PLUMBER_BLESS=1 cargo test -p plumber-collector --test table`.
mod common;

use std::path::PathBuf;

use common::*;
use plumber_collector::collect;
use plumber_collector::event::Event;

fn check_golden(name: &str, events: Vec<Event>) {
    let got = collect(events).unwrap().table();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("PLUMBER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with PLUMBER_BLESS=1 to create it)",
            path.display()
        )
    });
    assert!(
        got == want,
        "table differs from {} (PLUMBER_BLESS=1 regenerates it)\n--- got\n{got}--- want\n{want}",
        path.display()
    );
}

#[test]
fn chain_table() {
    check_golden("table_chain.txt", chain_events());
}

#[test]
fn flatmap_table() {
    check_golden("table_flatmap.txt", flatmap_events());
}

/// With thread data: CPU, I/O, lock and GIL columns, the CPU balance and
/// the top files.
#[test]
fn usage_table() {
    check_golden("table_usage.txt", usage_events());
}

#[test]
fn table_is_deterministic() {
    let a = collect(flatmap_events()).unwrap().table();
    for _ in 0..5 {
        assert_eq!(collect(flatmap_events()).unwrap().table(), a);
    }
}
