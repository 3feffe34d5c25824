//! The simulator's whole scenario suite against voicehost serving the Rust conformance component, with no
//! expected deviation: the scenarios the official SDK only passes for lack of a window (connection_full,
//! after the end) must pass here too.

use sentsim::suite::{self, Ctx, Profile};
use sentsim::{Sim, SimConfig};
use std::sync::Arc;
use tokio::sync::watch;
use voicehost::connection::Dial;
use voicehost::link::{self, AgentConfig};
use voicehost::sandbox::Sandbox;
use voicehost::session::CallRules;
use voicehost::stats::Stats;

fn guest(name: &str) -> Vec<u8> {
    let path = format!("{}/{name}.wasm", env!("VOICEHOST_GUESTS"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voicehost_passes_every_scenario_with_the_rust_conformance_agent() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let sandbox = Sandbox::new().unwrap();
    let code = sandbox.load(&guest("conformance")).unwrap();
    let config = AgentConfig {
        dial: Dial::new(
            sim.url(),
            sentsim::sim::CONFORMANCE_AGENT,
            sentsim::sim::CONFORMANCE_KEY,
        ),
        code,
        rules: CallRules::default(),
        connections: 1,
    };
    let (stop, stopped) = watch::channel(false);
    let stats = Arc::new(Stats::default());
    let host = tokio::spawn(link::serve(config, stats.clone(), stopped));
    let ctx = Ctx {
        sim: sim.clone(),
        profile: Profile {
            concurrent_audio: true,
        },
        poke: None,
    };
    let filter = std::env::var("SENTSIM_FILTER").unwrap_or_default();
    let report = suite::run(&ctx, &filter).await;
    println!("{report}\n{stats}");
    assert_eq!(report.failed(), 0, "\n{report}");
    if filter.is_empty() {
        // The last scenario refuses the host with 401: it stops with that refusal.
        let result = tokio::time::timeout(std::time::Duration::from_secs(5), host).await;
        let refused = result.expect("voicehost did not stop after a 401").unwrap();
        assert!(matches!(
            refused,
            Err(voicehost::connection::ConnectError::Refused { status: 401, .. })
        ));
    }
    let _ = stop.send(true);
    sim.shutdown();
}
