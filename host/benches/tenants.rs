//! Tenant B beside tenant A on one `voicehost serve`: `cargo bench -p voicehost --bench tenants`.
//!
//! The Sent simulator and `serve` (in-process, its admin API on loopback, two tenants: globex is B, acme
//! is A, both with the `prober` test guest) run in this process. B has one audio call sending paced 20 ms
//! frames at 16 kHz, each echo timed (the recorder's timestamps: frame queued → echo read back), and asks
//! the admin API for its agents every 100 ms, each answer timed. That runs once alone, then beside each of
//! A's attacks, side by side in one run:
//! - `cpu`: four calls of A whose guests spin for 150 ms of wall time per 20 ms frame (under their
//!   deadline; more than both cores), then forty;
//! - `pool`: A holds its whole `max_sessions` (100) of live calls;
//! - `log`: a call of A whose guest logs 1000 lines per frame;
//! - `bad tokens`: eight clients (127.0.0.2–9) ask the admin API without cease with 16 KiB tokens that are
//!   nobody's (refused before any hashing; past the failed-login rate, closed at accept);
//! - `activations`: A switches its active version back and forth without cease (most answered `429`, past
//!   A's request rate; the others read the component and take the registry's lock).
//!
//! The last column counts the attack's requests that got an HTTP answer, whatever its status.
//!
//! What is printed is a Markdown table (BENCHMARKS.md).

use anyhow::Result;
use sentsim::Call;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use voicehost_testkit::{
    audio_frame as frame, echo_latencies, paced_frames, prober_call, quantile, Hosting, ACME_TOKEN,
    GLOBEX_TOKEN,
};

/// Paced frames of B's call per row (6 s of audio).
const FRAMES: usize = 300;

#[derive(Clone, Copy, PartialEq)]
enum Attack {
    Alone,
    Cpu,
    ManyCpu,
    Pool,
    Log,
    BadTokens,
    Activations,
}

impl Attack {
    fn name(self) -> &'static str {
        match self {
            Attack::Alone => "nothing (alone)",
            Attack::Cpu => "4 calls × `spin 150`",
            Attack::ManyCpu => "40 calls × `spin 150`",
            Attack::Pool => "100 live calls (its whole `max_sessions`)",
            Attack::Log => "a call × `log 1000`",
            Attack::BadTokens => "8 clients with 16 KiB unknown tokens",
            Attack::Activations => "activate, activate again, … (two versions)",
        }
    }
}

fn main() -> Result<()> {
    voicehost::logging::init(voicehost::logging::DEFAULT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let attacks = [
        Attack::Alone,
        Attack::Cpu,
        Attack::ManyCpu,
        Attack::Pool,
        Attack::Log,
        Attack::BadTokens,
        Attack::Activations,
    ];
    let mut rows = Vec::new();
    for attack in attacks {
        rows.push((attack, runtime.block_on(run(attack))));
    }
    println!("| B beside A's | B's echoes | echo p50 | echo p99 | echo max | B's admin answers (200) | admin p50 | admin p99 | A's requests answered |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let alone = &rows[0].1;
    for (attack, row) in &rows {
        println!(
            "| {} | {}/{FRAMES} | {:.2} ms | {:.2} ms ({:.1}×) | {:.2} ms | {}/{} | {:.2} ms | {:.2} ms | {} |",
            attack.name(),
            row.echoes.len(),
            ms(quantile(&row.echoes, 0.5)),
            ms(quantile(&row.echoes, 0.99)),
            quantile(&row.echoes, 0.99).as_secs_f64() / quantile(&alone.echoes, 0.99).as_secs_f64().max(1e-9),
            ms(row.echoes.last().copied().unwrap_or(Duration::MAX)),
            row.admin_ok,
            row.admin.len(),
            ms(quantile(&row.admin, 0.5)),
            ms(quantile(&row.admin, 0.99)),
            row.attack_requests,
        );
    }
    Ok(())
}

struct Row {
    /// B's echo latencies, sorted.
    echoes: Vec<Duration>,
    /// B's admin answers' latencies, sorted, and how many were 200.
    admin: Vec<Duration>,
    admin_ok: usize,
    /// The attack's admin requests that got an answer (any status).
    attack_requests: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn run(attack: Attack) -> Row {
    let name = format!("tenants-bench-{}", attack as u8);
    let hosting = Hosting::start(&name, "").await;
    hosting.deploy(GLOBEX_TOKEN, "agent_globex", "prober").await;
    let first = hosting.deploy(ACME_TOKEN, "agent_acme", "prober").await;
    let b = hosting.connection("agent_globex").await;
    let a = hosting.connection("agent_acme").await;

    // A's calls, and the admin clients of the attack, until `stop`.
    let mut attackers: Vec<Call> = Vec::new();
    let mut held: Vec<Call> = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    match attack {
        Attack::Alone => {}
        Attack::Cpu => attackers.extend((0..4).map(|_| prober_call(&a, "spin 150"))),
        Attack::ManyCpu => attackers.extend((0..40).map(|_| prober_call(&a, "spin 150"))),
        Attack::Log => attackers.push(prober_call(&a, "log 1000")),
        Attack::Pool => held.extend((0..100).map(|_| a.start_audio(16_000))),
        Attack::BadTokens => {
            let token = "x".repeat(16 << 10);
            for client in 0..8 {
                let token = token.clone();
                clients.push(tokio::spawn(ask_until(
                    [127, 0, 0, 2 + client],
                    hosting.admin.clone(),
                    stop.clone(),
                    requests.clone(),
                    move |_| ("GET", "/v1/agents".into(), Some(token.clone()), Vec::new()),
                )));
            }
        }
        Attack::Activations => {
            let second = hosting
                .deploy(ACME_TOKEN, "agent_acme", "conformance")
                .await;
            clients.push(tokio::spawn(ask_until(
                [127, 0, 0, 2],
                hosting.admin.clone(),
                stop.clone(),
                requests.clone(),
                move |n| {
                    let version = if n % 2 == 0 { first } else { second };
                    let body = format!("{{\"version\":{version}}}").into_bytes();
                    let path = "/v1/agents/agent_acme/activate".to_string();
                    ("POST", path, Some(ACME_TOKEN.to_string()), body)
                },
            )));
        }
    }

    let mut call = b.start_audio(16_000);
    let warm = frame(9_999);
    call.send_audio(&warm);
    call.expect_audio(&warm).await.unwrap();
    let admin = tokio::spawn(admin_latencies(hosting.admin.clone()));

    let recorder = hosting.sim.recorder();
    let from = recorder.len();
    paced_frames(&call, &attackers, FRAMES).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    let (mut admin, admin_ok) = admin.await.unwrap();
    admin.sort();
    let mut echoes = echo_latencies(recorder, from, &call.id);
    echoes.sort();
    drop((attackers, held, call));
    hosting.finish().await;
    Row {
        echoes,
        admin,
        admin_ok,
        attack_requests: requests.load(Ordering::Relaxed),
    }
}

/// B's `GET /v1/agents`, every 100 ms while its call's frames go (`FRAMES` × 20 ms): each answer's
/// latency, and how many were 200.
async fn admin_latencies(admin: String) -> (Vec<Duration>, usize) {
    let mut latencies = Vec::new();
    let mut ok = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..FRAMES / 5 {
        tick.tick().await;
        let started = Instant::now();
        let answer =
            voicehost_testkit::admin::send(&admin, "GET", "/v1/agents", Some(GLOBEX_TOKEN), vec![])
                .await;
        latencies.push(started.elapsed());
        // A refusal or a closed connection counts against it: the column says how many were 200.
        ok += usize::from(matches!(answer, Ok((200, _))));
    }
    (latencies, ok)
}

/// One client of an attack, from loopback address `source`: the `n`th request is `what(n)`, one after another until `stop`.
async fn ask_until(
    source: [u8; 4],
    admin: String,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    what: impl Fn(u64) -> (&'static str, String, Option<String>, Vec<u8>),
) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let (method, path, token, body) = what(n);
        // Refused or answered, it goes on: the attack is the asking.
        let sent = voicehost_testkit::admin::send_from(
            source,
            &admin,
            method,
            &path,
            token.as_deref(),
            body,
        )
        .await;
        if sent.is_ok() {
            answered.fetch_add(1, Ordering::Relaxed);
        } else {
            // Closed at accept (or refused at once): without an await that waits, this loop would
            // hold a worker.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        n += 1;
    }
}
