//! Outbound HTTP, end to end: the example `llm` agent POSTs what the caller said to the URL in its call's
//! context (`llm_url`) through `wasi:http`, and says the answer, or an apology naming the `wasi:http` error
//! code it got. A small HTTP server on loopback plays the model; the host's policy (`Limits::http`)
//! decides where the agent may go, how long it may wait and how much it may read.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use sentsim::{Call, SessionSpec};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use voicehost::agent::CallRules;
use voicehost::sandbox::Limits;
use voicehost::sandbox::{HttpPolicy, Origin, TrapKind};
use voicehost_testkit::Host;

/// A large answer: 64 KiB of JSON, over the 1 KiB cap of the tests that use it.
const BIG: usize = 64 << 10;

/// The model: a small HTTP server on loopback that counts the requests it gets.
pub struct Model {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Model {
    /// Serves `POST /reply` (`{"reply": "you said: <text>"}`, after 30 s when the text starts with
    /// "slow"), `POST /big` (64 KiB with a Content-Length) and `POST /big-chunked` (64 KiB streamed, no
    /// length).
    pub async fn start() -> Model {
        let requests = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/reply", post(reply))
            .route("/big", post(big))
            .route("/big-chunked", post(big_chunked))
            .with_state(requests.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Model {
            addr,
            requests,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn origin(&self) -> Origin {
        Origin::parse(&format!("http://{}", self.addr)).unwrap()
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn reply(State(requests): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Json<Value> {
    requests.fetch_add(1, Ordering::SeqCst);
    let text = body["text"].as_str().unwrap_or("nothing");
    if text.starts_with("slow") {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    Json(json!({ "reply": format!("you said: {text}") }))
}

fn big_reply() -> Vec<u8> {
    let reply = json!({ "reply": "x".repeat(BIG) });
    serde_json::to_vec(&reply).unwrap()
}

async fn big(State(requests): State<Arc<AtomicUsize>>) -> axum::response::Response {
    requests.fetch_add(1, Ordering::SeqCst);
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from(big_reply()))
        .unwrap()
}

async fn big_chunked(State(requests): State<Arc<AtomicUsize>>) -> axum::response::Response {
    requests.fetch_add(1, Ordering::SeqCst);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big_reply().chunks(4096).map(|c| Ok(c.to_vec())).collect();
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(futures_util::stream::iter(
            chunks,
        )))
        .unwrap()
}

/// Rules with this HTTP policy.
fn rules(http: HttpPolicy) -> CallRules {
    CallRules {
        limits: Limits {
            http: Arc::new(http),
            ..Limits::default()
        },
        ..CallRules::default()
    }
}

/// A text call whose context points the agent at `url`, past its greeting.
async fn call_with_model(host: &Host, url: &str) -> Call {
    call_on(&host.connection().await, url).await
}

/// A text call on `conn` whose context points the agent at `url`, past its greeting.
pub async fn call_on(conn: &sentsim::ConnHandle, url: &str) -> Call {
    let mut context = serde_json::Map::new();
    context.insert("llm_url".into(), Value::String(url.into()));
    let mut call = conn.start(SessionSpec {
        context: Some(context),
        ..SessionSpec::text()
    });
    call.expect_say("Hello from the llm agent.").await.unwrap();
    call
}

/// The text of the agent's next `agent.say`.
async fn next_said(call: &mut Call) -> String {
    let said = call
        .expect_frame("agent.say", |j| j["type"] == "agent.say")
        .await
        .unwrap();
    said["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reaches_an_allowed_origin_and_says_its_answer() {
    let model = Model::start().await;
    let host = Host::start("llm", rules(HttpPolicy::allowing([model.origin()]))).await;
    let mut call = call_with_model(&host, &model.url("/reply")).await;

    call.say("what time is it");
    call.expect_say("you said: what time is it").await.unwrap();
    call.say("and the weather");
    call.expect_say("you said: and the weather").await.unwrap();
    assert_eq!(model.requests(), 2);
    host.finish().await;
}

/// Under the rules `policy` gives for the model, the agent's request is denied and never reaches it.
async fn denied(policy: impl FnOnce(&Model) -> CallRules) {
    let model = Model::start().await;
    let host = Host::start("llm", policy(&model)).await;
    let mut call = call_with_model(&host, &model.url("/reply")).await;

    call.say("hello");
    call.expect_say("sorry, I cannot reach my brain (HttpRequestDenied)")
        .await
        .unwrap();
    assert_eq!(model.requests(), 0, "the server saw a request");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_an_origin_off_the_allowlist_is_denied_before_it_leaves_the_host() {
    denied(|model| {
        // The same host, another port: not the model's origin.
        let other = Origin::parse(&format!("http://127.0.0.1:{}", model.addr.port() ^ 1)).unwrap();
        rules(HttpPolicy::allowing([other]))
    })
    .await;
}

/// The model's `path` by the name `localhost`, and that name's origin.
fn by_name(model: &Model, path: &str) -> (String, Origin) {
    let origin = format!("http://localhost:{}", model.addr.port());
    (format!("{origin}{path}"), Origin::parse(&origin).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_name_that_resolves_to_loopback_is_refused_after_the_lookup() {
    let model = Model::start().await;
    let (url, origin) = by_name(&model, "/reply");
    let host = Host::start("llm", rules(HttpPolicy::allowing([origin]))).await;
    let mut call = call_with_model(&host, &url).await;

    call.say("hello");
    call.expect_say("sorry, I cannot reach my brain (DestinationIpProhibited)")
        .await
        .unwrap();
    assert_eq!(model.requests(), 0, "the server saw a request");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_allowed_private_addresses_reaches_loopback() {
    let model = Model::start().await;
    let (url, origin) = by_name(&model, "/reply");
    let host = Host::start(
        "llm",
        rules(HttpPolicy {
            allow_private: vec![origin.clone()],
            ..HttpPolicy::allowing([origin])
        }),
    )
    .await;
    let mut call = call_with_model(&host, &url).await;

    call.say("hello");
    call.expect_say("you said: hello").await.unwrap();
    assert_eq!(model.requests(), 1);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_default_policy_wasi_http_is_not_linked_and_its_first_use_traps() {
    let model = Model::start().await;
    let host = Host::start("llm", CallRules::default()).await;
    let mut call = call_with_model(&host, &model.url("/reply")).await;

    call.say("hello");
    call.expect_nothing(Duration::from_millis(500))
        .await
        .unwrap();
    let stats = &host.stats;
    assert_eq!(stats.trapped(TrapKind::Other), 1, "{stats}");
    assert_eq!(model.requests(), 0, "the server saw a request");
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_slower_than_the_timeout_gives_the_guest_a_timeout_and_the_call_goes_on() {
    let model = Model::start().await;
    let host = Host::start(
        "llm",
        rules(HttpPolicy {
            timeout: Duration::from_millis(300),
            ..HttpPolicy::allowing([model.origin()])
        }),
    )
    .await;
    let mut call = call_with_model(&host, &model.url("/reply")).await;

    call.say("slow answer please");
    let said = next_said(&mut call).await;
    assert!(
        said.starts_with("sorry, I cannot reach my brain (") && said.ends_with("Timeout)"),
        "the agent said {said:?}"
    );
    // The next utterance of the same call is answered: the instance is fine.
    call.say("and now quickly");
    call.expect_say("you said: and now quickly").await.unwrap();
    assert_eq!(host.stats.traps(), 0, "{}", host.stats);
    assert_eq!(model.requests(), 2);
    host.finish().await;
}

/// The model's 64 KiB answer at `path`, under a 1 KiB cap: the guest gets the body-size error.
async fn answer_over_the_cap(path: &str) {
    let model = Model::start().await;
    let host = Host::start(
        "llm",
        rules(HttpPolicy {
            max_response_bytes: 1 << 10,
            ..HttpPolicy::allowing([model.origin()])
        }),
    )
    .await;
    let mut call = call_with_model(&host, &model.url(path)).await;

    call.say("tell me everything");
    call.expect_say("sorry, I cannot reach my brain (HttpResponseBodySize)")
        .await
        .unwrap();
    assert_eq!(model.requests(), 1);
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_a_content_length_over_the_cap_fails_with_the_body_size_error() {
    answer_over_the_cap("/big").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_that_passes_the_cap_fails_with_the_body_size_error() {
    answer_over_the_cap("/big-chunked").await;
}
