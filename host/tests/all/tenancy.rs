//! Many tenants on one host, through the admin API: isolation, uploads that cannot serve, versions going
//! live under calls, restarts, and the limits a tenant's config sets. The server runs in-process; its
//! agents take real calls from the Sent simulator on loopback.

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use voicehost_testkit::{metric, Hosting, ACME_TOKEN, GLOBEX_TOKEN};

const ACME: &str = "tenant=\"acme\",agent=\"agent_acme\"";

fn body(value: Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// Waits until `check` holds for the server's metrics.
async fn until_metrics(hosting: &Hosting, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = hosting.metrics().await;
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}: never\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the host has closed `conn`.
async fn closed(conn: &sentsim::ConnHandle, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while conn.is_open() {
        assert!(Instant::now() < deadline, "{what} stays open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_list_read_activate_or_delete_another_tenants_agents_nor_see_its_sessions()
{
    let hosting = Hosting::start("isolation", "").await;
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "conformance")
        .await;
    let mut call = hosting.connection("agent_globex").await.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();

    let (status, agents) = hosting
        .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!((status, &agents), (200, &json!({"agents": []})));
    for (method, path, payload) in [
        ("GET", "/v1/agents/agent_globex", vec![]),
        (
            "POST",
            "/v1/agents/agent_globex/activate",
            body(json!({"version": 1})),
        ),
        ("POST", "/v1/agents/agent_globex/rollback", vec![]),
        (
            "PUT",
            "/v1/agents/agent_globex/failure-policy",
            body(json!({"action": "hangup"})),
        ),
        ("DELETE", "/v1/agents/agent_globex/versions/1", vec![]),
        ("DELETE", "/v1/agents/agent_globex", vec![]),
    ] {
        let (status, answer) = hosting.api(method, path, Some(ACME_TOKEN), payload).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found", "{method} {path}");
    }
    let (_, sessions) = hosting
        .api("GET", "/v1/sessions", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(sessions, json!({"sessions": []}));

    // Globex still has everything, and sees its call.
    let (status, agent) = hosting
        .api("GET", "/v1/agents/agent_globex", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!((status, agent["active_version"].as_u64()), (200, Some(1)));
    let (_, sessions) = hosting
        .api("GET", "/v1/sessions", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!(sessions["sessions"][0]["session_id"], call.id.as_str());
    call.say("echo still served");
    call.expect_say("still served").await.unwrap();

    // Each tenant's own metrics name only its own agents.
    let (status, mine) = hosting
        .api("GET", "/v1/metrics", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!(status, 200);
    let mine = mine.as_str().unwrap();
    assert!(
        mine.contains("voicehost_sessions_live{tenant=\"globex\",agent=\"agent_globex\"} 1"),
        "{mine}"
    );
    let (_, theirs) = hosting
        .api("GET", "/v1/metrics", Some(ACME_TOKEN), vec![])
        .await;
    let theirs = theirs.as_str().unwrap();
    assert!(
        !theirs.contains("globex") && !theirs.contains("compilations"),
        "{theirs}"
    );

    for token in [None, Some("not-a-token"), Some("")] {
        let (status, answer) = hosting.api("GET", "/v1/agents", token, vec![]).await;
        assert_eq!(status, 401, "{token:?}");
        assert_eq!(answer["error"]["code"], "unauthorized");
    }
    call.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_upload_is_refused_with_its_reason_and_nothing_is_stored() {
    let hosting = Hosting::start("uploads", "[tenants.limits]\ncomponent_mib = 1").await;
    let conformance = voicehost_testkit::guest("conformance");
    // The smallest valid component: it exports nothing, so it cannot be an agent.
    let empty_component = b"\0asm\x0d\x00\x01\x00".to_vec();
    // A component of another world: it needs an interface the host does not give.
    let foreign_import = wat::parse_str(
        r#"(component (import "acme:billing/ledger@1.0.0" (instance (export "charge" (func)))))"#,
    )
    .unwrap();
    let core_module = b"\0asm\x01\x00\x00\x00".to_vec();
    let cases: [(&str, Vec<u8>, u16, &str); 7] = [
        (
            "not wasm",
            b"#!/bin/sh\necho hi\n".to_vec(),
            400,
            "not_wasm",
        ),
        ("empty", Vec::new(), 400, "not_wasm"),
        ("a core module", core_module, 400, "core_module"),
        ("no exports", empty_component, 422, "wrong_world"),
        ("a foreign import", foreign_import, 422, "wrong_world"),
        (
            "truncated",
            conformance[..conformance.len() / 2].to_vec(),
            400,
            "invalid_component",
        ),
        ("over the cap", vec![0u8; (1 << 20) + 1], 413, "too_large"),
    ];
    for (what, wasm, status, code) in cases {
        let (got, answer) = hosting
            .api(
                "POST",
                "/v1/agents/agent_acme/versions",
                Some(ACME_TOKEN),
                wasm,
            )
            .await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{what}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty());
        if what == "a foreign import" {
            assert!(message.contains("acme:billing/ledger"), "{message}");
        }
    }
    let (status, answer) = hosting
        .api(
            "POST",
            "/v1/agents/bad%2Fid/versions",
            Some(ACME_TOKEN),
            conformance.clone(),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );

    let (_, agents) = hosting
        .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(agents, json!({"agents": []}));
    assert_eq!(hosting.files("components"), Vec::<String>::new());
    assert_eq!(hosting.files("compiled"), Vec::<String>::new());

    // A good upload is stored, compiled once, and not active until asked.
    let (status, version) = hosting
        .api(
            "POST",
            "/v1/agents/agent_acme/versions",
            Some(ACME_TOKEN),
            conformance,
        )
        .await;
    assert_eq!(
        (status, &version["version"], &version["active"]),
        (201, &json!(1), &json!(false))
    );
    assert!(version["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(hosting.files("components").len(), 1);
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_activated_under_live_calls_serves_only_new_calls_and_rollback_returns() {
    let hosting = Hosting::start("activation", "").await;
    assert_eq!(
        hosting.deploy(ACME_TOKEN, "agent_acme", "panicker").await,
        1
    );
    let conn = hosting.connection("agent_acme").await;
    let mut old = conn.start_text();
    old.expect_say("Hello from the panicker.").await.unwrap();

    let (status, _) = hosting
        .api(
            "POST",
            "/v1/agents/agent_acme/versions",
            Some(ACME_TOKEN),
            voicehost_testkit::guest("conformance"),
        )
        .await;
    assert_eq!(status, 201);
    let (status, agent) = hosting
        .api(
            "POST",
            "/v1/agents/agent_acme/activate",
            Some(ACME_TOKEN),
            body(json!({"version": 2})),
        )
        .await;
    assert_eq!(
        (status, &agent["active_version"]),
        (200, &json!(2)),
        "{agent}"
    );

    let mut new = conn.start_text();
    new.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    // The call that started on version 1 is still served by it.
    old.say("echo on the old version");
    old.expect_say("on the old version").await.unwrap();
    let (_, sessions) = hosting
        .api("GET", "/v1/sessions", Some(ACME_TOKEN), vec![])
        .await;
    let version_of = |id: &str| {
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == id)
            .map(|s| s["version"].clone())
    };
    assert_eq!(version_of(&old.id), Some(json!(1)), "{sessions}");
    assert_eq!(version_of(&new.id), Some(json!(2)), "{sessions}");
    assert_eq!(sessions["sessions"][0]["media"], "text");

    let (status, agent) = hosting
        .api(
            "POST",
            "/v1/agents/agent_acme/rollback",
            Some(ACME_TOKEN),
            vec![],
        )
        .await;
    assert_eq!(
        (status, &agent["active_version"]),
        (200, &json!(1)),
        "{agent}"
    );
    let mut after = conn.start_text();
    after.expect_say("Hello from the panicker.").await.unwrap();
    let (status, answer) = hosting
        .api(
            "DELETE",
            "/v1/agents/agent_acme/versions/1",
            Some(ACME_TOKEN),
            vec![],
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
    let (status, _) = hosting
        .api(
            "DELETE",
            "/v1/agents/agent_acme/versions/2",
            Some(ACME_TOKEN),
            vec![],
        )
        .await;
    assert_eq!(status, 204);
    for call in [&old, &new, &after] {
        call.end("completed");
    }
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_active_versions_are_served_from_the_cache_without_compiling() {
    let hosting = Hosting::start("restart", "").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "panicker")
        .await;
    let policy = json!({"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}});
    let (status, _) = hosting
        .api(
            "PUT",
            "/v1/agents/agent_acme/failure-policy",
            Some(ACME_TOKEN),
            body(policy.clone()),
        )
        .await;
    assert_eq!(status, 200);
    let (_, before) = hosting
        .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
        .await;

    let hosting = hosting.restart().await;
    let text = hosting.metrics().await;
    assert_eq!(metric(&text, "voicehost_compilations_total"), 0.0, "{text}");
    assert_eq!(metric(&text, "voicehost_compiled_cache_loads_total"), 2.0);
    let (_, after) = hosting
        .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
        .await;
    // (Whether each agent's connection is up yet is not the registry's.)
    let registry = |mut agents: Value| {
        for agent in agents["agents"].as_array_mut().unwrap() {
            agent.as_object_mut().unwrap().remove("status");
        }
        agents
    };
    assert_eq!(
        registry(after.clone()),
        registry(before),
        "the registry is the same after the restart"
    );
    assert_eq!(after["agents"][0]["failure_policy"], policy);
    let mut call = hosting.connection("agent_acme").await.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    let mut other = hosting.connection("agent_globex").await.start_text();
    other.expect_say("Hello from the panicker.").await.unwrap();
    call.end("completed");
    other.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_the_tenants_session_cap_gets_the_failure_policy_at_once_and_is_counted() {
    let hosting = Hosting::start("sessions-cap", "[tenants.limits]\nmax_sessions = 1").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    let policy = json!({"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}});
    hosting
        .api(
            "PUT",
            "/v1/agents/agent_acme/failure-policy",
            Some(ACME_TOKEN),
            body(policy),
        )
        .await;
    let conn = hosting.connection("agent_acme").await;
    let mut first = conn.start_text();
    first
        .expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    let mut second = conn.start_text();
    let transfer = second.expect_tool("transfer").await.unwrap();
    assert_eq!(transfer["arguments"]["to"]["value"], "+14155550100");
    let text = until_metrics(&hosting, "the refused call is counted", |t| {
        t.contains(&format!("voicehost_sessions_refused_total{{{ACME}}} 1"))
    })
    .await;
    assert_eq!(
        metric(&text, &format!("voicehost_sessions_live{{{ACME}}}")),
        1.0
    );

    // Once the first call ends, there is room again.
    first.end("completed");
    until_metrics(&hosting, "the first call is done", |t| {
        t.contains(&format!("voicehost_sessions_live{{{ACME}}} 0"))
    })
    .await;
    let mut third = conn.start_text();
    third
        .expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    third.end("completed");
    hosting.finish().await;
}

const GLOBEX: &str = "tenant=\"globex\",agent=\"agent_globex\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_reserved_calls_stay_free_while_a_neighbour_fills_the_rest_of_the_pool() {
    // Two pool slots, one of them acme's.
    let hosting =
        Hosting::start_with("reserved-calls", "max_calls = 2", "reserved_calls = 1").await;
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "conformance")
        .await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    let globex_conn = hosting.connection("agent_globex").await;
    let mut globex = globex_conn.start_text();
    globex
        .expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    // The one slot nobody reserved is taken: globex's next call gets its failure policy at once (not
    // an instantiation that fails), counted as the host being full, not as over a cap.
    let mut refused = globex_conn.start_text();
    refused.expect_tool("hangup").await.unwrap();
    let text = until_metrics(&hosting, "the refused call is counted", |t| {
        t.contains(&format!("voicehost_sessions_host_full_total{{{GLOBEX}}} 1"))
    })
    .await;
    assert_eq!(
        metric(
            &text,
            &format!("voicehost_sessions_refused_total{{{GLOBEX}}}")
        ),
        0.0
    );

    // acme's reserved slot was kept for it.
    let mut acme = hosting.connection("agent_acme").await.start_text();
    acme.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();

    globex.end("completed");
    until_metrics(&hosting, "globex's first call is done", |t| {
        t.contains(&format!("voicehost_sessions_live{{{GLOBEX}}} 0"))
    })
    .await;
    let mut next = globex_conn.start_text();
    next.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    next.end("completed");
    acme.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reserving_more_than_the_running_pool_holds_is_refused_and_changes_nothing() {
    let hosting =
        Hosting::start_with("reserve-reload", "max_calls = 2", "reserved_calls = 1").await;
    // The new file has no max_calls (1000 by default), which only a restart would apply: 5 reserved
    // fit the file, not the pool the host runs with.
    let tenants = format!(
        "{}reserved_calls = 5\n{}",
        hosting.tenant("acme", ACME_TOKEN),
        hosting.tenant("globex", GLOBEX_TOKEN)
    );
    let error = format!("{:#}", hosting.reload(&tenants).await.unwrap_err());
    assert!(
        error.contains("reserved_calls add up to 5, over max_calls = 2"),
        "{error}"
    );
    // Still one slot for globex and one kept for acme.
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "conformance")
        .await;
    let globex = hosting.connection("agent_globex").await;
    let mut first = globex.start_text();
    first
        .expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    globex.start_text().expect_tool("hangup").await.unwrap();
    first.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_growing_into_memory_another_tenant_reserved_traps_and_that_tenant_still_gets_it() {
    // 40 MiB of guest memory for the host: 16 are acme's (one call at 16 MiB), 24 are nobody's.
    let hosting = Hosting::start_with(
        "guest-memory",
        "guest_memory_mib = 40",
        "reserved_calls = 1\n[tenants.limits]\nmemory_mib = 16",
    )
    .await;
    hosting.deploy(GLOBEX_TOKEN, "agent_globex", "hog").await;
    hosting.deploy(ACME_TOKEN, "agent_acme", "hog").await;
    let globex_conn = hosting.connection("agent_globex").await;
    let mut holder = globex_conn.start_text();
    holder.expect_say("Hello from the hog.").await.unwrap();
    holder.say("take 20");
    holder.expect_say("took 20").await.unwrap();
    // globex's own cap is 64 MiB: what stops its second call is the host's memory, outside acme's part.
    let mut grower = globex_conn.start_text();
    grower.expect_say("Hello from the hog.").await.unwrap();
    grower.say("grow");
    until_metrics(
        &hosting,
        "globex's trap, counted as the host's memory",
        |t| {
            t.contains(&format!(
                "voicehost_traps_total{{{GLOBEX},kind=\"host_memory\"}} 1"
            ))
        },
    )
    .await;

    // While globex holds the rest, acme's call still gets its 16 MiB; past them, its own cap traps it.
    let mut acme = hosting.connection("agent_acme").await.start_text();
    acme.expect_say("Hello from the hog.").await.unwrap();
    acme.say("take 12");
    acme.expect_say("took 12").await.unwrap();
    acme.say("grow");
    let text = until_metrics(&hosting, "acme's trap, at its own cap", |t| {
        t.contains(&format!(
            "voicehost_traps_total{{{ACME},kind=\"memory_limit\"}} 1"
        ))
    })
    .await;
    assert_eq!(
        metric(
            &text,
            &format!("voicehost_traps_total{{{ACME},kind=\"host_memory\"}}")
        ),
        0.0
    );
    holder.say("echo still here");
    holder.expect_say("still here").await.unwrap();
    for call in [holder, grower, acme] {
        call.end("completed");
    }
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_memory_and_cpu_limits_trap_its_agents_and_the_traps_are_counted_by_kind() {
    let limits = "[tenants.limits]\nmemory_mib = 16\ncpu_ms = 50\n\
                  [tenants.agents.agent_acme2.limits]\nmemory_mib = 128";
    let hosting = Hosting::start("limits", limits).await;
    hosting.deploy(ACME_TOKEN, "agent_acme", "hog").await;
    hosting.deploy(ACME_TOKEN, "agent_acme2", "looper").await;
    let mut hog = hosting.connection("agent_acme").await.start_text();
    hog.expect_say("Hello from the hog.").await.unwrap();
    hog.say("grow");
    let mut looper = hosting.connection("agent_acme2").await.start_text();
    looper.expect_say("Hello from the looper.").await.unwrap();
    looper.say("loop");
    let started = Instant::now();
    let text = until_metrics(&hosting, "both traps", |t| {
        t.contains(&format!(
            "voicehost_traps_total{{{ACME},kind=\"memory_limit\"}} 1"
        )) && t.contains(
            "voicehost_traps_total{tenant=\"acme\",agent=\"agent_acme2\",kind=\"cpu_deadline\"} 1",
        )
    })
    .await;
    // 16 MiB is reached within 16 chunks; the loop is stopped by its 50 ms deadline, not the 60 s wall.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        metric(&text, &format!("voicehost_restarts_total{{{ACME}}}")),
        1.0
    );
    hog.say("echo alive");
    hog.expect_say("alive").await.unwrap();
    looper.say("echo alive");
    looper.expect_say("alive").await.unwrap();
    hog.end("completed");
    looper.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_agent_closes_its_connections_and_forgets_it() {
    let hosting = Hosting::start("delete", "").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    let conn = hosting.connection("agent_acme").await;
    let (status, _) = hosting
        .api("DELETE", "/v1/agents/agent_acme", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 204);
    closed(&conn, "the deleted agent's connection").await;
    let (status, _) = hosting
        .api("GET", "/v1/agents/agent_acme", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 404);
    // Its component and its compiled form go with it (no other version holds them).
    assert_eq!(hosting.files("components"), Vec::<String>::new());
    assert_eq!(hosting.files("compiled"), Vec::<String>::new());
    let text = hosting.metrics().await;
    assert!(!text.contains("agent_acme"), "{text}");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_document_describes_every_route_and_every_route_answers() {
    let hosting = Hosting::start("openapi", "").await;
    let (status, document) = hosting.api("GET", "/openapi.json", None, vec![]).await;
    assert_eq!(status, 200);
    assert_eq!(
        document,
        serde_json::to_value(voicehost::api::openapi()).unwrap()
    );
    let routes: Vec<(String, String)> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, methods)| {
            methods
                .as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    assert_eq!(routes.len(), 14, "{routes:?}");
    for (method, path) in &routes {
        let path = path
            .replace("{agent_id}", "agent_none")
            .replace("{version}", "1");
        let (status, answer) = hosting
            .api(&method.to_uppercase(), &path, Some(ACME_TOKEN), vec![])
            .await;
        // A route that exists answers with its own error (unknown agent, empty body), never "no such route".
        assert_ne!(
            answer["error"]["message"], "no such route",
            "{method} {path}"
        );
        assert!(status < 500, "{method} {path}: {status} {answer}");
    }
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_http_allowlist_applies_to_its_agents_only_and_others_get_no_wasi_http() {
    let model = crate::outbound::Model::start().await;
    let acme = format!(
        "[tenants.http]\nallow = [\"{}\"]\ntimeout_ms = 5000",
        model.origin()
    );
    let hosting = Hosting::start("http", &acme).await;
    hosting.deploy(ACME_TOKEN, "agent_acme", "llm").await;
    hosting.deploy(GLOBEX_TOKEN, "agent_globex", "llm").await;
    let url = model.url("/reply");

    let mut allowed = crate::outbound::call_on(&hosting.connection("agent_acme").await, &url).await;
    allowed.say("hello");
    allowed.expect_say("you said: hello").await.unwrap();
    // Globex allows no origin: its agents get no `wasi:http` at all, and the first use of it traps.
    let denied = crate::outbound::call_on(&hosting.connection("agent_globex").await, &url).await;
    denied.say("hello");
    until_metrics(&hosting, "globex's trap", |t| {
        t.contains(
            "voicehost_traps_total{tenant=\"globex\",agent=\"agent_globex\",kind=\"other\"} 1",
        )
    })
    .await;
    assert_eq!(model.requests(), 1, "only acme's agent reached the model");
    allowed.end("completed");
    denied.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_logging_over_its_rate_drops_the_excess_and_counts_it() {
    let hosting = Hosting::start("log-rate", "[tenants.limits]\nlog_lines_per_second = 5").await;
    hosting.deploy(ACME_TOKEN, "agent_acme", "panicker").await;
    let mut call = hosting.connection("agent_acme").await.start_text();
    call.expect_say("Hello from the panicker.").await.unwrap();
    // 20 lines through the `log` import and 20 on stdout, all within one handler call.
    call.say("shout 20");
    call.expect_say("shouted").await.unwrap();
    let text = hosting.metrics().await;
    let dropped = metric(
        &text,
        &format!("voicehost_guest_log_dropped_total{{{ACME}}}"),
    );
    // 5 a second pass; a handler that happens to straddle a second's boundary lets 5 more through.
    assert!((30.0..=35.0).contains(&dropped), "dropped {dropped}");
    call.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_handler_errors_are_logged_within_its_calls_log_rate_and_all_counted() {
    let hosting = Hosting::start("error-rate", "[tenants.limits]\nlog_lines_per_second = 2").await;
    hosting.deploy(ACME_TOKEN, "agent_acme", "prober").await;
    let mut call = hosting.connection("agent_acme").await.start_text();
    call.expect_say("Hello from the prober.").await.unwrap();
    // 20 handler calls that fail, back to back: each logs a line of its own and makes the host log one.
    for _ in 0..20 {
        call.say("fail");
    }
    let text = until_metrics(&hosting, "every failure is counted", |t| {
        t.contains(&format!("voicehost_handler_errors_total{{{ACME}}} 20"))
    })
    .await;
    let dropped = metric(
        &text,
        &format!("voicehost_guest_log_dropped_total{{{ACME}}}"),
    );
    // 40 lines at 2 a second: the guest's own 20 alone could drop 18 at most.
    assert!(dropped >= 25.0, "dropped {dropped}");
    call.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sent_refuses_shows_as_refused_with_the_reason_and_others_serve_on() {
    let hosting = Hosting::start("status", "").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    // Sent knows no agent_stranger under acme's key.
    hosting
        .deploy(ACME_TOKEN, "agent_stranger", "conformance")
        .await;
    hosting.connection("agent_acme").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let agents = loop {
        let (_, agents) = hosting
            .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
            .await;
        let status = |i: usize| {
            agents["agents"][i]["status"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        if status(0) == "serving" && status(1) == "refused" {
            break agents;
        }
        assert!(Instant::now() < deadline, "{agents}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let detail = agents["agents"][1]["status_detail"].as_str().unwrap();
    assert!(detail.contains("Sent refused the connection"), "{detail}");
    assert!(agents["agents"][0].get("status_detail").is_none());
    let mut call = hosting.connection("agent_acme").await.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    call.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_metrics_token_only_the_operator_reads_the_metrics() {
    let operator = "vh_operator_metrics_token";
    let top = format!(
        "[admin]\nmetrics_token_sha256 = \"{}\"",
        voicehost::tenancy::token_sha256(operator)
    );
    let hosting = Hosting::start_with("metrics-token", &top, "").await;
    for token in [None, Some(ACME_TOKEN), Some("vh_guess")] {
        let (status, answer) = hosting.api("GET", "/metrics", token, vec![]).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{token:?}"
        );
    }
    let (status, text) = hosting.api("GET", "/metrics", Some(operator), vec![]).await;
    assert_eq!(status, 200);
    assert!(text.as_str().unwrap().contains("voicehost_agents_served 0"));
    // A tenant's routes do not take the operator's token.
    let (status, _) = hosting
        .api("GET", "/v1/agents", Some(operator), vec![])
        .await;
    assert_eq!(status, 401);
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_config_adds_and_removes_tenants_and_changes_limits_without_dropping_calls() {
    let hosting = Hosting::start("reload", "").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    hosting
        .deploy(GLOBEX_TOKEN, "agent_globex", "conformance")
        .await;
    let globex_conn = hosting.connection("agent_globex").await;
    let conn = hosting.connection("agent_acme").await;
    let mut live = conn.start_text();
    live.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();

    // globex leaves, initech arrives, acme may hold one call at a time from now on.
    let initech = "vh_initech_admin_token";
    std::fs::write(hosting.dir.join("initech.key"), "sk_initech").unwrap();
    let tenants = format!(
        "{}{}[tenants.limits]\nmax_sessions = 1\n",
        hosting.tenant("initech", initech),
        hosting.tenant("acme", ACME_TOKEN)
    );
    hosting.reload(&tenants).await.unwrap();

    let (status, _) = hosting
        .api("GET", "/v1/agents", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!(status, 401, "globex is gone");
    closed(&globex_conn, "the removed tenant's agent's connection").await;
    let (status, agents) = hosting
        .api("GET", "/v1/agents", Some(initech), vec![])
        .await;
    assert_eq!(
        (status, agents),
        (200, json!({"agents": []})),
        "initech can log in"
    );
    // acme's call goes on; its next call is over the new cap of 1.
    live.say("echo still here");
    live.expect_say("still here").await.unwrap();
    let mut over = conn.start_text();
    over.expect_tool("hangup").await.unwrap();

    // A config that does not load changes nothing.
    let error = hosting.reload("max_sesions = 3\n").await.unwrap_err();
    assert!(format!("{error:#}").contains("max_sesions"), "{error:#}");
    let (status, _) = hosting
        .api("GET", "/v1/agents", Some(initech), vec![])
        .await;
    assert_eq!(status, 200);
    live.end("completed");
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_initial_memory_is_over_its_limit_is_refused_at_upload_not_at_every_call() {
    // The conformance agent's memory starts at 17 pages (1.06 MiB); this tenant allows 1 MiB.
    let hosting = Hosting::start("over-limits", "[tenants.limits]\nmemory_mib = 1").await;
    let wasm = voicehost_testkit::guest("conformance");
    let (status, answer) = hosting
        .api(
            "POST",
            "/v1/agents/agent_big/versions?activate=true",
            Some(ACME_TOKEN),
            wasm,
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "over_limits", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("over the agent's memory_mib = 1"),
        "{message}"
    );
    let (status, _) = hosting
        .api("GET", "/v1/agents/agent_big", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 404, "nothing was stored");
    hosting.finish().await;
}

/// Starts an upload of `total` bytes as `token` and sends only the headers and the first kilobyte; the
/// connection is returned to be read (or dropped).
async fn held_upload(admin: &str, token: &str, total: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(admin.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/agents/agent_acme/versions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/wasm\r\ncontent-length: {total}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&[0u8; 1024]).await.unwrap();
    stream
}

/// The whole answer on `stream` (the server closes it after an error answer to a body it did not read).
async fn answer(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                text.extend_from_slice(&chunk[..n]);
                if String::from_utf8_lossy(&text).contains("}}") {
                    break;
                }
            }
            Err(_) => panic!("no answer in 10 s: {}", String::from_utf8_lossy(&text)),
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_uploads_open_is_refused_more_until_they_time_out_and_others_upload_meanwhile(
) {
    let hosting = Hosting::start_with(
        "uploads-held",
        "[admin]\nupload_timeout_seconds = 2\nuploads_per_tenant = 2",
        "",
    )
    .await;
    let started = Instant::now();
    let mut held = vec![
        held_upload(&hosting.admin, ACME_TOKEN, 10 << 20).await,
        held_upload(&hosting.admin, ACME_TOKEN, 10 << 20).await,
    ];
    // Both slots are taken once the server has read their headers: a third upload is refused at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while hosting.tenancy.uploads_in_progress("acme") < 2 {
        assert!(Instant::now() < deadline, "the held uploads never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut third = held_upload(&hosting.admin, ACME_TOKEN, 10 << 20).await;
    let third = answer(&mut third).await;
    assert!(third.starts_with("HTTP/1.1 429"), "{third}");
    assert!(third.to_lowercase().contains("retry-after: 5"), "{third}");
    assert!(third.contains("\"code\":\"busy\""), "{third}");
    // The other tenant is not held up.
    let (status, body) = hosting
        .api(
            "POST",
            "/v1/agents/agent_globex/versions",
            Some(GLOBEX_TOKEN),
            voicehost_testkit::guest("conformance"),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // The held uploads are answered 408 at their deadline, and their slots are free again.
    for stream in &mut held {
        let text = answer(stream).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"code\":\"timeout\""), "{text}");
    }
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(hosting.tenancy.uploads_in_progress("acme"), 0);
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    hosting.finish().await;
}

/// A connection to the admin listener from `ip` (a loopback address of its own) that sends half a request
/// line and waits.
async fn half_open(admin: &str, ip: [u8; 4]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((ip, 0).into()).unwrap();
    let mut stream = socket
        .connect(admin.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap();
    let _ = stream.write_all(b"POST /v1/agen").await;
    stream
}

/// Whether the server has closed `stream` within `wait` (it reads end of file, or a reset).
async fn closed_within(stream: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// How many of `streams` the server closes within `wait`, all watched at once.
async fn closed_count<'a>(
    streams: impl Iterator<Item = &'a mut tokio::net::TcpStream>,
    wait: Duration,
) -> usize {
    futures_util::future::join_all(streams.map(|stream| closed_within(stream, wait)))
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_half_open_admin_connections_is_capped_and_timed_out_while_calls_go_on() {
    let hosting = Hosting::start_with(
        "admin-flood",
        "[admin]\nmax_connections = 40\nmax_connections_per_client = 30\nhead_timeout_seconds = 3",
        "",
    )
    .await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    // One client opens 60: 30 are held, the rest closed at once (its own cap).
    let mut first = Vec::new();
    for _ in 0..60 {
        first.push(half_open(&hosting.admin, [127, 0, 0, 2]).await);
    }
    // Another opens 20: 10 fit under the listener's cap of 40, the rest are closed at once.
    let mut second = Vec::new();
    for _ in 0..20 {
        second.push(half_open(&hosting.admin, [127, 0, 0, 3]).await);
    }
    // (All at once: one at a time would take longer than the head timeout.)
    let refused = closed_count(
        first.iter_mut().chain(second.iter_mut()),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(
        refused, 40,
        "30 over the first client's cap, 10 over the listener's"
    );
    // While the listener is full, calls go on: Sent's connections are not the admin listener's.
    let mut call = hosting.connection("agent_acme").await.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    call.end("completed");
    // The held ones are closed once their head is late; then the admin API answers again.
    let held_closed = closed_count(
        first.iter_mut().chain(second.iter_mut()),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(held_closed, 80);
    let (status, body) = hosting
        .api("GET", "/v1/agents", Some(GLOBEX_TOKEN), vec![])
        .await;
    assert_eq!(status, 200, "{body}");
    let text = hosting.metrics().await;
    assert_eq!(
        metric(&text, "voicehost_admin_connections_refused_total"),
        40.0
    );
    hosting.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_guessing_tokens_is_slowed_to_its_rate_and_a_tenant_keeps_its_access() {
    let hosting = Hosting::start_with(
        "failed-logins",
        "[admin]\nfailed_logins_per_minute = 3\nrequests_per_second = 1000",
        "",
    )
    .await;
    // From 127.0.0.2: three wrong tokens are answered 401, then 429 with how long to wait.
    let guess = || async {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = half_open(&hosting.admin, [127, 0, 0, 2]).await;
        stream
            .write_all(
                b"ts/agent_acme/rollback HTTP/1.1\r\nhost: x\r\nauthorization: Bearer vh_not_a_token_anyone_has_0000\r\n\
                  connection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).await.unwrap();
        text
    };
    for _ in 0..3 {
        let text = guess().await;
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    }
    let text = guess().await;
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    let retry = text
        .lines()
        .find_map(|l| {
            l.to_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no Retry-After: {text}"));
    assert!(
        (1..=20).contains(&retry.trim().parse::<u64>().unwrap()),
        "{retry}"
    );
    // The tenant, from its own address, is not slowed.
    let (status, body) = hosting
        .api("GET", "/v1/agents", Some(ACME_TOKEN), vec![])
        .await;
    assert_eq!(status, 200, "{body}");
    hosting.finish().await;
}

/// A request on a connection of its own from `ip`, with `token` and without `connection: close`: the
/// answer, read until the server closes the connection (`None` if it keeps it open for 5 s).
async fn request_until_closed(admin: &str, ip: [u8; 4], token: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((ip, 0).into()).unwrap();
    let mut stream = socket
        .connect(admin.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap();
    let request =
        format!("GET /v1/agents HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    match tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text)).await {
        Ok(_) => Some(text),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_token_holds_no_admin_connection_open() {
    let hosting = Hosting::start_with(
        "no-token-no-connection",
        "[admin]\nfailed_logins_per_minute = 3\nrequests_per_second = 1000",
        "",
    )
    .await;
    // Each failed login closes its connection: asking again means connecting again.
    for _ in 0..3 {
        let text = request_until_closed(
            &hosting.admin,
            [127, 0, 0, 7],
            "vh_not_a_token_anyone_has_0000",
        )
        .await
        .expect("the connection stayed open after a failed login");
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    }
    let text = request_until_closed(
        &hosting.admin,
        [127, 0, 0, 7],
        "vh_not_a_token_anyone_has_0000",
    )
    .await
    .expect("the connection stayed open after a 429");
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    // From now on until it may try again, its connections are closed before a request is read.
    let mut stream = half_open(&hosting.admin, [127, 0, 0, 7]).await;
    assert!(closed_within(&mut stream, Duration::from_secs(2)).await);
    // A tenant's own connection, from another address, stays open for its next request.
    assert_eq!(
        request_until_closed(&hosting.admin, [127, 0, 0, 8], ACME_TOKEN).await,
        None,
        "a tenant's connection was closed after a good request"
    );
    hosting.finish().await;
}
