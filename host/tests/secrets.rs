//! Scenario `secrets_never_logged_at_trace`: with every log target at `trace`, as `RUST_LOG=trace` asks, a
//! call that connects, resumes on a new connection and gets Sent's refusals leaves neither the API key nor a
//! resume token nor Sent's error message in the host's log. A binary of its own, because it sets the
//! process's global subscriber and the `log` bridge (tungstenite logs through `log`).
//!
//! A second layer logs the same run with a plain `trace` filter, without the host's hold on the libraries
//! that see secrets: the key and the tokens must be in it, or the check above proves nothing.

use sentsim::sim::{Account, CONFORMANCE_AGENT};
use sentsim::{Dir, Sim, SimConfig, What};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;
use voicehost::agent::Dial;
use voicehost::agent::{self, AgentConfig, CallRules};
use voicehost::sandbox::Sandbox;
use voicehost::stats::Stats;

const API_KEY: &str = "sk_live_SECRETKEY0123456789";
const IN_ERROR_MESSAGE: &str = "vsr_SECRETINMESSAGE0123456789abcdef";

/// A log kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Every resume token Sent gave or the agent used in the run.
fn tokens(sim: &Sim) -> Vec<String> {
    let mut tokens = Vec::new();
    for record in sim.recorder().since(0, |r| r.json().is_some()) {
        let json = record.json().cloned().unwrap_or_default();
        for token in [&json["token"], &json["resume"]["token"]] {
            if let Some(token) = token.as_str() {
                tokens.push(token.to_string());
            }
        }
    }
    tokens
}

#[test]
fn secrets_never_logged_at_trace() {
    // Compiled before the log is set up: Cranelift's own trace output is large and beside the point.
    let wasm = voicehost_test_programs::read("conformance");
    let code = Sandbox::new().unwrap().load(&wasm).unwrap();
    let held = Captured::default();
    let plain = Captured::default();
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(held.clone())
                .with_ansi(false)
                .with_filter(voicehost::logging::filter(Some("trace"), "trace")),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(plain.clone())
                .with_ansi(false)
                .with_filter(tracing_subscriber::EnvFilter::new("trace")),
        )
        .try_init();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sim = runtime.block_on(async {
        let sim = Sim::start_local(SimConfig {
            heartbeat_interval_ms: 1000,
            accounts: vec![Account {
                api_key: API_KEY.into(),
                agents: vec![CONFORMANCE_AGENT.into()],
            }],
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let config = AgentConfig::fixed(
            Dial::new(sim.url(), CONFORMANCE_AGENT, API_KEY),
            code,
            CallRules::default(),
            1,
        );
        let (stop, stopped) = watch::channel(false);
        let host = tokio::spawn(agent::serve(config, Arc::new(Stats::default()), stopped));

        let conn = sim.connection().await.unwrap();
        let mut call = conn.start_text();
        call.expect_say("Hello from the conformance agent.").await.unwrap();
        // Sent refuses something with a message that quotes a token, and sends an invalid frame with one.
        conn.send_raw(&format!(
            r#"{{"type":"error","error":{{"code":"frame_not_allowed","message":"no: {IN_ERROR_MESSAGE}"}},"session_id":"{}","frame_type":"agent.say"}}"#,
            call.id
        ));
        conn.send_raw(&format!(
            r#"{{"type":"user.said","session_id":"{}","text":"","note":"{IN_ERROR_MESSAGE}"}}"#,
            call.id
        ));
        call.say("echo before");
        call.expect_say("before").await.unwrap();
        // A resume on a new connection: tokens both ways.
        conn.drop_abruptly();
        call.expect_resumed(Duration::from_secs(20)).await.unwrap();
        call.say("echo after");
        call.expect_say("after").await.unwrap();
        let _ = stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), host).await;
        sim
    });
    let tokens = tokens(&sim);
    assert!(tokens.len() >= 3, "the run used tokens: {tokens:?}");
    sim.shutdown();
    drop(runtime);

    let (held, plain) = (held.text(), plain.text());
    // The control: without the hold, the libraries log the key and the tokens.
    assert!(
        plain.contains(API_KEY),
        "the plain trace log has no API key: the check proves nothing"
    );
    assert!(
        tokens.iter().any(|t| plain.contains(t.as_str())),
        "the plain trace log has no token: the check proves nothing"
    );
    // The host's own trace lines are there.
    assert!(held.contains("session resumed"), "{held}");
    assert!(held.contains("Sent refused a frame"), "{held}");
    // And no secret.
    assert!(!held.contains(API_KEY), "the API key is in the log");
    for token in &tokens {
        assert!(
            !held.contains(token.as_str()),
            "a resume token is in the log"
        );
    }
    assert!(
        !held.contains(IN_ERROR_MESSAGE),
        "Sent's error message is in the log"
    );
    let recorded = sim_records_agent_frames(&sim);
    assert!(recorded > 0);
}

/// How many frames the agent sent in the run (the run did happen).
fn sim_records_agent_frames(sim: &Sim) -> usize {
    sim.recorder()
        .since(0, |r| {
            r.dir == Dir::FromAgent && matches!(r.what, What::Frame { .. })
        })
        .len()
}
