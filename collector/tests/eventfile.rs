mod common;

use common::*;
use plumber_collector::collect;
use plumber_collector::eventfile::{
    read_events, read_events_from, write_events, EventFileError, EventWriter,
};

#[test]
fn event_file_round_trip_and_collect() {
    let dir = scratch_dir("eventfile");
    let path = dir.join("events.jsonl");
    let events = flatmap_events();
    write_events(&path, &events).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), events.len());
    assert!(text.lines().next().unwrap().contains("\"kind\":\"target\""));
    let back = read_events(&path).unwrap();
    assert_eq!(back, events);
    assert_eq!(collect(back).unwrap(), collect(events).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn usage_events_round_trip() {
    // Threads, Attribution, Io and LockSites lines replay to the same result.
    let dir = scratch_dir("eventfile_usage");
    let path = dir.join("events.jsonl");
    let events = usage_events();
    write_events(&path, &events).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    for kind in ["threads", "attribution", "io", "lock_sites"] {
        assert!(
            text.contains(&format!("\"kind\":\"{kind}\"")),
            "{kind} missing"
        );
    }
    let back = read_events(&path).unwrap();
    assert_eq!(back, events);
    let (a, b) = (collect(back).unwrap(), collect(events).unwrap());
    assert!(a.window.has_thread_data());
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn events_without_the_newer_fields_parse() {
    // Older writers omit `waits`, `exited`, `size` and the session counts.
    let lines = concat!(
        r#"{"kind":"threads","mono_ns":5,"threads":[{"tid":1,"name":"python3","cpu_ns":10}]}"#,
        "\n",
        r#"{"kind":"io","mono_ns":6,"files":[{"path":"/f","op_path":"","tid":1,"bytes_read":1,"reads":1,"opens":0,"read_ns":2}]}"#,
        "\n",
    );
    let evs = read_events_from(lines.as_bytes(), "mem").unwrap();
    assert_eq!(evs.len(), 2);
}

#[test]
fn node_ratio_and_buffer_size_are_optional() {
    let line = |extra: &str| {
        format!(
            r#"{{"kind":"poll","mono_ns":1,"wall_ns":1,"process_cpu_ns":0,"nodes":[{{"addr":16,"id":1,"name":"BatchV2","path":"Root::BatchV2","parent":null,"counters":{{"num_elements":1,"bytes_produced":0,"bytes_consumed":0,"processing_time_ns":0,"buffered_elements":0,"buffered_bytes":0}}{extra}}}]}}"#
        )
    };
    let node = |text: String| match read_events_from(text.as_bytes(), "mem").unwrap().remove(0) {
        plumber_collector::event::Event::Poll(mut p) => p.nodes.remove(0),
        other => panic!("not a poll: {other:?}"),
    };
    let old = node(line(""));
    assert_eq!((old.ratio, old.buffer_size), (None, None));
    let new = node(line(r#","ratio":16.0,"buffer_size":2.0"#));
    assert_eq!((new.ratio, new.buffer_size), (Some(16.0), Some(2.0)));
    // Unknown values are not written, so older readers see what they know.
    let text = serde_json::to_string(&old).unwrap();
    assert!(!text.contains("ratio") && !text.contains("buffer_size"));
}

#[test]
fn streaming_writer_and_blank_lines() {
    let mut w = EventWriter::new(Vec::new(), "mem");
    for e in chain_events() {
        w.write(&e).unwrap();
    }
    w.flush().unwrap();
    let mut bytes = w.into_inner();
    bytes.extend_from_slice(b"\n   \n");
    assert_eq!(
        read_events_from(bytes.as_slice(), "mem").unwrap(),
        chain_events()
    );
}

#[test]
fn bad_line_names_the_line() {
    let dir = scratch_dir("badline");
    let path = dir.join("events.jsonl");
    let good = serde_json::to_string(&end(false, "x")).unwrap();
    std::fs::write(
        &path,
        format!("{good}\n{{\"kind\":\"poll\",\"mono_ns\":\n{good}\n"),
    )
    .unwrap();
    let e = read_events(&path).unwrap_err();
    assert!(matches!(e, EventFileError::Parse { line: 2, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("line 2") && msg.contains("events.jsonl"),
        "{msg}"
    );

    std::fs::write(&path, format!("{good}\n{{\"kind\":\"nonsense\"}}\n")).unwrap();
    assert!(matches!(
        read_events(&path),
        Err(EventFileError::Parse { line: 2, .. })
    ));

    let missing = read_events(dir.join("missing.jsonl")).unwrap_err();
    assert!(matches!(missing, EventFileError::Open { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}
