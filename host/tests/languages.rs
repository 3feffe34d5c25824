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

/// The repository's root.
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `voicehost test` on `agent` with the scenarios at `scenarios`, from `dir`: every test passes.
fn voicehost_test_passes(dir: &std::path::Path, agent: &str, scenarios: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_voicehost"))
        .args(["test", "--agent", agent, scenarios])
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "voicehost test --agent {agent}:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.ends_with("9 passed, 0 failed\n"), "{stdout}");
}

/// The conformance agent of `lang` (at `target/guests/<lang>/<file>`) passes `voicehost test` with the
/// conformance scenarios it ships with.
fn shipped_scenarios_pass(lang: &str, file: &str) {
    let agent = repo().join("target/guests").join(lang).join(file);
    let scenarios = repo().join("examples/conformance/tests/scenarios.toml");
    voicehost_test_passes(
        &repo(),
        agent.to_str().unwrap(),
        scenarios.to_str().unwrap(),
    );
}

/// `voicehost new desk --lang LANG` in a fresh directory, its `build.sh` as generated (the toolchains
/// shared with the repository's, so that they are not installed again), then `voicehost test` on what it
/// built with the project's own scenarios; `also` names other components the build wrote, tested too.
fn a_new_project_builds_and_passes(lang: &str, also: &[&str]) {
    let parent = voicehost_testkit::author_dir(&format!("new-{lang}"), &[]);
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_voicehost"))
        .args(["new", "desk", "--lang", lang])
        .current_dir(&parent)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let project = parent.join("desk");
    let built = std::process::Command::new("./build.sh")
        .current_dir(&project)
        .env("VOICEHOST_TOOLS", repo().join("target/tools"))
        .env("CARGO_TARGET_DIR", repo().join("target/guests"))
        .status()
        .unwrap();
    assert!(built.success(), "{lang}: build.sh failed");
    for agent in std::iter::once("target/agent.wasm").chain(also.iter().copied()) {
        voicehost_test_passes(&project, agent, "tests/scenarios.toml");
    }
    std::fs::remove_dir_all(&parent).unwrap();
}

#[test]
#[ignore = "needs the Python toolchain: scripts/test builds the agent and runs this"]
fn the_python_conformance_agent_passes_its_shipped_scenarios() {
    shipped_scenarios_pass("python", "conformance.wasm");
}

#[test]
#[ignore = "needs the JavaScript toolchain: scripts/test builds the agent and runs this"]
fn the_javascript_conformance_agents_pass_their_shipped_scenarios() {
    shipped_scenarios_pass("js", "conformance.wasm");
    shipped_scenarios_pass("js", "conformance-qjs.wasm");
}

#[test]
#[ignore = "needs the C toolchain: scripts/test builds the agent and runs this"]
fn the_c_conformance_agent_passes_its_shipped_scenarios() {
    shipped_scenarios_pass("c", "conformance.wasm");
}

#[test]
#[ignore = "builds a generated project with the language's toolchain: scripts/test runs this"]
fn a_new_rust_agent_builds_and_passes_voicehost_test_and_its_unit_tests() {
    a_new_project_builds_and_passes("rust", &[]);
    let parent = voicehost_testkit::author_dir("new-rust-unit", &[]);
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_voicehost"))
        .args(["new", "desk", "--lang", "rust"])
        .current_dir(&parent)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let tested = std::process::Command::new("cargo")
        .args(["test", "--quiet"])
        .current_dir(parent.join("desk"))
        .env("CARGO_TARGET_DIR", repo().join("target/guests"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&tested.stdout);
    assert!(tested.status.success(), "{tested:?}");
    // The generated agent's own unit tests ran, on the SDK's stand-in for the host.
    let ran = out
        .lines()
        .filter_map(|line| line.strip_prefix("test result: ok. "))
        .filter_map(|rest| rest.split(' ').next()?.parse::<u32>().ok())
        .sum::<u32>();
    assert!(ran > 0, "{out}");
    std::fs::remove_dir_all(&parent).unwrap();
}

#[test]
#[ignore = "builds a generated project with the language's toolchain: scripts/test runs this"]
fn a_new_javascript_agent_builds_and_passes_voicehost_test() {
    a_new_project_builds_and_passes("js", &["target/agent-qjs.wasm"]);
}

#[test]
#[ignore = "builds a generated project with the language's toolchain: scripts/test runs this"]
fn a_new_python_agent_builds_and_passes_voicehost_test() {
    a_new_project_builds_and_passes("python", &[]);
}

#[test]
#[ignore = "builds a generated project with the language's toolchain: scripts/test runs this"]
fn a_new_c_agent_builds_and_passes_voicehost_test() {
    a_new_project_builds_and_passes("c", &[]);
}
