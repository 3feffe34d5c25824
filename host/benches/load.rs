//! The load benchmark: many live audio calls echoed from Sent's side, `scripts/bench-load` (which builds
//! the official SDK's conformance program and runs `cargo bench -p voicehost --bench load`).
//!
//! For each N (1, 10, 100, 1,000, 2,000, 5,000, then up while voicehost's p99 stays under 20 ms), side by
//! side in one run, a lean Sent (`sentsim::load`) places N 16 kHz audio calls sending a 20 ms frame every
//! 20 ms, spread over the period, and times each frame's echo. The agents, each a process of its own so that
//! its CPU and memory are read from `/proc` apart from the generator's:
//! - `wasm`: voicehost serving the Rust conformance component;
//! - `native`: voicehost serving the same agent as host code behind the same `GuestImports` boundary
//!   (`voicehost_testkit::NativeConformance`), so that `wasm ÷ native` is what the sandbox costs;
//! - `sdk`: the official SDK's conformance program, while it survives (it deadlocks under concurrent
//!   audio, design.md), at N ≤ [`SDK_MOST`].
//!
//! The agent processes are this bench's own binary again (`VOICEHOST_LOAD_AGENT=wasm|native`), so that
//! they run the same `agent::serve` as `voicehost run`. The table and a plot go to `BENCHMARKS.md` (between
//! its `load` markers) and `benchmarks/load.svg`.
//!
//! Settings (environment): `LOAD_CALLS` (the Ns, comma-separated), `LOAD_SECONDS` (the measurement per
//! run, 5), `LOAD_PACING` (`spread` or `burst`), `LOAD_MAX_SESSIONS` (calls per connection, 500),
//! `LOAD_WRITE=0` (print the table only), `LOAD_AGENT_STDERR=1` (the agents' log on stderr), `SDK_CONFORMANCE_BIN` (the SDK program; without it, no `sdk` rows).

use anyhow::{bail, Context as _, Result};
use plotters::prelude::*;
use sentsim::load::{cpu_time, rss_bytes, LoadReport, LoadSent, LoadSpec, Pacing, Phase};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use voicehost::agent::{self, AgentConfig, CallRules, Dial};
use voicehost::sandbox::{AgentCode, Sandbox};
use voicehost::stats::Stats;
use voicehost_testkit::NativeConformance;

/// The Ns every run measures; past the last, N grows while voicehost's p99 stays under [`P99_BOUND`].
const CALLS: &[usize] = &[1, 10, 100, 1_000, 2_000, 5_000];
/// The p99 under which N keeps growing past [`CALLS`].
const P99_BOUND: Duration = Duration::from_millis(20);
/// The most calls any run places: the pool's cap.
const MOST: usize = 10_000;
/// The official SDK runs at N up to this: past it, it deadlocks within seconds.
const SDK_MOST: usize = 10;
/// Where the agent processes dial.
const AGENT_ROLE: &str = "VOICEHOST_LOAD_AGENT";

fn main() -> Result<()> {
    if let Ok(role) = std::env::var(AGENT_ROLE) {
        return agent_process(&role);
    }
    let settings = Settings::from_env()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut n_index = 0;
    loop {
        let calls = match settings.calls.get(n_index) {
            Some(&calls) => calls,
            None if settings.grow => {
                let last = rows.iter().rev().find(|r| r.agent == Kind::Wasm);
                match last {
                    Some(row) if row.p99_ok() && row.calls < MOST => (row.calls * 2).min(MOST),
                    _ => break,
                }
            }
            None => break,
        };
        n_index += 1;
        for kind in [Kind::Wasm, Kind::Native, Kind::Sdk] {
            if kind == Kind::Sdk && (calls > SDK_MOST || settings.sdk.is_none()) {
                continue;
            }
            eprintln!("load: {} calls, {}", calls, kind.name());
            let row = runtime.block_on(measure(&settings, kind, calls))?;
            eprintln!("  {}", row.line());
            rows.push(row);
        }
    }
    let table = table(&settings, &rows);
    println!("{table}");
    if settings.write {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        plot(&rows, &root.join("benchmarks/load.svg"))?;
        write_section(&root.join("BENCHMARKS.md"), &table)?;
        eprintln!("written: BENCHMARKS.md (the load section) and benchmarks/load.svg");
    }
    Ok(())
}

/// What the run's environment asks for.
struct Settings {
    calls: Vec<usize>,
    /// Whether N grows past `calls` (only when `LOAD_CALLS` is not set).
    grow: bool,
    seconds: u64,
    pacing: Pacing,
    max_sessions: usize,
    write: bool,
    sdk: Option<PathBuf>,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (calls, grow) = match var("LOAD_CALLS") {
            Some(list) => (
                list.split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .context("LOAD_CALLS: numbers separated by commas")?,
                false,
            ),
            None => (CALLS.to_vec(), true),
        };
        if let Some(&n) = calls.iter().find(|&&n| n == 0 || n > MOST) {
            bail!("LOAD_CALLS: {n} calls; use 1 to {MOST}");
        }
        let pacing = match var("LOAD_PACING").as_deref() {
            None | Some("spread") => Pacing::Spread,
            Some("burst") => Pacing::Burst,
            Some(other) => bail!("LOAD_PACING={other}: spread or burst"),
        };
        let number = |name: &str, default: u64| -> Result<u64> {
            var(name).map_or(Ok(default), |v| {
                v.parse().with_context(|| format!("{name}={v}: a number"))
            })
        };
        let sdk = var("SDK_CONFORMANCE_BIN").map(PathBuf::from);
        if let Some(path) = &sdk {
            if !path.is_file() {
                bail!("SDK_CONFORMANCE_BIN={}: no such program", path.display());
            }
        }
        Ok(Settings {
            calls,
            grow,
            seconds: number("LOAD_SECONDS", 5)?.max(1),
            pacing,
            max_sessions: number("LOAD_MAX_SESSIONS", 500)?.clamp(1, 10_000) as usize,
            write: var("LOAD_WRITE").as_deref() != Some("0"),
            sdk,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Wasm,
    Native,
    Sdk,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Wasm => "voicehost, Wasm",
            Kind::Native => "voicehost, native",
            Kind::Sdk => "official SDK",
        }
    }
}

/// One agent at one N.
struct Row {
    agent: Kind,
    calls: usize,
    report: LoadReport,
    /// The agent process's CPU during the measurement.
    agent_cpu: Duration,
    /// Its resident memory as the measurement started.
    agent_rss: u64,
}

impl Row {
    fn percentile(&self, q: f64) -> Duration {
        Duration::from_micros(self.report.latency.value_at_quantile(q))
    }

    fn p99_ok(&self) -> bool {
        !self.report.latency.is_empty()
            && self.percentile(0.99) <= P99_BOUND
            && self.report.lost() == 0
            && self.report.misrouted == 0
    }

    /// Microseconds of `cpu` per echoed frame.
    fn per_frame(&self, cpu: Duration) -> Option<f64> {
        (self.report.echoed > 0).then(|| cpu.as_secs_f64() * 1e6 / self.report.echoed as f64)
    }

    fn line(&self) -> String {
        let r = &self.report;
        format!(
            "p50 {} p99 {} p99.9 {} max {}; {} sent, {} echoed, {} lost, {} misrouted, {} refused; agent {} CPU/frame, RSS {} MiB; generator {} CPU/frame{}",
            ms(self.percentile(0.5)),
            ms(self.percentile(0.99)),
            ms(self.percentile(0.999)),
            ms(Duration::from_micros(r.latency.max())),
            r.sent,
            r.echoed,
            r.lost(),
            r.misrouted,
            r.unplaced + r.silent,
            micros(self.per_frame(self.agent_cpu)),
            self.agent_rss >> 20,
            micros(self.per_frame(r.generator_cpu)),
            r.failure.as_ref().map(|f| format!("; {f}")).unwrap_or_default(),
        )
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn micros(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{v:.1} µs"))
}

/// Starts the agent process, places the calls, and reads the process's CPU and memory around the
/// measurement.
async fn measure(settings: &Settings, kind: Kind, calls: usize) -> Result<Row> {
    let sent = LoadSent::bind().await?;
    let spec = LoadSpec {
        max_sessions: settings.max_sessions,
        measure: Duration::from_secs(settings.seconds),
        pacing: settings.pacing,
        // Compiling and opening the connections, then each call's start: a few ms each at most.
        warm_within: Duration::from_secs(15) + Duration::from_millis(3 * calls as u64),
        ..LoadSpec::new(calls)
    };
    let connections = spec.connections();
    let mut child = Agent(spawn(settings, kind, sent.url(), connections, calls)?);
    let pid = child.0.id();
    let mut at_start = None;
    let mut at_end = None;
    let mut rss = 0;
    let report = sent
        .run(&spec, |phase| match phase {
            Phase::Measuring => {
                at_start = cpu_time(Some(pid));
                rss = rss_bytes(Some(pid)).unwrap_or(0);
            }
            Phase::Done => at_end = cpu_time(Some(pid)),
        })
        .await?;
    if let Ok(Some(status)) = child.0.try_wait() {
        eprintln!("  the agent exited during the run: {status}");
    }
    drop(child);
    Ok(Row {
        agent: kind,
        calls,
        agent_cpu: at_end
            .zip(at_start)
            .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a)),
        agent_rss: rss,
        report,
    })
}

/// An agent process, killed when dropped.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(
    settings: &Settings,
    kind: Kind,
    url: &str,
    connections: usize,
    calls: usize,
) -> Result<Child> {
    let mut command = match kind {
        Kind::Sdk => {
            let program = settings.sdk.as_ref().context("no SDK program")?;
            let mut command = Command::new(program);
            command.env("SENT_CONFORMANCE_URL", url);
            command
        }
        Kind::Wasm | Kind::Native => {
            let mut command = Command::new(std::env::current_exe()?);
            command
                .env(
                    AGENT_ROLE,
                    if kind == Kind::Wasm { "wasm" } else { "native" },
                )
                .env("LOAD_URL", url)
                .env("LOAD_CONNECTIONS", connections.to_string())
                .env("LOAD_MAX_CALLS", calls.to_string());
            command
        }
    };
    // The agents log as `voicehost serve` does by default (what a log line costs is part of a call);
    // their lines are not read.
    command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if std::env::var_os("LOAD_AGENT_STDERR").is_none() {
        command.stderr(Stdio::null());
    }
    if kind == Kind::Sdk {
        command.env("RUST_LOG", "off");
    }
    Ok(command.spawn()?)
}

/// An agent process: voicehost serving the conformance agent, as a component or as host code, until
/// killed.
fn agent_process(role: &str) -> Result<()> {
    voicehost::logging::init(voicehost::logging::DEFAULT);
    let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let url = var("LOAD_URL")?;
    let connections: usize = var("LOAD_CONNECTIONS")?.parse()?;
    let max_calls: usize = var("LOAD_MAX_CALLS")?.parse()?;
    let sandbox = Sandbox::for_calls(max_calls)?;
    let code = match role {
        "wasm" => sandbox.load(&std::fs::read(voicehost_test_programs::CONFORMANCE)?)?,
        "native" => AgentCode::native(Arc::new(NativeConformance)),
        other => bail!("{AGENT_ROLE}={other}: wasm or native"),
    };
    let config = AgentConfig::fixed(
        Dial::new(url, "agent_load", "sk_load"),
        code,
        CallRules::default(),
        connections,
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let (_stop, stopped) = watch::channel(false);
    runtime.block_on(agent::serve(config, Arc::new(Stats::default()), stopped))?;
    Ok(())
}

/// The table, with the machine, the date and the command.
fn table(settings: &Settings, rows: &[Row]) -> String {
    let mut out = String::new();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "Run {date} on {} cores ({cpu}), {} s measured per row, {:?} pacing, at most {} calls per \
         connection. CPU per frame: the agent process's CPU (user + system, `/proc`) during the \
         measurement over the frames it echoed; the generator's the same for the load generator, which \
         shares the two cores. RSS per call: (RSS at N − RSS at 1 call) ÷ (N − 1), the same agent.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        settings.seconds,
        settings.pacing,
        settings.max_sessions,
    );
    out.push_str(
        "| calls | agent | p50 | p99 | p99.9 | max | lost | misrouted | refused | agent CPU/frame | generator CPU/frame | RSS/call | Wasm ÷ native CPU |\n",
    );
    out.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in rows {
        let r = &row.report;
        let base = rows
            .iter()
            .find(|b| b.agent == row.agent && b.calls == 1)
            .filter(|_| row.calls > 1);
        let per_call = base.map_or("–".into(), |b| {
            let grown = row.agent_rss.saturating_sub(b.agent_rss);
            format!("{:.0} KiB", grown as f64 / 1024.0 / (row.calls - 1) as f64)
        });
        let ratio = if row.agent == Kind::Wasm {
            rows.iter()
                .find(|n| n.agent == Kind::Native && n.calls == row.calls)
                .and_then(|n| Some(row.per_frame(row.agent_cpu)? / n.per_frame(n.agent_cpu)?))
                .map_or("–".into(), |x| format!("{x:.2}"))
        } else {
            "".into()
        };
        let (p50, p99, p999, max) = if r.latency.is_empty() {
            ("–".into(), "–".into(), "–".into(), "–".into())
        } else {
            (
                ms(row.percentile(0.5)),
                ms(row.percentile(0.99)),
                ms(row.percentile(0.999)),
                ms(Duration::from_micros(r.latency.max())),
            )
        };
        let _ = writeln!(
            out,
            "| {} | {} | {p50} | {p99} | {p999} | {max} | {} | {} | {} | {} | {} | {per_call} | {ratio} |",
            row.calls,
            row.agent.name(),
            r.lost(),
            r.misrouted,
            r.unplaced + r.silent,
            micros(row.per_frame(row.agent_cpu)),
            micros(row.per_frame(r.generator_cpu)),
        );
    }
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            let failure = row.report.failure.as_ref()?;
            Some(format!(
                "- {} calls, {}: {failure}",
                row.calls,
                row.agent.name()
            ))
        })
        .collect();
    if !failures.is_empty() {
        out.push_str("\nWhat went wrong in a run:\n");
        out.push_str(&failures.join("\n"));
        out.push('\n');
    }
    out
}

const BEGIN: &str = "<!-- load:begin (written by scripts/bench-load) -->";
const END: &str = "<!-- load:end -->";

/// Replaces what is between the markers in `path` with `table`.
fn write_section(path: &Path, table: &str) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        bail!("{} has no load markers ({BEGIN} … {END})", path.display());
    };
    let written = format!(
        "{}{BEGIN}\n{table}\n![latency and CPU against N](benchmarks/load.svg)\n{}",
        &text[..begin],
        &text[end..]
    );
    std::fs::write(path, written)?;
    Ok(())
}

/// p99 and agent CPU per frame against N, one line per agent, N on a log scale.
fn plot(rows: &[Row], path: &Path) -> Result<()> {
    std::fs::create_dir_all(path.parent().context("a directory")?)?;
    let most = rows.iter().map(|r| r.calls).max().unwrap_or(1).max(2) as f64;
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let kinds = [(Kind::Wasm, RED), (Kind::Native, BLUE), (Kind::Sdk, BLACK)];
    type Value = fn(&Row) -> Option<f64>;
    let charts: [(&DrawingArea<_, _>, &str, Value); 2] = [
        (&left, "echo p99 (ms)", |r: &Row| {
            (!r.report.latency.is_empty()).then(|| r.percentile(0.99).as_secs_f64() * 1e3)
        }),
        (&right, "agent CPU per echoed frame (µs)", |r: &Row| {
            r.per_frame(r.agent_cpu)
        }),
    ];
    for (area, title, value) in charts {
        // Both on a log scale: p99 spans a tenth of a ms to seconds, CPU per frame at one call is mostly
        // the host's idle work.
        let values: Vec<f64> = rows.iter().filter_map(value).filter(|v| *v > 0.0).collect();
        let top = values.iter().copied().fold(1.0f64, f64::max) * 1.5;
        let floor = values.iter().copied().fold(top, f64::min) / 1.5;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d((1.0f64..most).log_scale(), (floor..top).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("live calls")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .draw()?;
        for (kind, color) in kinds {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.agent == kind)
                .filter_map(|r| Some((r.calls as f64, value(r)?)))
                .collect();
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(kind.name())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
