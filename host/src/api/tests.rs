//! The admin API's shapes and errors, through `router(..).oneshot(..)`: no socket, no Sent. (The socket,
//! uploads that serve calls and the CLI against a live host are in `host/tests/all/tenancy.rs`.)

use super::*;
use axum::http::Request;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

const ACME: &str = "acme-admin-token";
const GLOBEX: &str = "globex-admin-token";
const OPERATOR: &str = "operator-metrics-token";

/// A data directory, removed when the test ends.
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tenancy for tenants acme and globex on a fresh data directory, not started (so not ready), with an
/// unreachable Sent: nothing here dials it.
fn tenancy(name: &str) -> (Arc<Tenancy>, Dir) {
    let dir = std::env::temp_dir().join(format!("voicehost-api-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key"), "sk_test_key").unwrap();
    let config = config(&dir, &[("acme", ACME), ("globex", GLOBEX)]);
    (Tenancy::open(&config, None).unwrap(), Dir(dir))
}

/// The config of [`tenancy`]'s host, with these tenants and their tokens.
fn config(dir: &std::path::Path, tenants: &[(&str, &str)]) -> crate::tenancy::ServeConfig {
    let tenant = |id: &str, token: &str| {
        format!(
            "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\napi_key_file = {:?}\n",
            crate::tenancy::token_sha256(token),
            dir.join("key")
        )
    };
    let text = format!(
        "data_dir = {:?}\nsent_url = \"ws://127.0.0.1:9/never\"\n[admin]\nmetrics_token_sha256 = \"{}\"\n{}",
        dir.join("data"),
        crate::tenancy::token_sha256(OPERATOR),
        tenants
            .iter()
            .map(|(id, token)| tenant(id, token))
            .collect::<String>()
    );
    toml::from_str(&text).unwrap()
}

/// One request; the status and the body's JSON (`Null` when empty or not JSON).
async fn call(
    tenancy: &Arc<Tenancy>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    call_from(None, tenancy, method, path, token, body).await
}

/// [`call`] from a client at `client`, as the listener tells the routes.
async fn call_from(
    client: Option<std::net::SocketAddr>,
    tenancy: &Arc<Tenancy>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(client) = client {
        request = request.extension(axum::extract::ConnectInfo(client));
    }
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = router(tenancy.clone())
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

/// Uploads the test program `program` as `token`'s tenant's `agent` (activated when `activate`), checking
/// it is stored: the answer.
async fn upload(
    tenancy: &Arc<Tenancy>,
    token: &str,
    agent: &str,
    program: &str,
    activate: bool,
) -> serde_json::Value {
    let wasm = voicehost_test_programs::read(program);
    let path = format!("/v1/agents/{agent}/versions?activate={activate}");
    let (status, answer) = call(tenancy, "POST", &path, Some(token), wasm).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    answer
}

/// The error body's code, checking the body is the API's error shape.
fn code(body: &serde_json::Value) -> String {
    let error: ErrorBody = serde_json::from_value(body.clone()).expect("an error body");
    error.error.code
}

#[tokio::test]
async fn a_request_without_a_tenants_token_is_401_in_the_error_shape() {
    let (tenancy, _dir) = tenancy("unauthorized");
    for token in [None, Some("not-a-token"), Some(OPERATOR)] {
        let (status, body) = call(&tenancy, "GET", "/v1/agents", token, vec![]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(code(&body), "unauthorized");
    }
}

#[tokio::test]
async fn a_token_longer_than_any_the_host_holds_is_a_failed_login_and_says_why() {
    let (tenancy, _dir) = tenancy("long-token");
    let long = "t".repeat(100_000);
    let (status, body) = call(&tenancy, "GET", "/v1/agents", Some(&long), vec![]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("longer than any token the host holds")));
}

#[tokio::test]
async fn a_client_refused_for_failed_logins_is_answered_429_before_its_token_is_looked_at() {
    let (tenancy, _dir) = tenancy("refused-client");
    let guesser = Some(std::net::SocketAddr::from(([192, 0, 2, 7], 50_000)));
    let mut refused = None;
    for _ in 0..20 {
        let (status, _) = call_from(
            guesser,
            &tenancy,
            "GET",
            "/v1/agents",
            Some("guess"),
            vec![],
        )
        .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(status);
            break;
        }
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert!(refused.is_some(), "the guesser was never slowed");
    // Even a right token from that address waits: nothing it sends is hashed until then.
    let (status, body) =
        call_from(guesser, &tenancy, "GET", "/v1/agents", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(code(&body), "busy");
    let elsewhere = Some(std::net::SocketAddr::from(([192, 0, 2, 8], 50_000)));
    let (status, _) = call_from(elsewhere, &tenancy, "GET", "/v1/agents", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_new_tenant_lists_no_agents_and_no_sessions() {
    let (tenancy, _dir) = tenancy("empty");
    let (status, body) = call(&tenancy, "GET", "/v1/agents", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let list: AgentList = serde_json::from_value(body).unwrap();
    assert!(list.agents.is_empty());
    let (status, body) = call(&tenancy, "GET", "/v1/sessions", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let list: SessionList = serde_json::from_value(body).unwrap();
    assert!(list.sessions.is_empty());
}

#[tokio::test]
async fn health_is_503_starting_until_the_server_has_started() {
    let (tenancy, _dir) = tenancy("health");
    let (status, body) = call(&tenancy, "GET", "/healthz", None, vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        serde_json::from_value::<Health>(body).unwrap(),
        Health::Starting
    );
    tenancy.start().await;
    let (status, body) = call(&tenancy, "GET", "/healthz", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_value::<Health>(body).unwrap(),
        Health::Ok {
            agents: 0,
            loading: 0,
            registry_reachable: None,
        }
    );
}

#[tokio::test]
async fn an_unknown_agent_or_route_is_404() {
    let (tenancy, _dir) = tenancy("not-found");
    for (method, path) in [
        ("GET", "/v1/agents/agent_missing"),
        ("POST", "/v1/agents/agent_missing/rollback"),
        ("DELETE", "/v1/agents/agent_missing"),
        ("DELETE", "/v1/agents/agent_missing/versions/1"),
        ("GET", "/v1/nothing-here"),
    ] {
        let (status, body) = call(&tenancy, method, path, Some(ACME), vec![]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(code(&body), "not_found", "{method} {path}");
    }
}

#[tokio::test]
async fn bodies_that_are_not_what_a_route_takes_are_400_with_the_reason() {
    let (tenancy, _dir) = tenancy("bad-request");
    let cases: [(&str, &str, &[u8], &str); 6] = [
        (
            "PUT",
            "/v1/agents/agent_a/failure-policy",
            b"{",
            "bad_request",
        ),
        (
            "PUT",
            "/v1/agents/agent_a/failure-policy",
            br#"{"action":"hangup","to":{"kind":"number","value":"+1"}}"#,
            "bad_request",
        ),
        (
            "PUT",
            "/v1/agents/agent_a/failure-policy",
            br#"{"action":"transfer","to":{"kind":"","value":"+1"}}"#,
            "bad_request",
        ),
        (
            "POST",
            "/v1/agents/agent_a/activate",
            br#"{"version":1,"x":2}"#,
            "bad_request",
        ),
        ("POST", "/v1/agents/agent_a/versions", b"", "not_wasm"),
        (
            "POST",
            "/v1/agents/agent_a/versions",
            b"not a component",
            "not_wasm",
        ),
    ];
    for (method, path, body, expected) in cases {
        let (status, answer) = call(&tenancy, method, path, Some(ACME), body.to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path} {answer}");
        assert_eq!(code(&answer), expected, "{method} {path}");
    }
    let (status, answer) = call(
        &tenancy,
        "DELETE",
        "/v1/agents/agent_a/versions/x",
        Some(ACME),
        vec![],
    )
    .await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (StatusCode::BAD_REQUEST, "bad_request")
    );
}

#[tokio::test]
async fn a_core_module_is_refused_as_one() {
    let (tenancy, _dir) = tenancy("core-module");
    let module = wat::parse_str("(module)").unwrap();
    let (status, answer) = call(
        &tenancy,
        "POST",
        "/v1/agents/agent_a/versions",
        Some(ACME),
        module,
    )
    .await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (StatusCode::BAD_REQUEST, "core_module")
    );
}

#[tokio::test]
async fn an_upload_answers_its_version_and_only_its_tenant_sees_the_agent() {
    let (tenancy, _dir) = tenancy("upload");
    let answer = upload(&tenancy, ACME, "agent_a", "conformance", false).await;
    let version: VersionView = serde_json::from_value(answer).unwrap();
    assert_eq!((version.version, version.active), (1, false));
    assert!(version.digest.starts_with("sha256:"));

    let (status, answer) = call(&tenancy, "GET", "/v1/agents/agent_a", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let agent: AgentView = serde_json::from_value(answer).unwrap();
    assert_eq!(agent.versions, vec![version]);
    assert_eq!(agent.active_version, None);

    let (status, answer) = call(&tenancy, "GET", "/v1/agents/agent_a", Some(GLOBEX), vec![]).await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    tenancy.shutdown().await;
}

#[tokio::test]
async fn metrics_need_the_operators_token_and_a_tenant_sees_only_its_own() {
    let (tenancy, _dir) = tenancy("metrics");
    let (status, _) = call(&tenancy, "GET", "/metrics", Some(ACME), vec![]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let response = router(tenancy.clone())
        .oneshot(
            Request::get("/metrics")
                .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        metrics::CONTENT_TYPE
    );
    let (status, _) = call(&tenancy, "GET", "/v1/metrics", Some(GLOBEX), vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_tenant_asking_for_its_metrics_again_within_a_second_is_told_to_wait_and_others_are_not()
{
    let (tenancy, _dir) = tenancy("metrics-rate");
    let (status, _) = call(&tenancy, "GET", "/v1/metrics", Some(GLOBEX), vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let response = router(tenancy.clone())
        .oneshot(
            Request::get("/v1/metrics")
                .header(header::AUTHORIZATION, format!("Bearer {GLOBEX}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let (status, _) = call(&tenancy, "GET", "/v1/metrics", Some(ACME), vec![]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "acme's metrics are its own to ask for"
    );
    for _ in 0..3 {
        let (status, _) = call(&tenancy, "GET", "/metrics", Some(OPERATOR), vec![]).await;
        assert_eq!(status, StatusCode::OK, "the operator's are not limited");
    }
}

/// `host/openapi.json` is the document the routes make, as they make it now: rewritten by running this test
/// with `VOICEHOST_WRITE_OPENAPI=1`, and failing otherwise when a handler or a view changed without it.
#[test]
fn openapi_json_is_the_document_the_routes_make() {
    let generated = format!("{}\n", openapi().to_pretty_json().unwrap());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    if std::env::var_os("VOICEHOST_WRITE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let kept = std::fs::read_to_string(path).unwrap();
    assert!(
        kept == generated,
        "host/openapi.json is stale: run `VOICEHOST_WRITE_OPENAPI=1 cargo test -p voicehost --lib \
         openapi_json` and commit it"
    );
}

#[tokio::test]
async fn a_change_let_in_before_a_reload_removed_its_tenant_is_refused_and_changes_nothing() {
    let (tenancy, dir) = tenancy("removed-tenant");
    upload(&tenancy, ACME, "agent_a", "conformance", false).await;
    // acme's requests below were let in (their token checked) before the reload that removes acme.
    tenancy
        .reload(&config(&dir.0, &[("globex", GLOBEX)]))
        .await
        .unwrap();
    let refused = tenancy
        .set_policy("acme", "agent_a", FailurePolicy::default())
        .await;
    assert!(
        matches!(refused, Err(ServeError::NoTenant(_))),
        "{refused:?}"
    );
    let refused = tenancy.delete_version("acme", "agent_a", 1).await;
    assert!(
        matches!(refused, Err(ServeError::NoTenant(_))),
        "{refused:?}"
    );
    let wasm = voicehost_test_programs::read("conformance");
    let spooled = crate::content::Spooled::from_bytes(&dir.0, &wasm).unwrap();
    let refused = tenancy.upload("acme", "agent_b", spooled, true).await;
    assert!(
        matches!(refused, Err(ServeError::NoTenant(_))),
        "{refused:?}"
    );
    // Nothing of it was stored: acme's records are what they were before the reload.
    let agents = tenancy.agents("acme").await;
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0].1.versions.len(), 1);
    tenancy.shutdown().await;
}

#[tokio::test]
async fn what_the_host_keeps_only_its_own_user_may_read() {
    use std::os::unix::fs::PermissionsExt as _;
    let (tenancy, dir) = tenancy("private");
    upload(&tenancy, ACME, "agent_a", "conformance", true).await;
    let mut open = Vec::new();
    let mut files = 0;
    let mut todo = vec![dir.0.join("data")];
    while let Some(path) = todo.pop() {
        let meta = std::fs::metadata(&path).unwrap();
        if meta.permissions().mode() & 0o077 != 0 {
            open.push(format!(
                "{} {:o}",
                path.display(),
                meta.permissions().mode()
            ));
        }
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            files += 1;
        }
    }
    // The component, the index and the compiled form, at least.
    assert!(files >= 3, "{files} files");
    assert!(open.is_empty(), "others may read: {open:?}");
    tenancy.shutdown().await;
}

#[tokio::test]
async fn without_a_metrics_token_only_the_hosts_own_machine_reads_the_metrics() {
    let dir =
        std::env::temp_dir().join(format!("voicehost-api-open-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key"), "sk_test_key").unwrap();
    let dir = Dir(dir);
    let mut config = config(&dir.0, &[("acme", ACME)]);
    config.admin.metrics_token_sha256 = None;
    let tenancy = Tenancy::open(&config, None).unwrap();
    let from = |ip: std::net::IpAddr| Some(std::net::SocketAddr::new(ip, 40_000));
    for local in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
        let (status, _) = call_from(
            from(local.parse().unwrap()),
            &tenancy,
            "GET",
            "/metrics",
            None,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{local}");
    }
    for remote in ["192.0.2.1", "2001:db8::1"] {
        let (status, body) = call_from(
            from(remote.parse().unwrap()),
            &tenancy,
            "GET",
            "/metrics",
            None,
            vec![],
        )
        .await;
        assert_eq!(
            (status, code(&body).as_str()),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            "{remote}"
        );
    }
}

/// The agent's `status` as its tenant sees it.
async fn status_of(tenancy: &Arc<Tenancy>, token: &str, agent: &str) -> String {
    let (_, body) = call(
        tenancy,
        "GET",
        &format!("/v1/agents/{agent}"),
        Some(token),
        vec![],
    )
    .await;
    body["status"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn after_an_upgrade_emptied_the_cache_the_host_is_ready_and_one_tenants_compile_holds_back_no_other(
) {
    let (tenancy, dir) = tenancy("upgrade");
    upload(&tenancy, ACME, "agent_a", "conformance", true).await;
    upload(&tenancy, GLOBEX, "agent_b", "panicker", true).await;
    tenancy.shutdown().await;
    drop(tenancy);
    let compiled = dir.0.join("data/compiled");
    for entry in std::fs::read_dir(&compiled).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }

    let tenancy =
        Tenancy::open(&config(&dir.0, &[("acme", ACME), ("globex", GLOBEX)]), None).unwrap();
    // Both tenants' turns to compile are taken (as by their own uploads) when the host starts.
    let acme_turn = tenancy.hold_compile_turn("acme").await;
    let globex_turn = tenancy.hold_compile_turn("globex").await;
    tenancy.start().await;
    let (status, body) = call(&tenancy, "GET", "/healthz", None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_value::<Health>(body).unwrap(),
        Health::Ok {
            agents: 0,
            loading: 2,
            registry_reachable: None,
        }
    );
    assert_eq!(status_of(&tenancy, ACME, "agent_a").await, "loading");
    assert_eq!(status_of(&tenancy, GLOBEX, "agent_b").await, "loading");

    // globex's turn comes: its agent is served while acme's waits for its own.
    drop(globex_turn);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while status_of(&tenancy, GLOBEX, "agent_b").await == "loading" {
        assert!(
            std::time::Instant::now() < deadline,
            "globex's agent was never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status_of(&tenancy, GLOBEX, "agent_b").await, "connecting");
    assert_eq!(status_of(&tenancy, ACME, "agent_a").await, "loading");
    drop(acme_turn);
    while tenancy.loading_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "acme's agent was never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status_of(&tenancy, ACME, "agent_a").await, "connecting");
    tenancy.shutdown().await;
}

#[tokio::test]
async fn a_change_whose_request_is_dropped_midway_still_goes_to_its_end() {
    let (tenancy, _dir) = tenancy("dropped-change");
    upload(&tenancy, ACME, "agent_a", "conformance", true).await;
    assert_eq!(status_of(&tenancy, ACME, "agent_a").await, "connecting");
    // The client goes away as soon as the delete has begun (its handler is dropped at its first wait).
    let _ = tokio::time::timeout(
        std::time::Duration::ZERO,
        tenancy.delete_agent("acme", "agent_a"),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, _) = tenancy.status("acme", "agent_a");
        if tenancy.agents("acme").await.is_empty()
            && status == crate::tenancy::AgentStatus::Inactive
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the delete was left half done: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tenancy.shutdown().await;
}
