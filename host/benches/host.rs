//! voicehost's benchmarks, side by side in one run: `cargo bench -p voicehost --bench host`.
//!
//! 1. Per-session instantiation: `Instance::new` of the conformance component (and its drop), plus the
//!    trapping call and the fresh instance that replaces the trapped one.
//! 2. Per-event overhead: `Instance::call` with 20 ms of 16 kHz audio (the echo path through the guest) and
//!    with `user.said "echo hi"`.
//! 3. End-to-end echo latency over loopback WebSocket: the Sent simulator sends paced 20 ms frames on N
//!    concurrent audio sessions; for each frame, the time from the simulator queuing it to the echo being
//!    read back (the recorder's timestamps). voicehost serving the Wasm conformance agent, and the official
//!    SDK's `ConformanceHandler` in this process, each against its own simulator.
//! 4. Memory per live instance: RSS growth over 200 live instances.
//!
//! Every measurement is many samples: the table gives medians and tails, not single timings. The machine
//! this runs on is shared and noisy; compare the rows of one run with each other.
//!
//! Each agent runs on a Tokio runtime of its own, apart from the simulator's, so an agent that deadlocks
//! (the official SDK does under concurrent audio) cannot stop the simulator or the clock: every wait has a
//! deadline and a stall is reported as a deadlock.

use anyhow::{anyhow, bail, Context as _, Result};
use sentdm_voice_agents::conformance::ConformanceHandler;
use sentdm_voice_agents::{Agent, Options};
use sentsim::sim::{CONFORMANCE_AGENT, CONFORMANCE_KEY};
use sentsim::{Dir, Sim, SimConfig, What};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use voicehost::agent::CallRules;
use voicehost::agent::Dial;
use voicehost::agent::{self, AgentConfig};
use voicehost::sandbox::wit::UserSaid;
use voicehost::sandbox::{AgentCode, Event, Instance, Limits, Outcome, Sandbox};
use voicehost::stats::Stats;
use voicehost_testkit::Quiet;

/// Instantiations measured (each timed alone).
const INSTANTIATIONS: usize = 10_000;
/// Handler calls measured per event kind.
const CALLS: usize = 100_000;
/// Trap-and-replace cycles measured.
const TRAPS: usize = 300;
/// Live instances for the memory estimate.
const LIVE: usize = 200;
/// Paced 20 ms frames per session in each echo run (8 s of audio).
const FRAMES: usize = 400;
/// Samples in 20 ms at 16 kHz.
const SAMPLES_20MS: usize = 320;
/// An echo run gives up when no echo has arrived for this long after the last frame was sent.
const STALL: Duration = Duration::from_secs(3);

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no options to read.
    // The log as `voicehost serve` sets it up: what a library's `log::trace!` costs is part of every call.
    voicehost::logging::init(voicehost::logging::DEFAULT);
    let started = Instant::now();
    let mut report = Report::default();

    let wasm = std::fs::read(voicehost_test_programs::CONFORMANCE)
        .context("the conformance component (built by voicehost-test-programs)")?;
    let sandbox = Sandbox::new()?;
    let mut compiles = Vec::new();
    let mut code = None;
    for _ in 0..5 {
        let t = Instant::now();
        code = Some(sandbox.load(&wasm)?);
        compiles.push(t.elapsed());
    }
    let code = code.expect("loaded");
    report.micro(
        &format!(
            "compile + pre-link the conformance component ({} KB)",
            wasm.len() / 1024
        ),
        &compiles,
    );

    let micro = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    micro.block_on(async {
        eprintln!("memory: {LIVE} live instances");
        report.memory = Some(memory(&code).await?);
        eprintln!("instantiation: {INSTANTIATIONS} instances");
        instantiation(&code, &mut report).await?;
        eprintln!("handler calls: {CALLS} of each");
        calls(&code, &mut report).await?;
        eprintln!("traps: {TRAPS}");
        traps(&code, &mut report).await
    })?;
    drop(micro);

    // The same conformance agent in every language that is built (scripts/test builds them all).
    let guests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/guests");
    let languages = [
        ("Rust", voicehost_test_programs::CONFORMANCE.to_string()),
        ("C", guests.join("c/conformance.wasm").display().to_string()),
        (
            "JavaScript (QuickJS)",
            guests.join("js/conformance-qjs.wasm").display().to_string(),
        ),
        (
            "JavaScript (StarlingMonkey)",
            guests.join("js/conformance.wasm").display().to_string(),
        ),
        (
            "Python",
            guests.join("python/conformance.wasm").display().to_string(),
        ),
    ];
    let micro = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for (name, path) in languages {
        let Ok(wasm) = std::fs::read(&path) else {
            eprintln!("language: {name}: {path} is not built, left out");
            continue;
        };
        eprintln!("language: {name}");
        let row = micro.block_on(language(&sandbox, name, &wasm))?;
        report.languages.push(row);
    }
    drop(micro);

    // The simulator and the bench's clock run here; each agent gets a runtime of its own per run.
    let driver = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Interleaved, so slow phases of a noisy machine spread over both agents.
    let runs = [
        (Peer::Voicehost, 1),
        (Peer::Sdk, 1),
        (Peer::Voicehost, 2),
        (Peer::Sdk, 2),
        (Peer::Voicehost, 8),
    ];
    for (peer, sessions) in runs {
        eprintln!("echo: {} with {sessions} session(s)", peer.name());
        let run = driver.block_on(echo_run(peer, sessions, &code));
        report.echo.push(EchoRow {
            peer,
            sessions,
            run,
        });
    }
    driver.shutdown_background();

    println!("{}", report.render(started.elapsed()));
    // An agent runtime left behind by a deadlock still has threads blocked on its locks: do not wait.
    std::process::exit(0)
}

// ----- statistics -----

/// Order statistics of a sample (nearest rank).
#[derive(Debug, Clone, Copy)]
struct Summary {
    count: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    mean: Duration,
}

fn summarize(samples: &[Duration]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank =
        |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    let total: Duration = sorted.iter().sum();
    Some(Summary {
        count: sorted.len(),
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        max: sorted[sorted.len() - 1],
        mean: total / sorted.len() as u32,
    })
}

/// A duration in the unit that reads best: ns, µs or ms.
fn show(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn audio_event() -> Event {
    Event::Audio((0..SAMPLES_20MS as i16).collect())
}

fn said(text: &str) -> Event {
    Event::UserSaid(UserSaid {
        text: text.into(),
        correction: false,
    })
}

async fn expect_ok(instance: &mut Instance, event: &Event) -> Result<()> {
    match instance.call(event).await {
        Outcome::Ok => Ok(()),
        other => bail!("{} gave {other:?}", event.name()),
    }
}

// ----- 1, 2 and 4: in-process measurements -----

/// Resident set size of this process, from /proc/self/status.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// RSS growth per live instance, each called once with 20 ms of audio, over `LIVE` instances.
async fn memory(code: &AgentCode) -> Result<Memory> {
    let audio = audio_event();
    // One instance first, so what every instance shares (code, pool bookkeeping) is already resident.
    let mut warm = Instance::new(code, Quiet::imports(), Limits::default()).await?;
    expect_ok(&mut warm, &audio).await?;
    let before = rss_bytes().ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))?;
    let mut live = Vec::with_capacity(LIVE);
    for _ in 0..LIVE {
        let mut instance = Instance::new(code, Quiet::imports(), Limits::default()).await?;
        expect_ok(&mut instance, &audio).await?;
        live.push(instance);
    }
    let after = rss_bytes().ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))?;
    drop(live);
    drop(warm);
    Ok(Memory {
        before,
        after,
        instances: LIVE,
    })
}

async fn instantiation(code: &AgentCode, report: &mut Report) -> Result<()> {
    let calls = Quiet::imports();
    let mut new = Vec::with_capacity(INSTANTIATIONS);
    let mut dropped = Vec::with_capacity(INSTANTIATIONS);
    for _ in 0..INSTANTIATIONS {
        let calls = calls.clone();
        let t = Instant::now();
        let instance = Instance::new(code, calls, Limits::default()).await?;
        new.push(t.elapsed());
        let t = Instant::now();
        drop(instance);
        dropped.push(t.elapsed());
    }
    report.micro("`Instance::new` (Store + WASI + instantiate)", &new);
    report.micro("drop of an `Instance`", &dropped);
    // The control for the fresh instance after a trap: a new instance's first call, no trap before it.
    let audio = audio_event();
    let mut first = Vec::with_capacity(TRAPS);
    for _ in 0..TRAPS {
        let t = Instant::now();
        let mut instance = Instance::new(code, calls.clone(), Limits::default()).await?;
        expect_ok(&mut instance, &audio).await?;
        first.push(t.elapsed());
    }
    report.micro(
        "`Instance::new` + its first `call(Audio)` (no trap)",
        &first,
    );
    Ok(())
}

async fn calls(code: &AgentCode, report: &mut Report) -> Result<()> {
    let mut instance = Instance::new(code, Quiet::imports(), Limits::default()).await?;
    for (label, event) in [
        (
            "`call(Audio(320 samples))`: on-audio → send-audio echo",
            audio_event(),
        ),
        (
            "`call(UserSaid(\"echo hi\"))`: on-user-said → load, save, say",
            said("echo hi"),
        ),
    ] {
        for _ in 0..1000 {
            expect_ok(&mut instance, &event).await?;
        }
        let mut took = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let t = Instant::now();
            let outcome = instance.call(&event).await;
            took.push(t.elapsed());
            if !matches!(outcome, Outcome::Ok) {
                bail!("{} gave {outcome:?}", event.name());
            }
        }
        report.micro(label, &took);
    }
    drop(instance);
    // As under load: every call's instance in turn, so each handler call finds its Store, its linear
    // memory and its stack out of the caches (BENCHMARKS.md compares it with the load run's Wasm cost).
    let mut live = Vec::with_capacity(ROUND_ROBIN);
    for _ in 0..ROUND_ROBIN {
        live.push(Instance::new(code, Quiet::imports(), Limits::default()).await?);
    }
    let audio = audio_event();
    let mut took = Vec::with_capacity(CALLS);
    for n in 0..CALLS {
        let instance = &mut live[n % ROUND_ROBIN];
        let t = Instant::now();
        let outcome = instance.call(&audio).await;
        took.push(t.elapsed());
        if !matches!(outcome, Outcome::Ok) {
            bail!("on-audio gave {outcome:?}");
        }
    }
    report.micro(
        "`call(Audio(320 samples))` on 1,000 live instances in turn",
        &took,
    );
    Ok(())
}

/// How many live instances the round-robin handler calls go through.
const ROUND_ROBIN: usize = 1000;

async fn traps(code: &AgentCode, report: &mut Report) -> Result<()> {
    let audio = audio_event();
    let panic = said("panic");
    let mut instance = Instance::new(code, Quiet::imports(), Limits::default()).await?;
    expect_ok(&mut instance, &audio).await?;
    let mut trapping = Vec::with_capacity(TRAPS);
    let mut fresh = Vec::with_capacity(TRAPS);
    for _ in 0..TRAPS {
        let t = Instant::now();
        let outcome = instance.call(&panic).await;
        trapping.push(t.elapsed());
        if !matches!(outcome, Outcome::Trapped { .. }) {
            bail!("\"panic\" gave {outcome:?}, not a trap");
        }
        let t = Instant::now();
        expect_ok(&mut instance, &audio).await?;
        fresh.push(t.elapsed());
    }
    let backtrace = std::env::var("RUST_BACKTRACE").unwrap_or_else(|_| "unset".into());
    report.micro(
        &format!("a call that traps (guest `panic!`; RUST_BACKTRACE={backtrace})"),
        &trapping,
    );
    report.micro(
        "the next call after a trap: fresh instance + `call(Audio)`",
        &fresh,
    );
    Ok(())
}

// ----- 3: end-to-end echo over loopback WebSocket -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Voicehost,
    Sdk,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Voicehost => "voicehost (Wasm conformance agent)",
            Peer::Sdk => "official SDK 0.2.0 (`ConformanceHandler`)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Peer::Voicehost => "voicehost",
            Peer::Sdk => "official SDK",
        }
    }
}

/// How one echo run ended.
#[derive(Debug)]
enum EchoRun {
    /// Every frame came back (or some were lost, but echoes kept coming).
    Done {
        latencies: Vec<Duration>,
        sent: usize,
    },
    /// Echoes stopped coming while frames were still owed: the agent stalled.
    Deadlock {
        latencies: Vec<Duration>,
        sent: usize,
        detail: String,
    },
    /// The run could not start (no connection, no echo of the first frame).
    Failed(String),
}

/// A 20 ms frame of 16-bit samples, different for every (session, frame) pair.
fn frame(session: usize, number: usize) -> Vec<u8> {
    let seed = (session * 6000 + number) as u16;
    (0..SAMPLES_20MS)
        .flat_map(|i| (seed.wrapping_add(i as u16) as i16).to_le_bytes())
        .collect()
}

/// A multi-thread runtime of two workers for one agent, thrown away after its run.
fn agent_runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("agent")
        .enable_all()
        .build()?)
}

/// One agent serving the simulator at `url`, on its own runtime, with what stops it.
struct Running {
    runtime: Runtime,
    stop: Box<dyn FnOnce() + Send>,
}

fn start_agent(peer: Peer, url: String, code: &AgentCode) -> Result<Running> {
    let runtime = agent_runtime()?;
    let stop: Box<dyn FnOnce() + Send> = match peer {
        Peer::Voicehost => {
            let config = AgentConfig::fixed(
                Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY),
                code.clone(),
                CallRules::default(),
                1,
            );
            let (stop, stopped) = watch::channel(false);
            runtime.spawn(agent::serve(config, Arc::new(Stats::default()), stopped));
            Box::new(move || {
                let _ = stop.send(true);
            })
        }
        Peer::Sdk => {
            let agent = Agent::new(
                Options::new(CONFORMANCE_KEY, CONFORMANCE_AGENT).with_url(url),
                ConformanceHandler,
            );
            let running = agent.clone();
            runtime.spawn(async move { running.run().await });
            Box::new(move || agent.stop())
        }
    };
    Ok(Running { runtime, stop })
}

async fn echo_run(peer: Peer, sessions: usize, code: &AgentCode) -> EchoRun {
    let sim = match Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    })
    .await
    {
        Ok(sim) => sim,
        Err(error) => return EchoRun::Failed(format!("simulator: {error:#}")),
    };
    let agent = match start_agent(peer, sim.url(), code) {
        Ok(agent) => agent,
        Err(error) => return EchoRun::Failed(format!("agent: {error:#}")),
    };
    let run = paced_echo(&sim, sessions).await;
    (agent.stop)();
    tokio::time::sleep(Duration::from_millis(200)).await;
    sim.shutdown();
    agent.runtime.shutdown_background();
    match run {
        Ok(run) => run,
        Err(error) => EchoRun::Failed(format!("{error:#}")),
    }
}

async fn paced_echo(sim: &Sim, sessions: usize) -> Result<EchoRun> {
    let conn = tokio::time::timeout(Duration::from_secs(15), sim.connection())
        .await
        .map_err(|_| anyhow!("the agent did not connect within 15 s"))??;
    let mut calls: Vec<sentsim::Call> = (0..sessions).map(|_| conn.start_audio(16_000)).collect();
    // One frame each, echoed, before the clock starts: every session has its instance and its stream.
    for (s, call) in calls.iter_mut().enumerate() {
        let warm = frame(s, 5999);
        call.send_audio(&warm);
        tokio::time::timeout(Duration::from_secs(10), call.expect_audio(&warm))
            .await
            .map_err(|_| anyhow!("no echo of the first frame within 10 s"))?
            .with_context(|| format!("the first frame of session {s}"))?;
    }
    let recorder = sim.recorder();
    let from = recorder.len();
    let is_echo =
        |r: &sentsim::Record| r.dir == Dir::FromAgent && matches!(r.what, What::Audio { .. });

    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for number in 0..FRAMES {
        tick.tick().await;
        for (s, call) in calls.iter().enumerate() {
            call.send_audio(&frame(s, number));
        }
    }
    let sent = FRAMES * sessions;

    // Wait for the echoes, giving up after STALL without a new one.
    let mut echoed = recorder.since(from, is_echo).len();
    let mut progress = Instant::now();
    while echoed < sent && progress.elapsed() < STALL {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = recorder.since(from, is_echo).len();
        if now > echoed {
            echoed = now;
            progress = Instant::now();
        }
    }
    for call in &calls {
        call.end("caller_hung_up");
    }

    // Match every echo to the frame it returns: same session, same samples.
    let records = recorder.since(from, |r| matches!(r.what, What::Audio { .. }));
    let mut queued: HashMap<(String, Vec<u8>), Instant> = HashMap::new();
    let mut latencies = Vec::with_capacity(sent);
    let mut last_echo = None;
    for record in &records {
        let (Some(session), What::Audio { samples, .. }) = (&record.session, &record.what) else {
            continue;
        };
        let key = (session.clone(), samples.clone());
        match record.dir {
            Dir::ToAgent => {
                queued.insert(key, record.at);
            }
            Dir::FromAgent => {
                if let Some(at) = queued.remove(&key) {
                    latencies.push(record.at.duration_since(at));
                    last_echo = Some(record.at);
                }
            }
        }
    }
    if latencies.len() < sent && echoed < sent {
        let silent = last_echo.map_or(Duration::MAX, |at| at.elapsed());
        if silent >= STALL {
            let detail = format!(
                "echoes stopped after {} of {sent} frames; none for {:.1} s",
                latencies.len(),
                silent.min(Duration::from_secs(999)).as_secs_f64()
            );
            return Ok(EchoRun::Deadlock {
                latencies,
                sent,
                detail,
            });
        }
    }
    Ok(EchoRun::Done { latencies, sent })
}

// ----- the report -----

struct Memory {
    before: u64,
    after: u64,
    instances: usize,
}

struct EchoRow {
    peer: Peer,
    sessions: usize,
    run: EchoRun,
}

impl EchoRow {
    fn summary(&self) -> Option<Summary> {
        match &self.run {
            EchoRun::Done { latencies, .. } | EchoRun::Deadlock { latencies, .. } => {
                summarize(latencies)
            }
            EchoRun::Failed(_) => None,
        }
    }
}

/// One language's conformance agent, measured the same way as the others.
struct LanguageRow {
    name: &'static str,
    size: usize,
    compile: Duration,
    instantiate: Summary,
    per_instance: f64,
    audio_call: Summary,
}

/// Instances per language for the instantiation and memory figures (a Python instance is ~4 MiB).
const LANGUAGE_INSTANCES: usize = 50;
/// Echoed audio frames per language for the per-frame CPU figure.
const LANGUAGE_CALLS: usize = 2000;

async fn language(sandbox: &Sandbox, name: &'static str, wasm: &[u8]) -> Result<LanguageRow> {
    let t = Instant::now();
    let code = sandbox.load(wasm)?;
    let compile = t.elapsed();
    let audio = audio_event();
    let mut warm = Instance::new(&code, Quiet::imports(), Limits::default()).await?;
    expect_ok(&mut warm, &audio).await?;
    let before = rss_bytes().ok_or_else(|| anyhow!("no VmRSS"))?;
    let mut live = Vec::with_capacity(LANGUAGE_INSTANCES);
    let mut new = Vec::with_capacity(LANGUAGE_INSTANCES);
    for _ in 0..LANGUAGE_INSTANCES {
        let t = Instant::now();
        let mut instance = Instance::new(&code, Quiet::imports(), Limits::default()).await?;
        new.push(t.elapsed());
        expect_ok(&mut instance, &audio).await?;
        live.push(instance);
    }
    let after = rss_bytes().ok_or_else(|| anyhow!("no VmRSS"))?;
    drop(live);
    for _ in 0..100 {
        expect_ok(&mut warm, &audio).await?;
    }
    let mut took = Vec::with_capacity(LANGUAGE_CALLS);
    for _ in 0..LANGUAGE_CALLS {
        let t = Instant::now();
        expect_ok(&mut warm, &audio).await?;
        took.push(t.elapsed());
    }
    Ok(LanguageRow {
        name,
        size: wasm.len(),
        compile,
        instantiate: summarize(&new).ok_or_else(|| anyhow!("no samples"))?,
        per_instance: after.saturating_sub(before) as f64 / LANGUAGE_INSTANCES as f64,
        audio_call: summarize(&took).ok_or_else(|| anyhow!("no samples"))?,
    })
}

#[derive(Default)]
struct Report {
    languages: Vec<LanguageRow>,
    micro: Vec<(String, Summary)>,
    memory: Option<Memory>,
    echo: Vec<EchoRow>,
}

impl Report {
    fn micro(&mut self, label: &str, samples: &[Duration]) {
        if let Some(summary) = summarize(samples) {
            self.micro.push((label.to_string(), summary));
        }
    }

    fn render(&self, took: Duration) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### In process (conformance component, pooling allocator)\n"
        );
        let _ = writeln!(out, "| measurement | samples | p50 | p90 | p99 | mean |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for (label, s) in &self.micro {
            let _ = writeln!(
                out,
                "| {label} | {} | {} | {} | {} | {} |",
                s.count,
                show(s.p50),
                show(s.p90),
                show(s.p99),
                show(s.mean)
            );
        }
        if let Some(m) = &self.memory {
            let growth = m.after.saturating_sub(m.before);
            let _ = writeln!(
                out,
                "| RSS growth per live instance ({} live, each called once) | {} | {:.1} KiB | | | |",
                m.instances,
                m.instances,
                growth as f64 / 1024.0 / m.instances as f64
            );
            let _ = writeln!(
                out,
                "\nRSS {:.1} MiB before, {:.1} MiB with the {} instances live.",
                m.before as f64 / 1048576.0,
                m.after as f64 / 1048576.0,
                m.instances
            );
        }

        if !self.languages.is_empty() {
            let _ = writeln!(
                out,
                "\n### The conformance agent per language ({LANGUAGE_INSTANCES} instances, {LANGUAGE_CALLS} echoed frames each)\n"
            );
            let _ = writeln!(
                out,
                "| language | component | compile (once, uncached) | instantiation p50 | memory per live call | CPU per echoed 20 ms frame, p50 | p99 |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
            for row in &self.languages {
                let _ = writeln!(
                    out,
                    "| {} | {:.2} MB | {} | {} | {:.0} KiB | {} | {} |",
                    row.name,
                    row.size as f64 / 1e6,
                    show(row.compile),
                    show(row.instantiate.p50),
                    row.per_instance / 1024.0,
                    show(row.audio_call.p50),
                    show(row.audio_call.p99)
                );
            }
        }

        let _ = writeln!(
            out,
            "\n### Echo latency over loopback WebSocket (16 kHz, 20 ms frames, {FRAMES} paced frames per session)\n"
        );
        let _ = writeln!(
            out,
            "| agent | sessions | echoed / sent | p50 | p90 | p99 | max | status |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
        for row in &self.echo {
            let name = row.peer.name();
            match (&row.run, row.summary()) {
                (EchoRun::Failed(why), _) => {
                    let why = why.replace('\n', " ").replace('|', "\\|");
                    let _ = writeln!(
                        out,
                        "| {name} | {} | – | | | | | FAILED: {why} |",
                        row.sessions
                    );
                }
                (run, summary) => {
                    let (count, sent, status) = match run {
                        EchoRun::Done { latencies, sent } => {
                            let status = if latencies.len() == *sent {
                                "ok".to_string()
                            } else {
                                format!("{} lost", sent - latencies.len())
                            };
                            (latencies.len(), *sent, status)
                        }
                        EchoRun::Deadlock {
                            latencies,
                            sent,
                            detail,
                        } => (latencies.len(), *sent, format!("DEADLOCK: {detail}")),
                        EchoRun::Failed(_) => unreachable!(),
                    };
                    let cell =
                        |f: fn(&Summary) -> Duration| summary.map_or("–".into(), |s| show(f(&s)));
                    let _ = writeln!(
                        out,
                        "| {name} | {} | {count} / {sent} | {} | {} | {} | {} | {status} |",
                        row.sessions,
                        cell(|s| s.p50),
                        cell(|s| s.p90),
                        cell(|s| s.p99),
                        cell(|s| s.max),
                    );
                }
            }
        }

        let mut ratios = String::new();
        for ours in self.echo.iter().filter(|r| r.peer == Peer::Voicehost) {
            let Some(theirs) = self
                .echo
                .iter()
                .find(|r| r.peer == Peer::Sdk && r.sessions == ours.sessions)
            else {
                continue;
            };
            let (Some(a), Some(b)) = (ours.summary(), theirs.summary()) else {
                continue;
            };
            let ratio = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64().max(1e-9);
            let _ = writeln!(
                ratios,
                "| {} | {:.2} | {:.2} | {:.2} |",
                ours.sessions,
                ratio(a.p50, b.p50),
                ratio(a.p90, b.p90),
                ratio(a.p99, b.p99)
            );
        }
        if !ratios.is_empty() {
            let _ = writeln!(
                out,
                "\n### {} / {} echo latency, same run, same N (below 1: voicehost is faster)\n",
                Peer::Voicehost.short(),
                Peer::Sdk.short()
            );
            let _ = writeln!(out, "| sessions | p50 ratio | p90 ratio | p99 ratio |");
            let _ = writeln!(out, "|---:|---:|---:|---:|");
            out.push_str(&ratios);
        }
        let _ = write!(out, "\nWhole bench: {:.1} s.", took.as_secs_f64());
        out
    }
}
