//! The scenario suite against conformance agents written in other languages, each built by its own
//! `examples/<lang>/build.sh` with pinned toolchains into `target/guests/<lang>/`. These need those
//! toolchains (npm, pip, apt), so they are ignored by a plain `cargo test`; `scripts/test` builds the agents
//! and runs them with `--include-ignored`, one at a time.

use sentsim::suite::{self, Ctx, Profile};
use voicehost::agent::CallRules;
use voicehost_testkit::Host;

/// Runs the whole suite against `target/guests/<lang>/<file>` and fails with the table if any scenario fails.
async fn suite_passes(lang: &str, file: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/guests")
        .join(lang)
        .join(file);
    let wasm = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it with examples/{lang}/build.sh (scripts/test does)",
            path.display()
        )
    });
    let host = Host::serve(&wasm, CallRules::default()).await;
    let ctx = Ctx {
        sim: host.sim.clone(),
        profile: Profile {
            concurrent_audio: true,
        },
        poke: None,
    };
    let report = suite::run(&ctx, "").await;
    println!("{lang} ({file}):\n{report}");
    assert_eq!(report.failed(), 0, "\n{report}");
    let refused = host.stopped().await;
    assert!(
        refused.is_err(),
        "the agent did not stop after the 401: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Python toolchain: scripts/test builds the agent and runs this"]
async fn the_python_conformance_agent_passes_every_scenario() {
    suite_passes("python", "conformance.wasm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the JavaScript toolchain: scripts/test builds the agent and runs this"]
async fn the_javascript_conformance_agent_on_quickjs_passes_every_scenario() {
    suite_passes("js", "conformance-qjs.wasm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the JavaScript toolchain: scripts/test builds the agent and runs this"]
async fn the_javascript_conformance_agent_on_starlingmonkey_passes_every_scenario() {
    suite_passes("js", "conformance.wasm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the C toolchain: scripts/test builds the agent and runs this"]
async fn the_c_conformance_agent_passes_every_scenario() {
    suite_passes("c", "conformance.wasm").await;
}
