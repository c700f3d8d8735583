use super::*;

fn prog(name: &str, uprobe: bool) -> ProgRef {
    ProgRef {
        id: 0,
        name: name.into(),
        uprobe,
        ret: false,
    }
}

const TRAPS: TrapCosts = TrapCosts {
    entry_ns: 700,
    ret_ns: 1_900,
};

#[test]
fn parts_are_the_differences_and_sum_to_the_share() {
    let progs = [
        prog("record_stop", true),
        prog("on_switch", false),
        prog("idle", true),
    ];
    let base = Reading {
        target_cpu_ns: 1_000_000_000,
        shim_ns: 0,
        probe_cpu_ns: 50_000_000,
        progs: vec![(100, 10_000), (1_000, 50_000), (7, 70)],
    };
    let now = Reading {
        target_cpu_ns: 11_000_000_000,
        shim_ns: 0,
        probe_cpu_ns: 60_000_000,
        progs: vec![(20_100, 2_010_000), (101_000, 5_050_000), (7, 70)],
    };
    let c = cost_between(&base, &now, &progs, TRAPS, 0.01);
    assert_eq!(c.target_cpu_ns, 10_000_000_000);
    assert_eq!(c.probe_cpu_ns, 10_000_000);
    // Both programs' run time; only the uprobe's runs are traps.
    assert_eq!(c.bpf_ns, 2_000_000 + 5_000_000);
    assert_eq!(c.trap_hits, 20_000);
    assert_eq!(c.trap_ns, 14_000_000);
    assert_eq!(c.trap_cost_ns, 700);
    assert_eq!((c.retprobe_hits, c.retprobe_cost_ns), (0, 1_900));
    // A program that did not run is not listed.
    let names: Vec<&str> = c.probes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["record_stop", "on_switch"]);
    let parts = (c.bpf_ns + c.trap_ns + c.probe_cpu_ns) as f64;
    assert!((c.target_share() * c.target_cpu_ns as f64 - parts).abs() < 1.0);
    assert!((c.target_share() - 0.0031).abs() < 1e-9);
}

/// An entry and return pair on one function (GetNext under `--mode
/// uprobes`): the entry runs cost an entry trap each, the return runs what
/// a return probe adds, not a second entry trap.
#[test]
fn return_probes_cost_their_own_figure() {
    let progs = [
        prog("getnext_enter", true),
        ProgRef {
            ret: true,
            ..prog("getnext_exit", true)
        },
        // A return probe that did not run counts no hit.
        ProgRef {
            ret: true,
            ..prog("libc_io_exit", true)
        },
    ];
    let base = Reading {
        target_cpu_ns: 0,
        shim_ns: 0,
        probe_cpu_ns: 0,
        progs: vec![(0, 0), (5, 50), (3, 30)],
    };
    let now = Reading {
        target_cpu_ns: 1_000_000_000,
        shim_ns: 0,
        probe_cpu_ns: 0,
        progs: vec![(1_000, 100_000), (1_005, 100_050), (3, 30)],
    };
    let c = cost_between(&base, &now, &progs, TRAPS, 0.01);
    assert_eq!((c.trap_hits, c.retprobe_hits), (2_000, 1_000));
    assert_eq!(c.trap_ns, 1_000 * 700 + 1_000 * 1_900);
    assert_eq!(c.retprobe_cost_ns, 1_900);
    assert_eq!(c.bpf_ns, 200_000);
    assert_eq!(c.total_ns(), 200_000 + 2_600_000);
}

#[test]
fn counters_that_go_back_count_nothing() {
    // A program reloaded (its counters restart) or a target CPU read that
    // went wrong must not give a huge unsigned difference.
    let progs = [prog("p", true)];
    let base = Reading {
        target_cpu_ns: 5,
        shim_ns: 5,
        probe_cpu_ns: 5,
        progs: vec![(10, 10)],
    };
    let now = Reading {
        target_cpu_ns: 4,
        shim_ns: 4,
        probe_cpu_ns: 4,
        progs: vec![(1, 1)],
    };
    let c = cost_between(&base, &now, &progs, TRAPS, 0.01);
    assert_eq!(c.total_ns(), 0);
    assert_eq!(c.target_share(), 0.0);
    assert!(c.probes.is_empty());
}

#[test]
fn over_budget_pulls_one_lever_per_span_then_warns() {
    let thin = Thin::default();
    let meter = Meter::shim(0.0001);
    {
        let mut s = meter.0.borrow_mut();
        s.opts.levers = vec![Lever::Windows, Lever::Sampling];
        s.opts.thin = thin.clone();
    }
    // The probe process burns more than 0.01% of the "target's" 1 ms a
    // poll.
    let burn = || (0..200_000u64).fold(0u64, |a, b| std::hint::black_box(a ^ b));
    let mut target = 0;
    let mut poll = |secs: u64, last: bool| {
        burn();
        target += 1_000_000;
        meter.on_poll(Some(target), None, Duration::from_secs(secs), last);
    };
    poll(0, false);
    // Before the mark, and before a span of rates: nothing is thinned.
    for secs in [1, 3, 5, 7, 9] {
        poll(secs, false);
        assert!(!thin.windows_stopped(), "at {secs} s");
    }
    poll(10, false);
    assert!(thin.windows_stopped() && !thin.sampling_stopped());
    // The next lever waits for a span after the first.
    poll(11, false);
    poll(14, false);
    assert!(!thin.sampling_stopped());
    // Nor is anything thinned at the last poll.
    poll(16, true);
    assert!(!thin.sampling_stopped());
    poll(16, false);
    assert!(thin.sampling_stopped());
    poll(17, true);
    let c = meter.finish().expect("two polls were read");
    assert_eq!(c.thinned.len(), 2);
    assert!(c.thinned[0].starts_with("attribution windows stopped at 10.0 s"));
    assert!(c.thinned[1].contains("flamegraphs cover only the time before"));
    assert!(c.target_share() > c.budget);
}

#[test]
fn a_steady_source_is_thinned_after_two_seconds() {
    // The DataLoader's pace: the rates from 1 s on, a lever once a second
    // of them says the budget will be passed.
    let thin = Thin::default();
    let meter = Meter::without_bpf(CostOpts {
        budget: 0.0001,
        levers: vec![Lever::StageSampler],
        thin: thin.clone(),
        explicit: None,
        duration: Some(Duration::from_secs(8)),
        pace: Pace::STEADY,
    });
    let burn = || (0..200_000u64).fold(0u64, |a, b| std::hint::black_box(a ^ b));
    let mut target = 0;
    for half in 0..=3u64 {
        burn();
        target += 500_000;
        meter.on_poll(Some(target), None, Duration::from_millis(500 * half), false);
        assert!(!thin.stages_slowed(), "at {} ms", 500 * half);
    }
    burn();
    meter.on_poll(Some(target + 500_000), None, Duration::from_secs(2), false);
    assert!(thin.stages_slowed());
    let c = meter.finish().expect("polls were read");
    assert!(c.thinned[0].starts_with("the stage sampler slowed to a quarter of its rate at 2.0 s"));
}

#[test]
fn the_projection_counts_what_is_paid_and_the_rest_at_the_recent_rate() {
    let at = |cost: u64, target: u64| ProbeCost {
        target_cpu_ns: target,
        probe_cpu_ns: cost,
        ..Default::default()
    };
    // The share a projection heads for.
    let share = |p: &mut Projection, c: &ProbeCost, since, duration| {
        p.heading(c, since, duration, Duration::from_secs(5))
            .map(|h| h.share)
    };
    let mut p = Projection::default();
    let s = Duration::from_secs;
    // Before the mark: no projection.
    assert_eq!(share(&mut p, &at(50, 2_000), s(2), Some(s(30))), None);
    // A costly start: 2% over the first 5 s.
    assert_eq!(share(&mut p, &at(100, 5_000), s(5), Some(s(30))), None);
    // Then 0.5%: 12 s into 30, the 18 s left at that rate.
    let got = share(&mut p, &at(135, 12_000), s(12), Some(s(30))).expect("a span");
    let want = (135.0 + 35.0 * 18.0 / 7.0) / (12_000.0 + 7_000.0 * 18.0 / 7.0);
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    assert!(got < 0.008 && (at(135, 12_000)).target_share() > 0.011);
    // Without a duration: the rate since the mark.
    let mut q = Projection::default();
    share(&mut q, &at(100, 5_000), s(5), None);
    let r = share(&mut q, &at(135, 12_000), s(12), None).expect("a span");
    assert!((r - 0.005).abs() < 1e-12);
}

#[test]
fn no_cost_without_two_polls_and_restart_forgets_the_baseline() {
    let meter = Meter::shim(0.01);
    assert!(meter.finish().is_none());
    meter.on_poll(Some(0), None, Duration::ZERO, false);
    assert!(meter.finish().is_none());
    meter.on_poll(Some(1_000_000_000), None, Duration::from_secs(1), false);
    let c = meter.finish().expect("two polls");
    assert_eq!(c.target_cpu_ns, 1_000_000_000);
    assert!(c.thinned.is_empty());
    meter.restart();
    assert!(meter.finish().is_none());
    // A poll whose target CPU was not read is skipped.
    meter.on_poll(None, None, Duration::ZERO, false);
    meter.on_poll(Some(7), None, Duration::ZERO, false);
    meter.on_poll(Some(9), None, Duration::ZERO, false);
    assert_eq!(meter.finish().map(|c| c.target_cpu_ns), Some(2));
}

#[test]
fn the_shims_time_is_a_part_of_the_share() {
    // `run`: the shim's cumulative hook time, as its difference.
    let meter = Meter::shim(0.01);
    meter.on_poll(Some(1_000_000_000), Some(4_000_000), Duration::ZERO, false);
    meter.on_poll(
        Some(3_000_000_000),
        Some(10_000_000),
        Duration::from_secs(1),
        false,
    );
    let c = meter.finish().expect("two polls");
    assert_eq!(c.shim_ns, 6_000_000);
    let parts = (c.bpf_ns + c.trap_ns + c.shim_ns + c.probe_cpu_ns) as f64;
    assert!((c.target_share() * c.target_cpu_ns as f64 - parts).abs() < 1.0);
    assert!(c.target_share() >= 0.003);
}

#[test]
fn the_next_window_is_weighed_before_it_comes() {
    let thin = Thin::default();
    let meter = Meter::without_bpf(CostOpts {
        budget: 0.01,
        levers: vec![Lever::Windows, Lever::Sampling],
        thin: thin.clone(),
        explicit: None,
        duration: Some(Duration::from_secs(30)),
        pace: Pace::AFTER_START_UP,
    });
    let s = meter.0.borrow();
    // 14 s in at 1.25 cores: 0.8 ms paid for each 100 ms of the target's
    // CPU since the mark, and 54 ms more, the window opened at the start.
    let c = ProbeCost {
        target_cpu_ns: 17_500_000_000,
        probe_cpu_ns: 140_000_000 + 54_000_000,
        ..Default::default()
    };
    let target_end = 37_500_000_000.0;
    let cost_end = c.total_ns() as f64 + 0.008 * (target_end - 17_500_000_000.0);
    let h = Heading {
        share: cost_end / target_end,
        ends: Some((cost_end, target_end)),
        rate: 0.008,
    };
    // No window due, or none opened yet: nothing to weigh.
    assert_eq!(s.with_next_window(&c, &h), None);
    thin.window_opened(true);
    let with = s.with_next_window(&c, &h).expect("a window is due");
    assert!(h.share < 0.01 && with > 0.01, "{} then {with}", h.share);
    let want = (cost_end + 54_000_000.0) / target_end;
    assert!((with - want).abs() < 1e-12, "{with} vs {want}");
    // Two opened: each took half of what was paid beyond the rate.
    thin.window_opened(true);
    let two = s.with_next_window(&c, &h).expect("a window is due");
    assert!((two - (cost_end + 27_000_000.0) / target_end).abs() < 1e-12);
    // The last window opened: none is due.
    thin.window_opened(false);
    assert_eq!(s.with_next_window(&c, &h), None);
}

#[test]
fn a_window_that_would_pass_the_budget_is_not_opened() {
    let thin = Thin::default();
    let meter = Meter::without_bpf(CostOpts {
        budget: 0.0001,
        levers: vec![Lever::Sampling, Lever::Windows],
        thin: thin.clone(),
        explicit: None,
        duration: Some(Duration::from_secs(30)),
        pace: Pace::AFTER_START_UP,
    });
    thin.window_opened(true);
    {
        let mut s = meter.0.borrow_mut();
        s.stop_windows(0.02, Duration::from_secs(11));
        assert_eq!(s.opts.levers, [Lever::Sampling]);
    }
    assert!(thin.windows_stopped() && !thin.sampling_stopped());
    let s = meter.0.borrow();
    assert!(s.notes[0].starts_with("attribution windows stopped at 11.0 s"));
}
