//! Mocked HTTP origins for `voicehost test`: canned answers to an agent's `wasi:http` requests.
//!
//! Each mocked origin (`https://api.example.com`) is served by a small HTTP server on loopback, and the
//! host's [`HttpPolicy`] allows the origin with that server as its stand-in
//! ([`HttpPolicy::stand_ins`]): the agent's request goes through the host's real outbound path (the
//! allowlist, the timeouts, the response cap, the CPU charged), only the far end is canned. The servers
//! live as long as the run; each scenario sets the answers its own mocks give ([`MockOrigins::set`]) and
//! then reads what was asked ([`MockOrigins::report`]): a request no mock of the scenario answers, or a
//! mock asked another number of times than its `times`, fails the scenario.

use crate::sandbox::{HttpPolicy, Origin};
use anyhow::{bail, Context as _, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest a mock may wait before it answers (to test an agent's timeouts).
const MAX_DELAY: Duration = Duration::from_secs(60);
/// The most origins a run may mock (one loopback server each).
const MAX_ORIGINS: usize = 16;
/// Requests no mock answered that a report names; the rest are counted.
const NAMED_MISSES: usize = 4;
/// The most of a request's body a mock reads to match `request_contains`; a longer body matches none.
const MAX_REQUEST_BODY: usize = 1 << 20;

/// A canned answer: `[[scenario.http]]` of a scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpMock {
    /// What it answers: `https://api.example.com/orders/17`. A path ending in `*` takes any rest; a query
    /// is matched when one is given, ignored otherwise.
    pub url: String,
    /// The request's method; any when not given.
    pub method: Option<String>,
    /// What the request's body must contain (as text) for this mock to answer it.
    pub request_contains: Option<String>,
    /// The answer's status: 200 unless given.
    #[serde(default = "ok")]
    pub status: u16,
    /// The answer's headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The answer's body, as text.
    pub body: Option<String>,
    /// The answer's body as JSON (from TOML: a date as its text), with `content-type: application/json`
    /// unless a header says otherwise.
    #[serde(default, deserialize_with = "super::local::json_from_toml")]
    pub json: Option<serde_json::Value>,
    /// How long it waits before answering, in milliseconds (at most 60 s).
    #[serde(default)]
    pub delay_ms: u64,
    /// How many requests it must answer in the scenario; any number when not given.
    pub times: Option<usize>,
}

fn ok() -> u16 {
    200
}

/// An [`HttpMock`] checked and taken apart.
#[derive(Debug)]
struct Route {
    /// As written, for reports.
    url: String,
    origin: Origin,
    method: Option<Method>,
    /// The path, without the `*` of a prefix.
    path: String,
    prefix: bool,
    query: Option<String>,
    request_contains: Option<String>,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Vec<u8>,
    delay: Duration,
    times: Option<usize>,
}

impl HttpMock {
    /// The mock as a route, or what is wrong with it.
    fn route(&self) -> Result<Route> {
        let url = self.url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .with_context(|| format!("url {url:?}: write scheme://host[:port]/path"))?;
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, "/"),
        };
        let origin = Origin::parse(&format!("{scheme}://{authority}"))
            .with_context(|| format!("url {url:?}"))?;
        let (path, query) = match path.split_once('?') {
            Some((path, query)) => (path, Some(query.to_string())),
            None => (path, None),
        };
        if path.contains('#') || query.as_deref().is_some_and(|q| q.contains('#')) {
            bail!("url {url:?}: a fragment is never sent");
        }
        let (path, prefix) = match path.strip_suffix('*') {
            Some(path) => (path.to_string(), true),
            None => (path.to_string(), false),
        };
        let method = match &self.method {
            Some(method) if method.len() <= 32 => Some(
                Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                    .with_context(|| format!("method {method:?}"))?,
            ),
            Some(method) => bail!("method {method:?}: at most 32 characters"),
            None => None,
        };
        let status = match StatusCode::from_u16(self.status) {
            Ok(status) if (200..=599).contains(&self.status) => status,
            _ => bail!("status {}: 200 to 599", self.status),
        };
        let mut headers = Vec::new();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .with_context(|| format!("header {name:?}: not a header name"))?;
            let value = HeaderValue::from_str(value)
                .with_context(|| format!("header {name}: {value:?} is not a header value"))?;
            headers.push((name, value));
        }
        let body = match (&self.body, &self.json) {
            (Some(_), Some(_)) => bail!("body or json, not both"),
            (Some(body), None) => body.clone().into_bytes(),
            (None, Some(json)) => {
                let typed = headers
                    .iter()
                    .any(|(name, _)| name == axum::http::header::CONTENT_TYPE);
                if !typed {
                    headers.push((
                        axum::http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    ));
                }
                json.to_string().into_bytes()
            }
            (None, None) => Vec::new(),
        };
        let delay = Duration::from_millis(self.delay_ms);
        if delay > MAX_DELAY {
            bail!(
                "delay_ms {}: at most {}",
                self.delay_ms,
                MAX_DELAY.as_millis()
            );
        }
        Ok(Route {
            url: url.to_string(),
            origin,
            method,
            path,
            prefix,
            query,
            request_contains: self.request_contains.clone(),
            status,
            headers,
            body,
            delay,
            times: self.times,
        })
    }
}

/// Checks every mock of a scenario; the origins they mock.
pub fn check(mocks: &[HttpMock]) -> Result<Vec<Origin>> {
    let mut origins = Vec::new();
    for (n, mock) in mocks.iter().enumerate() {
        let route = mock
            .route()
            .with_context(|| format!("http mock {}", n + 1))?;
        if !origins.contains(&route.origin) {
            origins.push(route.origin);
        }
    }
    Ok(origins)
}

/// What one scenario's requests found.
#[derive(Debug, Default)]
struct Seen {
    routes: Vec<Route>,
    /// Requests answered, by route.
    answered: Vec<usize>,
    /// Requests no route answered: the first [`NAMED_MISSES`], and how many in all.
    misses: Vec<String>,
    missed: usize,
}

/// The loopback servers standing in for the mocked origins, and the answers of the scenario running.
pub struct MockOrigins {
    seen: Arc<Mutex<Seen>>,
    servers: Vec<(Origin, SocketAddr, tokio::task::JoinHandle<()>)>,
}

impl MockOrigins {
    /// Starts a server on loopback for each of `origins`.
    pub async fn start(origins: &[Origin]) -> Result<MockOrigins> {
        if origins.len() > MAX_ORIGINS {
            bail!(
                "{} origins are mocked; at most {MAX_ORIGINS} may be",
                origins.len()
            );
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut servers = Vec::new();
        for origin in origins {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let address = listener.local_addr()?;
            let app = axum::Router::new()
                .fallback(answer)
                .with_state((origin.clone(), seen.clone()));
            let serving = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            servers.push((origin.clone(), address, serving));
        }
        Ok(MockOrigins { seen, servers })
    }

    /// `policy` with the mocked origins allowed and answered by their servers.
    pub fn policy(&self, policy: &HttpPolicy) -> HttpPolicy {
        let mut policy = policy.clone();
        for (origin, address, _) in &self.servers {
            policy.allow.push(origin.clone());
            policy.stand_ins.push((origin.clone(), *address));
        }
        policy
    }

    /// From now on the servers answer as `mocks` say (checked by [`check`]); what was asked before is
    /// forgotten.
    pub fn set(&self, mocks: &[HttpMock]) -> Result<()> {
        let routes = mocks
            .iter()
            .map(HttpMock::route)
            .collect::<Result<Vec<_>>>()?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen = Seen {
            answered: vec![0; routes.len()],
            routes,
            ..Seen::default()
        };
        Ok(())
    }

    /// What went wrong with the requests since [`MockOrigins::set`]: one no mock answered, or a mock
    /// asked another number of times than its `times`.
    pub fn report(&self) -> Result<()> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.missed > 0 {
            let more = seen.missed - seen.misses.len();
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            bail!(
                "no mock answers {}{more} (each got 501)",
                seen.misses.join(", ")
            );
        }
        for (route, answered) in seen.routes.iter().zip(&seen.answered) {
            if let Some(times) = route.times {
                if *answered != times {
                    let method = route.method.as_ref().map_or("any method", Method::as_str);
                    bail!(
                        "the mock of {} ({method}) was to answer {times} request(s); it answered {answered}",
                        route.url
                    );
                }
            }
        }
        Ok(())
    }
}

impl Drop for MockOrigins {
    fn drop(&mut self) {
        for (_, _, serving) in &self.servers {
            serving.abort();
        }
    }
}

/// A mocked origin's answer to `request`: the first route of the scenario that matches it, or 501.
async fn answer(
    State((origin, seen)): State<(Origin, Arc<Mutex<Seen>>)>,
    request: Request,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let body = axum::body::to_bytes(request.into_body(), MAX_REQUEST_BODY)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
    let found = {
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let at = seen.routes.iter().position(|route| {
            route.origin == origin
                && route.method.as_ref().is_none_or(|m| *m == method)
                && if route.prefix {
                    path.starts_with(&route.path)
                } else {
                    path == route.path
                }
                && route
                    .query
                    .as_ref()
                    .is_none_or(|q| Some(q) == query.as_ref())
                && route
                    .request_contains
                    .as_ref()
                    .is_none_or(|part| body.as_ref().is_ok_and(|body| body.contains(part.as_str())))
        });
        match at {
            Some(at) => {
                seen.answered[at] += 1;
                let route = &seen.routes[at];
                Some((
                    route.status,
                    route.headers.clone(),
                    route.body.clone(),
                    route.delay,
                ))
            }
            None => {
                seen.missed += 1;
                if seen.misses.len() < NAMED_MISSES {
                    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
                    let asked = format!("{method} {origin}{path}{query}");
                    seen.misses.push(
                        super::transcript::one_line(&asked)
                            .chars()
                            .take(200)
                            .collect(),
                    );
                }
                None
            }
        }
    };
    let Some((status, headers, body, delay)) = found else {
        let mut response = Response::new(Body::from("no mock answers this request\n"));
        *response.status_mut() = StatusCode::NOT_IMPLEMENTED;
        return response;
    };
    tokio::time::sleep(delay).await;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().append(name, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mock(url: &str) -> HttpMock {
        HttpMock {
            url: url.into(),
            method: None,
            request_contains: None,
            status: 200,
            headers: BTreeMap::new(),
            body: None,
            json: None,
            delay_ms: 0,
            times: None,
        }
    }

    #[test]
    fn a_url_is_an_origin_a_path_a_prefix_and_a_query() {
        let route = mock("https://API.example.com/orders/*").route().unwrap();
        assert_eq!(route.origin.to_string(), "https://api.example.com");
        assert_eq!((route.path.as_str(), route.prefix), ("/orders/", true));
        let route = mock("http://127.0.0.1:8089/q?a=1").route().unwrap();
        assert_eq!(route.query.as_deref(), Some("a=1"));
        assert_eq!(mock("https://x.example").route().unwrap().path, "/");
    }

    #[test]
    fn a_mock_that_cannot_answer_is_refused_with_why() {
        let mut bad = mock("ftp://x.example/");
        assert!(bad.route().is_err());
        bad = mock("https://x.example/");
        bad.status = 99;
        assert!(bad.route().unwrap_err().to_string().contains("200 to 599"));
        bad.status = 200;
        bad.body = Some("a".into());
        bad.json = Some(serde_json::json!({}));
        assert!(bad.route().unwrap_err().to_string().contains("not both"));
        bad.json = None;
        bad.headers.insert("bad name".into(), "v".into());
        assert!(bad.route().is_err());
        bad.headers.clear();
        bad.delay_ms = 60_001;
        assert!(bad.route().is_err());
    }
}
