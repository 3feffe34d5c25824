//! The chaos run: text and audio calls on the conformance agent while the simulated Sent drops, closes and
//! drains connections, refuses resumes (`connection_full`, `resume_failed`) and holds up resume answers at
//! random (`sentsim::chaos`). Every call is checked from Sent's record, and both sides must agree on which
//! calls ended and which were lost.
//!
//! The short run is part of `cargo test`. `scripts/chaos` runs the long one (200 calls, about 10 minutes);
//! `CHAOS_SEED`, `CHAOS_CALLS`, `CHAOS_AT_ONCE`, `CHAOS_LINES`, `CHAOS_LINE_MS` and `CHAOS_CONNECTIONS` change
//! the run.

use sentsim::chaos::{self, ChaosPlan};
use sentsim::SimConfig;
use std::time::Duration;
use voicehost::agent::CallRules;
use voicehost_testkit::{guest, Host};

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_sent_dropping_draining_and_refusing_at_random_with_nothing_lost_or_doubled()
{
    let seed = env("CHAOS_SEED").unwrap_or_else(|| fastrand::u64(..));
    let mut plan = ChaosPlan::short(seed);
    plan.calls = env("CHAOS_CALLS").unwrap_or(plan.calls);
    plan.at_once = env("CHAOS_AT_ONCE").unwrap_or(plan.at_once);
    plan.lines = env("CHAOS_LINES").unwrap_or(plan.lines);
    plan.line_every = env("CHAOS_LINE_MS").map_or(plan.line_every, Duration::from_millis);
    let sim = SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    };
    let connections = env("CHAOS_CONNECTIONS").unwrap_or(2);
    let host = Host::serve_with(
        &guest("conformance"),
        CallRules::default(),
        connections,
        sim,
    )
    .await;

    let report = chaos::run(&host.sim, sentsim::sim::CONFORMANCE_AGENT, &plan)
        .await
        .unwrap_or_else(|e| panic!("seed {seed} (CHAOS_SEED={seed}): {e:#}"));
    println!("chaos: {report}");

    // Both sides agree on how every call finished (the host counts a call once it has heard its end).
    // (A call still detached is lost once its resume window, 15 s, has passed.) A call whose start a fault
    // cut off before the host heard it is Sent's alone.
    let heard = (report.calls - report.start_unheard) as u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let stats = host.stats.clone();
    while stats.sessions_ended.get() + stats.sessions_lost.get() < heard {
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: {stats}\n{report}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        stats.sessions_started.get(),
        heard,
        "seed {seed}: {stats}\n{report}"
    );
    // A call whose end never reached the host (the caller ended it while it was detached, or after the
    // host gave it up) is one the host, never hearing its end, counts lost.
    assert_eq!(
        stats.sessions_lost.get(),
        (report.lost - report.start_unheard + report.ended_unheard) as u64,
        "seed {seed}: {stats}\n{report}"
    );
    assert_eq!(
        stats.sessions_ended.get(),
        (report.ended - report.ended_unheard) as u64,
        "seed {seed}: {stats}\n{report}"
    );
    assert_eq!(stats.traps(), 0, "seed {seed}: {stats}");
    host.finish().await;
}
