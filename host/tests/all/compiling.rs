//! Compiling uploads in child processes under bounds (`[compile]`): a component built to compile slowly,
//! or to need gigabytes to compile, is stopped and refused; while one tenant's compile runs, the other
//! tenant uploads, activates, reads and takes calls; nothing of a stopped compile stays behind.

use std::time::{Duration, Instant};
use voicehost_testkit::{metric, Hosting, ACME_TOKEN, GLOBEX_TOKEN};

/// A component whose one function Cranelift takes minutes to compile (measured: over 20 s of CPU in the
/// debug build, with under 100 MiB): 2,000 locals and a 40,000-statement loop, 390 KB.
fn slow_to_compile() -> Vec<u8> {
    let locals = 2000;
    let body: String = (0..40_000)
        .map(|i| {
            format!(
                "(local.set {} (i64.add (local.get {}) (local.get {})))",
                1 + (i * 7) % locals,
                1 + (i * 13) % locals,
                1 + (i * 31) % locals
            )
        })
        .collect();
    component_of(&format!(
        "(func (export \"f\") (param i64) (result i64) (local {}) (loop $l {body} (br_if $l \
         (i64.eqz (local.get 0)))) (local.get 1))",
        "i64 ".repeat(locals)
    ))
}

/// A component whose one function needs over a gigabyte to compile (measured: 2 million values on the
/// operand stack took 1.26 GB; this has half as many), 3 MB.
fn big_to_compile() -> Vec<u8> {
    let values = 1_000_000;
    let body = "local.get 0\n".repeat(values) + &"i64.add\n".repeat(values - 1);
    component_of(&format!(
        "(func (export \"f\") (param i64) (result i64) {body})"
    ))
}

fn component_of(func: &str) -> Vec<u8> {
    wat::parse_str(format!("(component (core module {func}))")).unwrap()
}

/// Compiling children of this test's host still running: `voicehost compile-component` writing under
/// `dir`.
fn compiles_running(dir: &std::path::Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains("compile-component") && cmdline.contains(&dir))
        .count()
}

/// Uploads `wasm` as acme's `agent`: (status, answer).
async fn upload(hosting: &Hosting, agent: &str, wasm: Vec<u8>) -> (u16, serde_json::Value) {
    hosting
        .api(
            "POST",
            &format!("/v1/agents/{agent}/versions"),
            Some(ACME_TOKEN),
            wasm,
        )
        .await
}

/// What is left in the compiled cache but compiled forms (`.cwasm`): files of compiles cut short.
fn leftovers(hosting: &Hosting) -> Vec<String> {
    hosting
        .files("compiled")
        .into_iter()
        .filter(|name| !name.ends_with(".cwasm"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_over_its_cpu_bound_is_stopped_and_the_upload_refused_with_nothing_kept() {
    let hosting = Hosting::start_with("compile-cpu", "[compile]\ncpu_seconds = 1", "").await;
    let (status, answer) = upload(&hosting, "agent_slow", slow_to_compile()).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "over_limits", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    // Its CPU limit, or (on a busy machine, where the child's lower priority starves it) its deadline.
    assert!(
        message.contains("compiling it took over 1 s of CPU")
            || message.contains("compiling it took over 3 s"),
        "{message}"
    );
    let (status, _) = hosting
        .api("GET", "/v1/agents/agent_slow", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 404, "nothing was stored");
    assert_eq!(hosting.files("compiled"), Vec::<String>::new());
    assert_eq!(compiles_running(&hosting.dir), 0);
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_over_its_memory_bound_is_stopped_and_the_upload_refused() {
    let hosting = Hosting::start_with("compile-memory", "[compile]\nmemory_mib = 256", "").await;
    let (status, answer) = upload(&hosting, "agent_big", big_to_compile()).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "over_limits", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("compiling it needed over 256 MiB"),
        "{message}"
    );
    assert_eq!(leftovers(&hosting), Vec::<String>::new());
    // The bound is the compile's, not the host's: a real agent still compiles under it.
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_one_tenant_compiles_slowly_the_other_uploads_activates_reads_and_takes_calls() {
    let hosting = Hosting::start("compile-slow", "").await;
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "conformance")
        .await;
    let (status, _) = hosting
        .api(
            "POST",
            "/v1/agents/agent_globex/versions",
            Some(GLOBEX_TOKEN),
            voicehost_testkit::guest("panicker"),
        )
        .await;
    assert_eq!(status, 201);

    // acme's upload compiles for minutes.
    let slow = tokio::spawn({
        let admin = hosting.admin.clone();
        async move {
            voicehost_testkit::request(
                &admin,
                "POST",
                "/v1/agents/agent_slow/versions",
                Some(ACME_TOKEN),
                slow_to_compile(),
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while compiles_running(&hosting.dir) == 0 {
        assert!(Instant::now() < deadline, "acme's compile never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Meanwhile globex: reads, activates a compiled version, rolls back, uploads a new one (compiled in
    // the other slot), and its agent takes a call.
    let (status, agents) = hosting
        .api("GET", "/v1/agents", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!(status, 200, "{agents}");
    for (method, path, body) in [
        (
            "POST",
            "/v1/agents/agent_globex/activate",
            r#"{"version": 2}"#,
        ),
        ("POST", "/v1/agents/agent_globex/rollback", ""),
    ] {
        let (status, answer) = hosting
            .api(method, path, Some(GLOBEX_TOKEN), body.as_bytes().to_vec())
            .await;
        assert_eq!(status, 200, "{method} {path}: {answer}");
    }
    let (status, answer) = hosting
        .api(
            "POST",
            "/v1/agents/agent_globex/versions",
            Some(GLOBEX_TOKEN),
            voicehost_testkit::guest("hoarder"),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let mut call = hosting.connection("agent_globex").await.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    call.end("completed");
    assert!(
        !slow.is_finished(),
        "acme's compile ended before globex was done: the test proves nothing"
    );
    assert_eq!(compiles_running(&hosting.dir), 1);

    // acme gives up: its compile is stopped, and leaves nothing.
    slow.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while compiles_running(&hosting.dir) > 0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned upload's compile still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(leftovers(&hosting), Vec::<String>::new());
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_of_bytes_another_tenant_holds_compiles_as_if_they_were_new() {
    let hosting = Hosting::start("compile-oracle", "").await;
    let counts = |text: &str| {
        (
            metric(text, "voicehost_compilations_total"),
            metric(text, "voicehost_compiled_cache_loads_total"),
        )
    };
    let wasm = voicehost_testkit::guest("conformance");
    let upload_as = |token: &'static str, agent: &'static str| {
        let wasm = wasm.clone();
        let hosting = &hosting;
        async move {
            let (status, answer) = hosting
                .api(
                    "POST",
                    &format!("/v1/agents/{agent}/versions"),
                    Some(token),
                    wasm,
                )
                .await;
            assert_eq!(status, 201, "{answer}");
        }
    };
    upload_as(ACME_TOKEN, "agent_acme").await;
    let before = counts(&hosting.metrics().await);
    // globex uploads what acme holds: compiled again, so it takes as long as any new upload.
    upload_as(GLOBEX_TOKEN, "agent_globex").await;
    let after = counts(&hosting.metrics().await);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1.0, 0.0));
    // Its own bytes again: from the cache.
    upload_as(GLOBEX_TOKEN, "agent_globex").await;
    let again = counts(&hosting.metrics().await);
    assert_eq!((again.0 - after.0, again.1 - after.1), (0.0, 1.0));
    hosting.finish().await;
}
