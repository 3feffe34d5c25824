//! How long `voicehost serve` takes to serve again after a restart, with the compiled cache warm and cold:
//! `cargo bench -p voicehost --bench restart`.
//!
//! The real binary (`CARGO_BIN_EXE_voicehost`) against the Sent simulator in this process. For each
//! registry (the conformance agent in every language that is built, then the Rust one alone: the floor of
//! process start, engine and admin listener), the bench writes a config in a fresh directory, starts
//! `voicehost serve`, uploads and activates the agents through the admin API, stops it with SIGTERM, and then
//! restarts it several times on the same data directory:
//!
//! * warm: as it is, so every active agent comes from `data/compiled/`;
//! * cold: with `data/compiled/` deleted first, so every agent is compiled again.
//!
//! Warm and cold restarts are interleaved, so a noisy phase of the machine hits both. Each restart is timed
//! from the spawn to the admin API listening (its log line), to `/healthz` answering 200 (every active agent
//! loaded), and to each agent's first connection getting `connection.ready` from the simulator (the
//! recorder's timestamp: both run on this process's clock). `sim.connection_for` then checks that every agent
//! answers pings; that wait (up to a heartbeat, 1 s) is not in the times. `/metrics` gives the compilations
//! and cache loads of each restart.
//!
//! The markdown tables go to stdout; progress goes to stderr.

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use sentsim::sim::Account;
use sentsim::{Dir, Sim, SimConfig, What};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use voicehost::content::Digest;
use voicehost::tenancy::token_sha256;

const BIN: &str = env!("CARGO_BIN_EXE_voicehost");
const KEY: &str = "sk_restart_bench_key";
const TOKEN: &str = "vh_restart_bench_token";
const TENANT: &str = "bench";
/// Restarts with the compiled cache as it is.
const WARM: usize = 5;
/// Restarts with `data/compiled/` deleted first.
const COLD: usize = 3;
/// The longest any wait may take (a cold start of every language compiles for 15–20 s on 2 cores).
const PATIENCE: Duration = Duration::from_secs(180);

/// One agent of a registry: its id in the registry, its language, its component.
struct Agent {
    id: &'static str,
    language: &'static str,
    wasm: Vec<u8>,
    /// The size of its compiled artifact in `data/compiled/`, once known.
    compiled: Option<u64>,
}

fn main() -> Result<()> {
    let started = Instant::now();
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/guests");
    let rust = PathBuf::from(voicehost_test_programs::CONFORMANCE);
    // The ids sort in this order, which is the order the host loads them in at start (the registry's).
    let every = [
        ("agent_c", "C", guests.join("c/conformance.wasm")),
        (
            "agent_js-quickjs",
            "JavaScript (QuickJS)",
            guests.join("js/conformance-qjs.wasm"),
        ),
        (
            "agent_js-starlingmonkey",
            "JavaScript (StarlingMonkey)",
            guests.join("js/conformance.wasm"),
        ),
        (
            "agent_python",
            "Python",
            guests.join("python/conformance.wasm"),
        ),
        ("agent_rust", "Rust", rust.clone()),
    ];
    let mut left_out = Vec::new();
    let mut all = Vec::new();
    for (id, language, path) in every {
        match std::fs::read(&path) {
            Ok(wasm) => all.push(Agent {
                id,
                language,
                wasm,
                compiled: None,
            }),
            Err(_) if language != "Rust" => {
                eprintln!(
                    "{language}: {} is not built, left out (scripts/build-agents builds it)",
                    path.display()
                );
                left_out.push(format!("{language} (`{}` is not built)", path.display()));
            }
            Err(error) => {
                return Err(anyhow!(error)).context(format!(
                    "the Rust conformance component {} (voicehost-test-programs builds it)",
                    path.display()
                ))
            }
        }
    }
    let rust_only = vec![Agent {
        id: "agent_rust",
        language: "Rust",
        wasm: std::fs::read(&rust).context("the Rust conformance component")?,
        compiled: None,
    }];

    let load_before = loadavg();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    for (name, agents) in [("every language", all), ("Rust only", rust_only)] {
        eprintln!("registry: {name}");
        results.push(runtime.block_on(registry(name, agents))?);
    }
    drop(runtime);
    let load_after = loadavg();

    println!(
        "{}",
        render(
            &results,
            &left_out,
            started.elapsed(),
            &load_before,
            &load_after
        )
    );
    Ok(())
}

// ----- one registry -----

/// What one registry's restarts measured.
struct RegistryRun {
    name: &'static str,
    agents: Vec<Agent>,
    runs: Vec<Restart>,
}

/// One restart, timed from the spawn.
struct Restart {
    cold: bool,
    /// The admin API's "listening" log line: process start, config, engine, registry, the listener.
    listening: Duration,
    /// `/healthz` answered 200: every active agent is loaded.
    healthy: Duration,
    /// The host's own `took_ms` for loading the agents (its "serving" log line).
    loading: Option<Duration>,
    /// Each agent's first connection got `connection.ready`, in the registry's order.
    ready: Vec<Duration>,
    compilations: f64,
    cache_loads: f64,
}

impl Restart {
    fn all_ready(&self) -> Duration {
        self.ready.iter().copied().max().unwrap_or_default()
    }
}

async fn registry(name: &'static str, mut agents: Vec<Agent>) -> Result<RegistryRun> {
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        accounts: vec![Account {
            api_key: KEY.into(),
            agents: agents.iter().map(|a| a.id.to_string()).collect(),
        }],
        ..SimConfig::default()
    })
    .await?;
    let dir = Scratch::new(&format!(
        "restart-{}-{}",
        name.replace(' ', "-"),
        std::process::id()
    ))?;
    std::fs::write(dir.0.join("bench.key"), KEY)?;
    let config = dir.0.join("voicehost.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\nsent_url = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nid = \"{TENANT}\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}\"\n",
            sim.url(),
            token_sha256(TOKEN),
            dir.0.join("bench.key").display()
        ),
    )?;
    let compiled_dir = dir.0.join("data/compiled");

    // The first start: an empty registry, then every agent uploaded and activated.
    let served = Served::start(&config, Instant::now()).await?;
    served.healthy().await?;
    for agent in &agents {
        eprintln!(
            "  upload {} ({:.2} MB)",
            agent.id,
            agent.wasm.len() as f64 / 1e6
        );
        let (status, body) = voicehost_testkit::admin::send(
            &served.admin,
            "POST",
            &format!("/v1/agents/{}/versions?activate=true", agent.id),
            Some(TOKEN),
            agent.wasm.clone(),
        )
        .await?;
        ensure!(
            status == 201,
            "uploading {} answered {status}: {body}",
            agent.id
        );
    }
    for agent in &agents {
        sim.connection_for(Some(agent.id)).await?;
    }
    let (compilations, _) = served.counts().await?;
    ensure!(
        compilations == agents.len() as f64,
        "the uploads compiled {compilations} components, not {}",
        agents.len()
    );
    served.stop().await?;
    all_closed(&sim).await?;
    for agent in &mut agents {
        agent.compiled = compiled_size(&compiled_dir, &agent.wasm);
    }

    // Interleaved: cold restarts between warm ones, warm first and last.
    let mut order = Vec::new();
    let (mut warm, mut cold) = (WARM, COLD);
    while warm + cold > 0 {
        if warm > 0 {
            order.push(false);
            warm -= 1;
        }
        if cold > 0 {
            order.push(true);
            cold -= 1;
        }
    }
    let mut runs = Vec::new();
    for (n, cold) in order.into_iter().enumerate() {
        if cold {
            std::fs::remove_dir_all(&compiled_dir)
                .with_context(|| format!("deleting {}", compiled_dir.display()))?;
        }
        let run = restart(&sim, &config, &agents, cold).await?;
        eprintln!(
            "  restart {} ({}): listening {}, /healthz {}, every agent connected {}, compiled {}, from cache {}",
            n + 1,
            if cold { "cold" } else { "warm" },
            show(run.listening),
            show(run.healthy),
            show(run.all_ready()),
            run.compilations,
            run.cache_loads
        );
        runs.push(run);
    }
    let violations = sim.violations_since(0);
    ensure!(
        violations.is_empty(),
        "the host broke protocol rules: {violations:?}"
    );
    sim.shutdown();
    Ok(RegistryRun { name, agents, runs })
}

/// Starts the host on the data directory as it is, times it until every agent is connected, reads its
/// counters and stops it.
async fn restart(sim: &Sim, config: &Path, agents: &[Agent], cold: bool) -> Result<Restart> {
    let from = sim.recorder().len();
    let spawned = Instant::now();
    let served = Served::start(config, spawned).await?;
    let healthy = served.healthy().await? - spawned;
    // Every agent answers pings on a connection opened by this process…
    let mut ready = Vec::new();
    for agent in agents {
        let conn = tokio::time::timeout(PATIENCE, sim.connection_for(Some(agent.id)))
            .await
            .map_err(|_| anyhow!("{} never connected", agent.id))??;
        // …and the time is when Sent sent that connection `connection.ready`.
        let record = sim
            .recorder()
            .since(from, |r| {
                r.conn == conn.id && r.is_frame(Dir::ToAgent, "connection.ready")
            })
            .into_iter()
            .next()
            .ok_or_else(|| {
                anyhow!(
                    "{}: connection {} is not one of this start's",
                    agent.id,
                    conn.id
                )
            })?;
        ready.push(record.at.saturating_duration_since(spawned));
    }
    let (compilations, cache_loads) = served.counts().await?;
    let loading = *served.loading.lock().unwrap();
    let listening = served.listening;
    served.stop().await?;
    all_closed(sim).await?;
    Ok(Restart {
        cold,
        listening,
        healthy,
        loading,
        ready,
        compilations,
        cache_loads,
    })
}

/// Waits until the simulator has seen every connection it opened close, so the next start's connections
/// are the only open ones.
async fn all_closed(sim: &Sim) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut open = BTreeSet::new();
        for record in sim
            .recorder()
            .since(0, |r| matches!(r.what, What::Opened | What::Closed { .. }))
        {
            if record.what == What::Opened {
                open.insert(record.conn);
            } else {
                open.remove(&record.conn);
            }
        }
        if open.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "connections {open:?} stayed open after the host stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The size of the compiled artifact of `wasm` in `dir` (named by the component's digest).
fn compiled_size(dir: &Path, wasm: &[u8]) -> Option<u64> {
    let digest = Digest::of(wasm);
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(digest.hex())
        })
        .and_then(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
}

// ----- the host process -----

/// A running `voicehost serve`, killed when dropped.
struct Served {
    child: Child,
    admin: String,
    /// From the spawn to its "admin API listening" line.
    listening: Duration,
    /// The `took_ms` of its "serving" line, once printed.
    loading: Arc<Mutex<Option<Duration>>>,
    log: Arc<Mutex<String>>,
}

impl Served {
    /// Spawns the host (`spawned` is taken just before) and waits for its admin API to listen.
    async fn start(config: &Path, spawned: Instant) -> Result<Served> {
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            // The host's default log filter, which prints the lines read here.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting voicehost serve")?;
        let log = Arc::new(Mutex::new(String::new()));
        let loading = Arc::new(Mutex::new(None));
        let stderr = child.stderr.take().expect("piped");
        let (found, listening) = tokio::sync::oneshot::channel();
        std::thread::spawn({
            let (log, loading) = (log.clone(), loading.clone());
            move || {
                let mut found = Some(found);
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let at = Instant::now();
                    if line.contains("admin API listening") {
                        if let (Some(addr), Some(found)) = (field(&line, "addr"), found.take()) {
                            let _ = found.send((at, addr));
                        }
                    }
                    if line.contains("serving agents=") {
                        let took = field(&line, "took_ms").and_then(|ms| ms.parse().ok());
                        *loading.lock().unwrap() = took.map(Duration::from_millis);
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        let served = |child, admin, listening| Served {
            child,
            admin,
            listening,
            loading,
            log: log.clone(),
        };
        match tokio::time::timeout(PATIENCE, listening).await {
            Ok(Ok((at, addr))) => Ok(served(
                child,
                format!("http://{addr}"),
                at.saturating_duration_since(spawned),
            )),
            _ => {
                let served = served(child, String::new(), Duration::ZERO);
                tokio::time::sleep(Duration::from_millis(100)).await;
                bail!(
                    "voicehost never said where its admin API listens:\n{}",
                    served.log()
                )
            }
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Polls `/healthz` until it answers 200; returns when.
    async fn healthy(&self) -> Result<Instant> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, _) =
                voicehost_testkit::admin::send(&self.admin, "GET", "/healthz", None, vec![])
                    .await?;
            if status == 200 {
                return Ok(Instant::now());
            }
            ensure!(
                Instant::now() < deadline,
                "never healthy; the host's log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// `voicehost_compilations_total` and `voicehost_compiled_cache_loads_total`.
    async fn counts(&self) -> Result<(f64, f64)> {
        let (status, body) =
            voicehost_testkit::admin::send(&self.admin, "GET", "/metrics", None, vec![]).await?;
        ensure!(status == 200, "/metrics answered {status}");
        let text = body.as_str().unwrap_or_default();
        Ok((
            metric(text, "voicehost_compilations_total")?,
            metric(text, "voicehost_compiled_cache_loads_total")?,
        ))
    }

    /// SIGTERM, and a clean exit.
    async fn stop(mut self) -> Result<()> {
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        ensure!(terminated.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            ensure!(
                Instant::now() < deadline,
                "voicehost did not stop on SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        ensure!(
            status.success(),
            "voicehost exited with {status}:\n{}",
            self.log()
        );
        Ok(())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name=value` in a log line.
fn field(line: &str, name: &str) -> Option<String> {
    let value = line.split(&format!("{name}=")).nth(1)?;
    Some(value.split_whitespace().next()?.to_string())
}

/// A metric's value by its name (a sample without labels).
fn metric(text: &str, name: &str) -> Result<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .ok_or_else(|| anyhow!("no {name} in /metrics"))?
        .trim()
        .parse()
        .with_context(|| format!("{name} in /metrics"))
}

/// A fresh directory under the target directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Result<Scratch> {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ----- the report -----

/// Median, min and max (the median of an even count is the lower middle one).
fn stats(samples: impl IntoIterator<Item = Duration>) -> Option<(Duration, Duration, Duration)> {
    let mut sorted: Vec<Duration> = samples.into_iter().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_unstable();
    Some((
        sorted[(sorted.len() - 1) / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    ))
}

/// Milliseconds (one decimal under 10 ms) or seconds. Zero is the host's `took_ms` of under 1 ms.
fn show(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if d.is_zero() {
        "< 1 ms".into()
    } else if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1e3)
    }
}

/// "p50 (min–max)".
fn spread(samples: impl IntoIterator<Item = Duration>) -> String {
    match stats(samples) {
        Some((p50, min, max)) => format!("{} ({}–{})", show(p50), show(min), show(max)),
        None => "–".into(),
    }
}

fn median(samples: impl IntoIterator<Item = Duration>) -> Duration {
    stats(samples).map_or(Duration::ZERO, |(p50, _, _)| p50)
}

/// The counts of a set of runs: "0" when all agree, "0–1" otherwise.
fn counts(values: impl IntoIterator<Item = f64>) -> String {
    let values: Vec<f64> = values.into_iter().collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        "–".into()
    } else if min == max {
        format!("{min}")
    } else {
        format!("{min}–{max}")
    }
}

fn megabytes(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

fn render(
    results: &[RegistryRun],
    left_out: &[String],
    took: Duration,
    load_before: &str,
    load_after: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### From spawn to serving (p50, min–max; {WARM} warm and {COLD} cold restarts per registry, interleaved)\n"
    );
    let _ = writeln!(
        out,
        "| registry | cache | restarts | admin API listening | agents loaded (host's `took_ms`) | `/healthz` 200 | every agent's connection ready | compilations | cache loads |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for result in results {
        let total: u64 = result.agents.iter().map(|a| a.wasm.len() as u64).sum();
        for cold in [false, true] {
            let runs: Vec<&Restart> = result.runs.iter().filter(|r| r.cold == cold).collect();
            let _ = writeln!(
                out,
                "| {} ({} agent{}, {}) | {} | {} | {} | {} | {} | {} | {} | {} |",
                result.name,
                result.agents.len(),
                if result.agents.len() == 1 { "" } else { "s" },
                megabytes(total),
                if cold {
                    "cold (`data/compiled/` deleted)"
                } else {
                    "warm"
                },
                runs.len(),
                spread(runs.iter().map(|r| r.listening)),
                spread(runs.iter().filter_map(|r| r.loading)),
                spread(runs.iter().map(|r| r.healthy)),
                spread(runs.iter().map(|r| r.all_ready())),
                counts(runs.iter().map(|r| r.compilations)),
                counts(runs.iter().map(|r| r.cache_loads)),
            );
        }
    }

    let _ = writeln!(out, "\n### Cold / warm (medians, same run)\n");
    let _ = writeln!(
        out,
        "| registry | `/healthz` 200 | every agent's connection ready |"
    );
    let _ = writeln!(out, "|---|---:|---:|");
    for result in results {
        let side = |cold: bool, f: fn(&Restart) -> Duration| {
            median(result.runs.iter().filter(|r| r.cold == cold).map(f))
        };
        let ratio = |f: fn(&Restart) -> Duration| {
            side(true, f).as_secs_f64() / side(false, f).as_secs_f64().max(1e-9)
        };
        let _ = writeln!(
            out,
            "| {} | {:.1}× | {:.1}× |",
            result.name,
            ratio(|r| r.healthy),
            ratio(Restart::all_ready),
        );
    }

    for result in results.iter().filter(|r| r.agents.len() > 1) {
        let _ = writeln!(
            out,
            "\n### Per agent ({}; the host loads them one after another, smallest first, each connecting once loaded)\n",
            result.name
        );
        let _ = writeln!(
            out,
            "| agent | component | compiled artifact | warm: connection ready at | warm: after the previous agent | cold: connection ready at | cold: after the previous agent |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        // The host loads the smallest component first: rows in that order, each after the one above.
        let mut order: Vec<usize> = (0..result.agents.len()).collect();
        order.sort_by_key(|&at| result.agents[at].wasm.len());
        for (row, &at) in order.iter().enumerate() {
            let agent = &result.agents[at];
            let column = |cold: bool, step: bool| {
                let runs = result.runs.iter().filter(|r| r.cold == cold);
                spread(runs.map(|r| {
                    let previous = if row == 0 {
                        r.listening
                    } else {
                        r.ready[order[row - 1]]
                    };
                    if step {
                        r.ready[at].saturating_sub(previous)
                    } else {
                        r.ready[at]
                    }
                }))
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                agent.language,
                megabytes(agent.wasm.len() as u64),
                agent.compiled.map_or("–".into(), megabytes),
                column(false, false),
                column(false, true),
                column(true, false),
                column(true, true),
            );
        }
        let _ = writeln!(
            out,
            "\n\"After the previous agent\" is the time from the previous agent's `connection.ready` (for the \
             first agent, from the admin API listening) to this one's: mostly its own load, plus a loopback \
             WebSocket handshake."
        );
    }
    if !left_out.is_empty() {
        let _ = writeln!(out, "\nLeft out: {}.", left_out.join("; "));
    }
    let _ = writeln!(
        out,
        "\nLoad average {load_before} before, {load_after} after. Whole bench: {:.1} s.",
        took.as_secs_f64()
    );
    out
}
