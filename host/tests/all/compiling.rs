//! Compiling uploads in child processes under bounds (`[compile]`): a component built to compile slowly,
//! or to need gigabytes to compile, is stopped and refused; while one tenant's compile runs, the other
//! tenant uploads, activates, reads and takes calls; nothing of a stopped compile stays behind.

use std::time::{Duration, Instant};
use voicehost::sandbox::LoadError;
use voicehost_testkit::{metric, Hosting, ACME_TOKEN, GLOBEX_TOKEN};

/// A component whose one function Cranelift takes minutes to compile (measured: 40,000 statements took over
/// 20 s of CPU, with under 100 MiB): 2,000 locals and a 60,000-statement loop, 600 KB.
fn slow_to_compile() -> Vec<u8> {
    let locals = 2000;
    let body: String = (0..60_000)
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

/// Runs the compiling child as `serve` does, on `wasm`, with these bounds: how it ended, and what it said.
fn child(wasm: &[u8], cpu_seconds: u64, memory_mib: u64) -> (std::process::ExitStatus, String) {
    use std::io::Write as _;
    let out = voicehost_testkit::tmp_dir().join(format!(
        "child-{}-{cpu_seconds}-{memory_mib}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&out);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut child = std::process::Command::new(crate::operator::BIN)
        .args(["compile-component", "--output"])
        .arg(&out)
        .args(["--cpu-seconds", &cpu_seconds.to_string()])
        .args(["--memory-bytes", &(memory_mib << 20).to_string()])
        .args(["--parent", &std::process::id().to_string()])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(wasm);
    let output = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&out);
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_compiling_child_is_stopped_by_the_kernel_at_its_cpu_and_memory_bounds() {
    use std::os::unix::process::ExitStatusExt as _;
    // Its own RLIMIT_CPU, with no parent to enforce a deadline.
    let (status, said) = child(&slow_to_compile(), 1, 2048);
    assert_eq!(
        status.signal(),
        Some(24),
        "SIGXCPU expected: {status:?} {said}"
    );
    // Its own RLIMIT_AS: an allocation fails (Rust aborts) or wasmtime reports it (exit 4).
    let (status, said) = child(&big_to_compile(), 60, 256);
    assert!(
        status.signal() == Some(6) || status.code() == Some(4),
        "{status:?} {said}"
    );
    // A real agent compiles under the same memory bound.
    let (status, said) = child(&voicehost_testkit::guest("conformance"), 60, 256);
    assert!(status.success(), "{status:?} {said}");
}

#[test]
fn a_compiling_child_whose_host_is_gone_compiles_nothing() {
    let mut child = std::process::Command::new(crate::operator::BIN)
        .args(["compile-component", "--output", "/nonexistent/x"])
        .args(["--cpu-seconds", "1", "--memory-bytes", "1073741824"])
        .args(["--parent", "1"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("the host is gone"), "{said}");
}

/// A request sent in the background, as acme.
fn in_background(
    hosting: &Hosting,
    path: &'static str,
    body: Vec<u8>,
) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    let admin = hosting.admin.clone();
    tokio::spawn(async move {
        voicehost_testkit::request(&admin, "POST", path, Some(ACME_TOKEN), body).await
    })
}

/// Starts acme's upload of [`slow_to_compile`] in the background, once its compile is running.
async fn slow_upload(hosting: &Hosting) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    let slow = in_background(hosting, "/v1/agents/agent_slow/versions", slow_to_compile());
    let deadline = Instant::now() + Duration::from_secs(30);
    while compiles_running(&hosting.dir) == 0 {
        assert!(Instant::now() < deadline, "the slow compile never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    slow
}

/// Uploads `wasm` as the `token`'s tenant's `agent`: (status, answer).
async fn upload(
    hosting: &Hosting,
    token: &str,
    agent: &str,
    wasm: Vec<u8>,
) -> (u16, serde_json::Value) {
    hosting
        .api(
            "POST",
            &format!("/v1/agents/{agent}/versions"),
            Some(token),
            wasm,
        )
        .await
}

/// Uploads `wasm` as acme's `agent`, which must be refused `422 over_limits`: the refusal's message.
async fn refused_over_limits(hosting: &Hosting, agent: &str, wasm: Vec<u8>) -> String {
    let (status, answer) = upload(hosting, ACME_TOKEN, agent, wasm).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "over_limits", "{answer}");
    answer["error"]["message"].as_str().unwrap().to_string()
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
    let message = refused_over_limits(&hosting, "agent_slow", slow_to_compile()).await;
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
    let message = refused_over_limits(&hosting, "agent_big", big_to_compile()).await;
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
    let (status, answer) = upload(
        &hosting,
        GLOBEX_TOKEN,
        "agent_globex",
        voicehost_testkit::guest("panicker"),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // acme's upload compiles for minutes.
    let slow = slow_upload(&hosting).await;

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
    let (status, answer) = upload(
        &hosting,
        GLOBEX_TOKEN,
        "agent_globex",
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
        let (wasm, hosting) = (wasm.clone(), &hosting);
        async move {
            let (status, answer) = upload(hosting, token, agent, wasm).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_that_waited_for_a_compile_while_the_agent_was_replaced_is_refused() {
    let hosting = Hosting::start("compile-replaced", "").await;
    // agent_acme's version 1 is the conformance agent, not active; acme also holds the panicker's bytes
    // (so uploading them again comes from the cache, not the compile queue).
    let (status, first) = upload(
        &hosting,
        ACME_TOKEN,
        "agent_acme",
        voicehost_testkit::guest("conformance"),
    )
    .await;
    assert_eq!(status, 201, "{first}");
    hosting.deploy(ACME_TOKEN, "agent_acme2", "panicker").await;
    // Version 1's compiled form is gone (a cache lost in an upgrade): activating it must compile.
    let hex = first["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    for name in hosting.files("compiled") {
        if name.starts_with(&hex) {
            std::fs::remove_file(hosting.dir.join("data/compiled").join(name)).unwrap();
        }
    }
    // acme's turn to compile is held by a slow upload; the activation queues behind it.
    let slow = slow_upload(&hosting).await;
    let activate = in_background(
        &hosting,
        "/v1/agents/agent_acme/activate",
        br#"{"version": 1}"#.to_vec(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the agent is deleted and uploaded again: its new version 1 is the panicker.
    let (status, answer) = hosting
        .api("DELETE", "/v1/agents/agent_acme", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 204, "{answer}");
    let (status, again) = upload(
        &hosting,
        ACME_TOKEN,
        "agent_acme",
        voicehost_testkit::guest("panicker"),
    )
    .await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["version"], 1);
    slow.abort();
    // The activation asked for the version 1 that was deleted: refused, nothing served.
    let (status, answer) = activate.await.unwrap();
    assert_eq!(status, 409, "{answer}");
    let (_, record) = hosting
        .api("GET", "/v1/agents/agent_acme", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(
        record["active_version"],
        serde_json::Value::Null,
        "{record}"
    );
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_declaring_more_tables_or_memories_than_an_instance_may_have_is_refused_at_upload(
) {
    let hosting = Hosting::start("compile-declared", "").await;
    let big_table =
        "(component (core module (table 200000 funcref)) (core instance (instantiate 0)))";
    let memories = "(component (core module (memory 1) (memory 1)))";
    // Five instances of a module with one memory: each module fits, the component does not (4 at most).
    let instances = format!(
        "(component (core module $m (memory 1)) {})",
        "(core instance (instantiate $m)) ".repeat(5)
    );
    for (text, limit) in [
        (big_table, "exceeds the limit of 100000"),
        (memories, "memories"),
        (instances.as_str(), "5 Wasm linear memories"),
    ] {
        let wasm = wat::parse_str(text).unwrap();
        // In a compiling child (serve), and in this process (`voicehost run`): the same refusal.
        let message = refused_over_limits(&hosting, "agent_declared", wasm.clone()).await;
        assert!(
            message.contains("declares more than an instance may have") && message.contains(limit),
            "{message}"
        );
        let here = voicehost_testkit::sandbox().load(&wasm).err().unwrap();
        assert!(
            matches!(&here, LoadError::OverInstanceLimits(why) if why.contains(limit)),
            "{here:?}"
        );
    }
    assert!(
        hosting.files("uploads").is_empty(),
        "{:?}",
        hosting.files("uploads")
    );
    let (status, _) = hosting
        .api("GET", "/v1/agents/agent_declared", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 404, "nothing was stored");
    assert_eq!(leftovers(&hosting), Vec::<String>::new());
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_whose_refused_compiles_used_its_compile_time_waits_and_another_compiles_meanwhile(
) {
    // acme may hold a compile slot 1 s an hour; one compile stopped at its 1 s of CPU spends it.
    let top = "[compile]\ncpu_seconds = 1\ntenant_seconds_per_hour = 1";
    let hosting = Hosting::start_with("compile-time", top, "").await;
    refused_over_limits(&hosting, "agent_slow", slow_to_compile()).await;
    // Refused before its body is read, with when to come back.
    let (status, answer) = upload(&hosting, ACME_TOKEN, "agent_acme", b"\0asm".to_vec()).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "busy", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("used the 1 s of compile time it gets per hour"),
        "{message}"
    );
    // globex's compile time is its own: its upload is compiled (and refused for its own cost), not
    // turned away.
    let (status, answer) = upload(&hosting, GLOBEX_TOKEN, "agent_globex", slow_to_compile()).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "over_limits", "{answer}");
    hosting.finish().await;
}
