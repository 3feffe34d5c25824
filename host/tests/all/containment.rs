//! What one instance may make the host keep for it, beside its linear memory: the `hoarder` test guest
//! keeps `wasi:http` fields, unsent request bodies and random bytes, and the host's caps
//! (`voicehost::sandbox::limits`) stop it with a trap, counted by kind, while the call goes on.

use sentsim::{Call, ToolPlan};
use std::sync::Arc;
use std::time::Duration;
use voicehost::agent::CallRules;
use voicehost::sandbox::limits::{HTTP_BODY_CHUNK_BYTES, MAX_FIELDS_BYTES, MAX_HOSTCALL_BYTES};
use voicehost::sandbox::outbound::{MAX_AUTHORITY_BYTES, MAX_METHOD_BYTES};
use voicehost::sandbox::{HttpPolicy, Limits, Origin, TrapKind};
use voicehost_proto::call::{MAX_TOOL_ARGUMENTS_BYTES, MAX_TOOL_NAME_BYTES};
use voicehost_testkit::Host;

/// Rules for the hoarder: with `wasi:http` linked (one origin allowed; nothing listens there, nothing is
/// sent) or not, and a CPU budget of 10 s per handler call, so that on a loaded machine only the cap under
/// test stops the guest, never its CPU deadline.
fn rules(http: bool) -> CallRules {
    let origin: Origin = "http://127.0.0.1:9".parse().unwrap();
    let http = match http {
        true => HttpPolicy::allowing([origin]),
        false => HttpPolicy::default(),
    };
    CallRules {
        limits: Limits {
            http: Arc::new(http),
            cpu_per_call: Duration::from_secs(10),
            ..Limits::default()
        },
        ..CallRules::default()
    }
}

async fn hoarder(rules: CallRules) -> (Host, Call) {
    let host = Host::start("hoarder", rules).await;
    let mut call = host.connection().await.start_text();
    call.expect_say("Hello from the hoarder.").await.unwrap();
    (host, call)
}

/// The number after `prefix` in what the agent said.
async fn said_number(call: &mut Call, prefix: &str) -> usize {
    let what = format!("agent.say starting {prefix:?}");
    let frame = call
        .expect_frame(&what, |j| {
            j["type"] == "agent.say" && j["text"].as_str().is_some_and(|t| t.starts_with(prefix))
        })
        .await
        .unwrap();
    let rest = &frame["text"].as_str().unwrap()[prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

async fn still_answers(call: &mut Call) {
    call.say("echo alive");
    call.expect_say("alive").await.unwrap();
}

/// `command` traps the instance, once, as `kind`; a fresh one takes over and the call goes on.
async fn traps_as(host: &Host, call: &mut Call, command: &str, kind: TrapKind) {
    call.say(command);
    still_answers(call).await;
    let stats = &host.stats;
    assert_eq!(stats.trapped(kind), 1, "{command}: {stats}");
    assert_eq!(stats.traps(), 1, "{command}: {stats}");
    assert_eq!(stats.restarts.get(), 1, "{command}: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_keeping_http_fields_traps_at_the_handle_cap_and_the_call_goes_on() {
    let (host, mut call) = hoarder(rules(true)).await;
    call.say("fields 10 8");
    assert_eq!(
        said_number(&mut call, "kept 10 fields, ").await,
        10 * 8 * 1024
    );

    traps_as(&host, &mut call, "fields 100000 8", TrapKind::HostResources).await;
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http_fields_filled_past_its_size_cap_traps() {
    let (host, mut call) = hoarder(rules(true)).await;
    traps_as(
        &host,
        &mut call,
        &format!("fields 1 {}", MAX_FIELDS_BYTES / 1024),
        TrapKind::HostResources,
    )
    .await;
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsent_request_bodies_hold_two_small_chunks_each_and_trap_at_the_handle_cap() {
    let (host, mut call) = hoarder(rules(true)).await;
    call.say("bodies 10");
    let bytes = said_number(&mut call, "kept 10 bodies, ").await;
    assert!(bytes <= 10 * 2 * HTTP_BODY_CHUNK_BYTES, "{bytes}");

    traps_as(&host, &mut call, "bodies 100000", TrapKind::HostResources).await;
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_over_the_cap_trap_instead_of_being_made() {
    let (host, mut call) = hoarder(rules(false)).await;
    call.say("random 4096");
    assert_eq!(said_number(&mut call, "got ").await, 4096);

    traps_as(&host, &mut call, "random 1000000000", TrapKind::Other).await;
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_allowed_no_origin_has_no_wasi_http_and_its_imports_trap() {
    let (host, mut call) = hoarder(rules(false)).await;
    traps_as(&host, &mut call, "fields 1 1", TrapKind::Other).await;
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_arguments_and_names_over_their_caps_are_refused_before_the_host_parses_them() {
    let (host, mut call) = hoarder(rules(false)).await;
    call.say(&format!("tool {}", MAX_TOOL_ARGUMENTS_BYTES + 1));
    call.expect_say("tool: over-limit").await.unwrap();
    call.say(&format!("tool-name {}", MAX_TOOL_NAME_BYTES + 1));
    call.expect_say("tool: invalid").await.unwrap();
    still_answers(&mut call).await;
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outgoing_requests_authority_and_method_over_their_caps_are_refused() {
    let (host, mut call) = hoarder(rules(true)).await;
    call.say(&format!("authority {MAX_AUTHORITY_BYTES}"));
    call.expect_say("authority: ok").await.unwrap();
    call.say(&format!("authority {}", MAX_AUTHORITY_BYTES + 1));
    call.expect_say("authority: refused").await.unwrap();
    call.say(&format!("method {MAX_METHOD_BYTES}"));
    call.expect_say("method: ok").await.unwrap();
    call.say(&format!("method {}", MAX_METHOD_BYTES + 1));
    call.expect_say("method: refused").await.unwrap();
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_call_carrying_more_than_the_cap_traps_before_the_host_copies_it() {
    let (host, mut call) = hoarder(rules(false)).await;
    traps_as(
        &host,
        &mut call,
        &format!("say {}", MAX_HOSTCALL_BYTES + 1),
        TrapKind::HostResources,
    )
    .await;
    host.finish().await;
}

/// Reads the agent's frames until an `agent.say` whose text is `wanted`; when 5 s pass without one, says
/// `ask` (up to five times). Right after a flood of `say`s the call's queue may still be full, and the
/// agent's answer is refused `over-limit` until Sent has read what is queued.
pub(crate) async fn ask_until(
    call: &mut Call,
    ask: &str,
    wanted: impl Fn(&str) -> bool,
) -> serde_json::Value {
    let mut asked = 0;
    loop {
        match call.expect_frame(ask, |_| true).await {
            Ok(frame)
                if frame["type"] == "agent.say" && frame["text"].as_str().is_some_and(&wanted) =>
            {
                return frame;
            }
            Ok(_) => {}
            Err(error) => {
                assert!(asked < 5, "{ask}: {error:#}");
                call.say(ask);
                asked += 1;
            }
        }
    }
}

/// "<what>: ok <a>, refused <b> (<first reason>)", as the hoarder reports a flood: (a, b, reason). The
/// flood's own frames come first; the hoarder says its report when it can, and again on "report".
async fn flood_report(call: &mut Call, what: &str) -> (usize, usize, String) {
    let prefix = format!("{what}: ok ");
    let frame = ask_until(call, "report", |text| text.starts_with(&prefix)).await;
    let text = frame["text"].as_str().unwrap();
    let numbers: Vec<usize> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let reason = text.rsplit('(').next().unwrap().trim_end_matches(')');
    (numbers[0], numbers[1], reason.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_says_reaches_sent_exactly_as_taken_and_the_rest_is_refused_over_limit() {
    let (host, mut call) = hoarder(rules(false)).await;
    let n = 20_000;
    call.say(&format!("flood say {n}"));
    let (ok, refused, reason) = flood_report(&mut call, "say").await;
    assert_eq!(ok + refused, n);
    if refused > 0 {
        assert_eq!(reason, "over-limit");
    }
    ask_until(&mut call, "echo alive", |text| text == "alive").await;
    // Every `say` the host took reached Sent once, in order; none it refused did.
    let flooded: Vec<usize> = call
        .accepted_frames()
        .iter()
        .filter_map(|j| j["text"].as_str()?.strip_prefix("flood ")?.parse().ok())
        .collect();
    assert_eq!(flooded.len(), ok, "taken {ok}, refused {refused}");
    assert!(flooded.windows(2).all(|w| w[0] < w[1]), "out of order");
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_log_lines_is_cut_to_the_rate_and_the_dropped_lines_are_counted() {
    let (host, mut call) = hoarder(rules(false)).await;
    let n = 5_000;
    call.say(&format!("flood log {n}"));
    assert_eq!(flood_report(&mut call, "log").await, (n, 0, "-".into()));
    still_answers(&mut call).await;
    // 20 lines a second pass; the handler takes a second or two at most on a loaded machine.
    let dropped = host.stats.log_dropped.get() as usize;
    assert!(
        dropped >= n - 100 && dropped <= n,
        "dropped {dropped} of {n}"
    );
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_tool_calls_is_answered_one_by_one_and_each_reaches_sent_once() {
    let (host, mut call) = hoarder(rules(false)).await;
    let n = 40;
    call.say(&format!("flood tool {n}"));
    assert_eq!(flood_report(&mut call, "tool").await, (n, 0, "-".into()));
    still_answers(&mut call).await;
    let tools = call
        .accepted_frames()
        .iter()
        .filter(|j| j["type"] == "tool.call" && j["name"] == "send_dtmf")
        .count();
    assert_eq!(tools, n);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_waiting_on_a_tool_sent_never_answers_is_released_at_the_tool_timeout() {
    let mut rules = rules(false);
    rules.call.tool_timeout = Duration::from_millis(300);
    let (host, mut call) = hoarder(rules).await;
    call.plan_tool("send_dtmf", ToolPlan::Hold);
    call.say("flood tool 3");
    assert_eq!(
        flood_report(&mut call, "tool").await,
        (0, 3, "timed-out".into())
    );
    still_answers(&mut call).await;
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    host.finish().await;
}

/// A component of `modules` core modules, each with a memory and a table, each instantiated once.
fn component_with(modules: u32) -> Vec<u8> {
    let mut text = String::from("(component\n");
    for n in 0..modules {
        text.push_str(&format!(
            "  (core module $m{n} (memory 1) (table 1 funcref))\n  (core instance (instantiate $m{n}))\n"
        ));
    }
    text.push(')');
    wat::parse_str(text).unwrap()
}

#[test]
fn a_component_over_the_pools_per_component_maxima_is_refused_when_it_is_loaded() {
    use voicehost::sandbox::limits::MAX_MEMORIES_PER_COMPONENT;
    let sandbox = voicehost_testkit::sandbox();
    // At the maximum, the pool takes it; it is refused only for not being an agent.
    let at = sandbox
        .load(&component_with(MAX_MEMORIES_PER_COMPONENT))
        .err()
        .unwrap();
    assert!(
        matches!(at, voicehost::sandbox::LoadError::WrongWorld(_)),
        "{at}"
    );
    let over = sandbox
        .load(&component_with(MAX_MEMORIES_PER_COMPONENT + 1))
        .err()
        .unwrap();
    let message = over.to_string();
    assert!(
        matches!(over, voicehost::sandbox::LoadError::OverInstanceLimits(_)),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "exceeds the configured maximum of {MAX_MEMORIES_PER_COMPONENT}"
        )),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_traps_a_guest_growing_past_its_guest_memory_budget() {
    use sentsim::sim::Account;
    use sentsim::{Sim, SimConfig};
    let sim = Sim::start_local(SimConfig {
        accounts: vec![Account {
            api_key: crate::operator::KEY.into(),
            agents: vec!["agent_budget".into()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    // 16 MiB for every call's guests together, under the instance's own 64 MiB cap; one trap and the
    // call gets its failure policy. Killed when dropped, on every path.
    let mut command = std::process::Command::new(crate::operator::BIN);
    command
        .args(["run", "--agent", voicehost_test_programs::HOG])
        .args(["--agent-id", "agent_budget", "--url", &sim.url()])
        .args(["--guest-memory-mib", "16", "--max-traps", "1"])
        .env("SENT_API_KEY", crate::operator::KEY)
        .env("RUST_LOG", "warn")
        .env_remove("VOICEHOST_CACHE_DIR");
    let (run, _) = crate::operator::Served::spawn(command);
    let conn = sim.connection().await.unwrap();
    let mut call = conn.start_text();
    call.expect_say("Hello from the hog.").await.unwrap();
    // 20 MiB fit the instance's cap, not the host's budget: the growth traps, and the policy hangs up.
    call.say("take 20");
    call.expect_tool("hangup").await.unwrap();
    run.wait_for_log("guest_memory_mib");
    drop(run);
    sim.shutdown();
}

#[test]
fn run_refuses_limits_out_of_range_before_reading_anything() {
    // No API key and no component: each flag's own error must come first.
    for (flag, value, problem) in [
        (
            "--guest-memory-mib",
            "8",
            "--guest-memory-mib = 8: use 16 to 16777216",
        ),
        (
            "--guest-memory-mib",
            "16777217",
            "--guest-memory-mib = 16777217: use 16 to 16777216",
        ),
        ("--memory-mib", "0", "--memory-mib"),
        ("--max-traps", "0", "--max-traps 0"),
    ] {
        let out = std::process::Command::new(crate::operator::BIN)
            .args([
                "run",
                "--agent",
                "/nonexistent/agent.wasm",
                "--agent-id",
                "agent_x",
            ])
            .args([flag, value])
            .env_remove("SENT_API_KEY")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(problem),
            "{flag} {value}: {stderr}"
        );
    }
}
