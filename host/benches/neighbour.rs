//! A call beside an attacker on the same connection: `cargo bench -p voicehost --bench neighbour`.
//!
//! The Sent simulator and voicehost (one connection, the `prober` test guest) run in this process. A
//! neighbour call sends paced 20 ms frames at 16 kHz and measures each echo's latency (the recorder's
//! timestamps: frame queued for the socket → echo read back). It runs three times, side by side in one
//! run: alone; beside a call whose guest answers every caller frame with `FLOOD` × 20 ms of audio (one
//! `send-audio` each); with one `send-audio` of 10 s; by spinning the CPU for 150 ms; by logging 1000
//! lines; and by keeping 1 MiB more (until its memory cap traps it, three times, and the failure policy
//! hangs it up). The process's RSS is sampled every 50 ms during each run: its peak says what the attack
//! cost.

use anyhow::{anyhow, Context as _, Result};
use sentsim::sim::{CONFORMANCE_AGENT, CONFORMANCE_KEY};
use sentsim::{Sim, SimConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use voicehost::agent::Dial;
use voicehost::agent::{self, AgentConfig, CallRules};
use voicehost::sandbox::Sandbox;
use voicehost::stats::Stats;
use voicehost_testkit::{
    audio_frame as frame, echo_latencies, paced_frames, prober_call, quantile,
};

/// Paced frames of the neighbour per run (8 s of audio).
const FRAMES: usize = 400;
/// Audio messages the flooder sends per caller frame (each 20 ms).
const FLOOD: usize = 2_000;

fn main() -> Result<()> {
    // The log as `voicehost serve` sets it up: the `log 1000` attacker's passed lines are written.
    voicehost::logging::init(voicehost::logging::DEFAULT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let wasm = std::fs::read(voicehost_test_programs::PROBER)
        .context("the prober component (built by voicehost-test-programs)")?;
    let sandbox = Sandbox::new()?;
    let code = sandbox.load(&wasm)?;
    let mut rows = Vec::new();
    for (attackers, attack) in [
        (0, None),
        (1, Some(format!("flood {FLOOD}"))),
        (1, Some("big 10000".to_string())),
        // 150 ms of CPU for every 20 ms frame: one core kept busy, never past its deadline.
        (1, Some("spin 150".to_string())),
        // Four of them: more than both cores' worth of guest work (issue 24's measure).
        (4, Some("spin 150".to_string())),
        (1, Some("log 1000".to_string())),
        // 1 MiB kept per frame: the memory cap traps it within a second, three times, then the hangup.
        (1, Some("grow 1024".to_string())),
    ] {
        let row = runtime.block_on(run(&code, attackers, attack.clone()))?;
        rows.push((attackers, attack, row));
    }
    println!(
        "| neighbour beside | echoes | p50 | p99 | max | peak RSS | attacker's audio messages written | dropped by the host |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let alone = rows[0].2.p50;
    for (attackers, attack, row) in &rows {
        println!(
            "| {} | {}/{} | {:.2} ms ({:.1}×) | {:.2} ms | {:.2} ms | {} MiB | {} | {} |",
            attack
                .as_deref()
                .map_or("nothing (alone)".to_string(), |a| match attackers {
                    1 => format!("`{a}`"),
                    n => format!("{n} × `{a}`"),
                }),
            row.echoes,
            FRAMES,
            ms(row.p50),
            row.p50.as_secs_f64() / alone.as_secs_f64().max(1e-9),
            ms(row.p99),
            ms(row.max),
            row.peak_rss >> 20,
            row.attacker_audio,
            row.dropped,
        );
    }
    Ok(())
}

struct Row {
    echoes: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
    peak_rss: u64,
    attacker_audio: u64,
    dropped: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib << 10)
}

async fn run(
    code: &voicehost::sandbox::AgentCode,
    attackers: usize,
    attack: Option<String>,
) -> Result<Row> {
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    })
    .await?;
    let stats = Arc::new(Stats::default());
    let config = AgentConfig::fixed(
        Dial::new(sim.url(), CONFORMANCE_AGENT, CONFORMANCE_KEY),
        code.clone(),
        CallRules::default(),
        1,
    );
    let (stop, stopped) = watch::channel(false);
    let host = tokio::spawn(agent::serve(config, stats.clone(), stopped));
    let conn = tokio::time::timeout(Duration::from_secs(15), sim.connection())
        .await
        .map_err(|_| anyhow!("no connection within 15 s"))??;
    // Their audio is counted, not recorded: the recorder would hold it all.
    let attackers: Vec<_> = (0..attackers)
        .filter_map(|_| attack.as_deref())
        .map(|command| prober_call(&conn, command))
        .collect();
    let mut neighbour = conn.start_audio(16_000);
    let warm = frame(9999);
    neighbour.send_audio(&warm);
    neighbour.expect_audio(&warm).await?;

    let peak = Arc::new(AtomicU64::new(rss_bytes()));
    let sampler = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let recorder = sim.recorder();
    let from = recorder.len();
    paced_frames(&neighbour, &attackers, FRAMES).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    sampler.abort();

    let mut latencies = echo_latencies(recorder, from, &neighbour.id);
    latencies.sort();
    let at = |q: f64| quantile(&latencies, q);
    let row = Row {
        echoes: latencies.len(),
        p50: at(0.5),
        p99: at(0.99),
        max: latencies.last().copied().unwrap_or(Duration::MAX),
        peak_rss: peak.load(Ordering::Relaxed),
        attacker_audio: attackers.iter().map(|a| a.audio_counted()).sum(),
        dropped: stats.audio_out_dropped.get(),
    };
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), host).await;
    sim.shutdown();
    Ok(row)
}
