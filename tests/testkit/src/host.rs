//! What the end-to-end tests share: one sandbox, the example agents, and a host serving one of them against
//! the Sent simulator on loopback.

use sentsim::{ConnHandle, Sim, SimConfig};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use voicehost::agent::CallRules;
use voicehost::agent::{self, AgentConfig};
use voicehost::agent::{ConnectError, Dial};
use voicehost::sandbox::Sandbox;
use voicehost::stats::Stats;

/// One engine for every test in this file: each one reserves a pool of instance slots, so a test does not
/// need its own.
pub fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        // Large components (Python, JavaScript) are compiled once across test runs.
        let cache = crate::tmp_dir().join("components");
        Sandbox::new()
            .expect("the sandbox starts")
            .with_cache(cache)
    })
}

/// Logs as `RUST_LOG` says, into the test's output.
pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let directives = std::env::var("RUST_LOG").ok();
    let layer = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(voicehost::logging::filter(directives.as_deref(), "off"));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// The component of the test guest `name`, as voicehost-test-programs built it.
///
/// # Panics
/// If there is no guest of that name, or its file cannot be read.
pub fn guest(name: &str) -> Vec<u8> {
    voicehost_test_programs::read(name)
}

/// The simulator and a host serving one example agent on it.
pub struct Host {
    /// The simulated Sent the host is connected to.
    pub sim: Sim,
    /// What the host counts and measures as it serves, for tests to check.
    pub stats: Arc<Stats>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ConnectError>>,
}

impl Host {
    /// A host serving the guest program `agent` (built by voicehost-test-programs).
    pub async fn start(agent: &str, rules: CallRules) -> Host {
        Host::serve(&guest(agent), rules).await
    }

    /// A host serving the component `wasm`.
    pub async fn serve(wasm: &[u8], rules: CallRules) -> Host {
        let config = SimConfig {
            heartbeat_interval_ms: 1000,
            ..SimConfig::default()
        };
        Host::serve_with(wasm, rules, 1, config).await
    }

    /// A host serving the component `wasm` with `connections` to Sent, on a simulator started with `sim`.
    pub async fn serve_with(
        wasm: &[u8],
        rules: CallRules,
        connections: usize,
        sim: SimConfig,
    ) -> Host {
        init_tracing();
        let sim = Sim::start_local(sim).await.unwrap();
        let code = sandbox().load(wasm).expect("the component loads");
        let config = AgentConfig::fixed(
            Dial::new(
                sim.url(),
                sentsim::sim::CONFORMANCE_AGENT,
                sentsim::sim::CONFORMANCE_KEY,
            ),
            code,
            rules,
            connections,
        );
        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(agent::serve(config, stats.clone(), stopped));
        Host {
            sim,
            stats,
            stop,
            task,
        }
    }

    /// The host's newest usable connection to the simulator (see [`Sim::connection`]).
    ///
    /// # Panics
    /// If the host opens none the simulator can use in time.
    pub async fn connection(&self) -> ConnHandle {
        self.sim.connection().await.unwrap()
    }

    /// Waits for the host to stop on its own (a fatal refusal), and returns why.
    pub async fn stopped(self) -> Result<(), ConnectError> {
        let result = tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the host did not stop")
            .expect("the host's task did not panic");
        let _ = self.stop.send(true);
        self.sim.shutdown();
        result
    }

    /// Checks the host broke no protocol rule, stops it and the simulator.
    pub async fn finish(self) {
        let violations = self.sim.violations_since(0);
        assert!(
            violations.is_empty(),
            "the host broke protocol rules: {violations:#?}"
        );
        let _ = self.stop.send(true);
        let stopped = tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the host stops when told to")
            .expect("the host's task did not panic");
        assert!(stopped.is_ok(), "the host stopped with {stopped:?}");
        self.sim.shutdown();
    }
}
