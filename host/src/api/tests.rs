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
    let tenant = |id: &str, token: &str| {
        format!(
            "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\napi_key_file = {:?}\n",
            crate::tenancy::token_sha256(token),
            dir.join("key")
        )
    };
    let text = format!(
        "data_dir = {:?}\nsent_url = \"ws://127.0.0.1:9/never\"\n[admin]\nmetrics_token_sha256 = \"{}\"\n{}{}",
        dir.join("data"),
        crate::tenancy::token_sha256(OPERATOR),
        tenant("acme", ACME),
        tenant("globex", GLOBEX)
    );
    let config: crate::tenancy::ServeConfig = toml::from_str(&text).unwrap();
    (Tenancy::open(&config, None).unwrap(), Dir(dir))
}

/// One request; the status and the body's JSON (`Null` when empty or not JSON).
async fn call(
    tenancy: &Arc<Tenancy>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(path);
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
        Health::Ok { agents: 0 }
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
    let wasm = voicehost_test_programs::read("conformance");
    let (status, answer) = call(
        &tenancy,
        "POST",
        "/v1/agents/agent_a/versions",
        Some(ACME),
        wasm,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
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
