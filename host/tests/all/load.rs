//! The load benchmark's Sent (`sentsim::load`, `scripts/bench-load`) in short, against voicehost in this
//! process: many audio calls over several connections, each frame tagged with its call, against the Wasm
//! conformance agent and the same agent as host code. What must hold is routing, not speed: every call
//! starts and echoes, and no frame comes back on another call.

use sentsim::load::{LoadReport, LoadSent, LoadSpec};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use voicehost::agent::{self, AgentConfig, CallRules, Dial};
use voicehost::sandbox::AgentCode;
use voicehost::stats::Stats;
use voicehost_testkit::{guest, sandbox, NativeConformance};

/// Serves `code` for `spec`'s calls and returns what Sent measured.
async fn load(code: AgentCode, spec: &LoadSpec) -> LoadReport {
    let sent = LoadSent::bind().await.unwrap();
    let config = AgentConfig::fixed(
        Dial::new(sent.url(), "agent_load", "sk_load"),
        code,
        CallRules::default(),
        spec.connections(),
    );
    let (stop, stopped) = watch::channel(false);
    let serving = tokio::spawn(agent::serve(config, Arc::new(Stats::default()), stopped));
    let report = sent.run(spec, |_| {}).await.unwrap();
    let _ = stop.send(true);
    serving.await.unwrap().unwrap();
    report
}

fn spec() -> LoadSpec {
    LoadSpec {
        // 20 calls on 3 connections.
        max_sessions: 8,
        measure: Duration::from_secs(1),
        ..LoadSpec::new(20)
    }
}

fn assert_served(report: &LoadReport, what: &str) {
    assert_eq!(report.failure, None, "{what}: {report:?}");
    assert_eq!(
        (
            report.started,
            report.connections,
            report.unplaced,
            report.silent
        ),
        (20, 3, 0, 0),
        "{what}: every call placed, on three connections, and echoing: {report:?}"
    );
    assert_eq!(report.misrouted, 0, "{what}: {report:?}");
    // A second of 20 calls at 50 frames a second; a busy machine may drop audio the writer is behind on
    // (the backlog bound), so echoes are counted, not all required.
    assert!(report.sent >= 500, "{what}: {report:?}");
    assert!(report.echoed > 0, "{what}: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_audio_calls_on_three_connections_echo_on_their_own_calls_from_the_component() {
    let code = sandbox().load(&guest("conformance")).unwrap();
    assert_served(&load(code, &spec()).await, "the component");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_audio_calls_on_three_connections_echo_on_their_own_calls_from_host_code() {
    let code = AgentCode::native(Arc::new(NativeConformance));
    assert_served(&load(code, &spec()).await, "host code");
}
