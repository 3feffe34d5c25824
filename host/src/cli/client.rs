//! The admin API's HTTP client: one request per connection, typed answers, errors that name the URL.

use super::*;

/// The admin API's address: `http[s]://HOST[:PORT][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AdminUrl {
    /// `https://`: the connection is TLS, its certificate checked against the host name.
    pub(super) tls: bool,
    /// What to connect to (an IPv6 address without its brackets).
    pub(super) host: String,
    pub(super) port: u16,
    /// The `Host` header: the URL's authority as written.
    pub(super) authority: String,
    /// A path the API sits under (a proxy's), without the trailing slash; usually empty.
    pub(super) prefix: String,
}

impl AdminUrl {
    pub(super) fn parse(text: &str) -> Result<AdminUrl> {
        let text = text.trim();
        let uri: Uri = text
            .parse()
            .map_err(|_| anyhow!("the admin URL {text:?} is not a URL like {DEFAULT_ADMIN}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                bail!("the admin URL must start with http:// or https://, not {other}://")
            }
            None => {
                bail!("the admin URL {text:?} needs http:// or https://, as in {DEFAULT_ADMIN}")
            }
        };
        let authority = uri
            .authority()
            .context("the admin URL has no host")?
            .as_str();
        if authority.contains('@') {
            // Said without the URL: what is before the @ may be a secret.
            bail!(
                "the admin URL must not hold a user or password; the token comes from --token-file \
                 or VOICEHOST_TOKEN"
            );
        }
        if uri.query().is_some() {
            bail!("the admin URL {text} must not have a query (?…)");
        }
        let host = uri.host().context("the admin URL has no host")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = bare.eq_ignore_ascii_case("localhost")
            || bare
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !tls && !loopback {
            // The token would cross the network in clear (and `serve` answers plain HTTP on loopback only).
            bail!(
                "the admin URL {text} is plain http:// to another machine: use https:// (the host \
                 serves TLS with [admin] tls_cert), or an SSH tunnel to its loopback address"
            );
        }
        Ok(AdminUrl {
            tls,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            authority: authority.to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// The origin-form target of an API path (`/v1/agents`).
    pub(super) fn target(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// The full URL of an API path, for messages.
    pub(super) fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority, self.target(path))
    }
}

/// An error the API answered with: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ApiError {
    pub(super) status: u16,
    pub(super) code: String,
    pub(super) message: String,
}

impl ApiError {
    /// The API's error, if `body` is one ([`ErrorBody`]); else `None` (a proxy's page, say).
    pub(super) fn from_answer(status: StatusCode, body: &[u8]) -> Option<ApiError> {
        let ErrorBody { error } = serde_json::from_slice(body).ok()?;
        Some(ApiError {
            status: status.as_u16(),
            code: clean(&error.code),
            message: clean(&error.message),
        })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, HTTP {})", self.message, self.code, self.status)
    }
}

impl std::error::Error for ApiError {}

/// What a request sends.
pub enum Body {
    /// No body.
    Empty,
    /// JSON (`application/json`).
    Json(Value),
    /// A component's bytes (`application/wasm`), for an upload.
    Wasm(Vec<u8>),
}

impl Body {
    /// A request body of JSON: one of the API's request types ([`ActivateRequest`], [`FailurePolicy`]).
    pub fn json(body: &impl Serialize) -> Result<Body> {
        Ok(Body::Json(
            serde_json::to_value(body).context("cannot write the request's JSON")?,
        ))
    }
}

/// A client of the admin API, as one tenant: its address, the tenant's admin token and a timeout per request.
/// Public: the demo uses it.
pub struct Client {
    pub(super) admin: AdminUrl,
    pub(super) token: String,
    /// For the whole request: connecting, sending, the host's work, the answer.
    pub(super) timeout: Duration,
    /// For an `https://` API: the TLS client, trusting the web's roots and the `--ca-file`.
    pub(super) tls: Option<tokio_rustls::TlsConnector>,
}

impl Client {
    /// A client of the admin API at `admin` (`http[s]://host:port`), as the tenant whose token this is;
    /// an `https://` API's certificate must chain to the web's roots or to a certificate in `ca_file`.
    pub fn new(
        admin: &str,
        token: String,
        timeout: Duration,
        ca_file: Option<&Path>,
    ) -> Result<Client> {
        let admin = AdminUrl::parse(admin)?;
        let tls = match admin.tls {
            true => Some(crate::tls::client(ca_file).context("--ca-file")?),
            false => None,
        };
        Ok(Client {
            admin,
            token,
            timeout,
            tls,
        })
    }

    /// One request; the answer's JSON, or `None` for an answer with no body (204).
    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<Option<Value>> {
        let url = self.admin.url(path);
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body, &url)).await {
            Ok(answer) => answer,
            Err(_) => bail!(
                "no answer from {url} within {} s (--timeout raises the limit)",
                self.timeout.as_secs_f32()
            ),
        }
    }

    /// A request whose answer must be JSON, as the host wrote it (whatever its shape).
    pub async fn json(&self, method: Method, path: &str, body: Body) -> Result<Value> {
        self.send(method, path, body).await?.with_context(|| {
            format!(
                "{} answered with no body where JSON was expected",
                self.admin.url(path)
            )
        })
    }

    /// A request whose answer must be the view `T` of [`crate::api::views`] (an [`AgentList`], an
    /// [`AgentView`], …); an answer of another shape is an error naming the URL.
    pub async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<T> {
        let answer = self.json(method, path, body).await?;
        view(answer, &self.admin.url(path))
    }

    pub(super) async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Body,
        url: &str,
    ) -> Result<Option<Value>> {
        let (content_type, bytes) = match body {
            Body::Empty => (None, Bytes::new()),
            Body::Json(value) => (Some("application/json"), Bytes::from(value.to_string())),
            Body::Wasm(wasm) => (Some("application/wasm"), Bytes::from(wasm)),
        };
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", self.token))
            .map_err(|_| anyhow!("the admin token cannot go in an HTTP header"))?;
        authorization.set_sensitive(true);
        let mut request = Request::builder()
            .method(method)
            .uri(self.admin.target(path))
            .header(header::HOST, &self.admin.authority)
            .header(header::AUTHORIZATION, authorization)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("voicehost/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let request = request
            .body(Full::new(bytes))
            .with_context(|| format!("cannot make a request for {url}"))?;

        let connect = TcpStream::connect((self.admin.host.as_str(), self.admin.port));
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => bail!(
                "cannot connect to {url}: {error}; is `voicehost serve` running there? (--admin or \
                 VOICEHOST_ADMIN says where)"
            ),
            Err(_) => bail!(
                "cannot connect to {url}: no answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ),
        };
        let answer = match &self.tls {
            None => self.over(stream, request, url).await?,
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.admin.host.clone())
                    .with_context(|| format!("{url}: not a host name TLS can check"))?;
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, stream))
                    .await
                    .map_err(|_| {
                        anyhow!(
                            "cannot connect to {url}: no TLS handshake within {} s",
                            CONNECT_TIMEOUT.as_secs()
                        )
                    })?
                    .with_context(|| {
                        format!(
                            "cannot open TLS with {url} (--ca-file names a certificate to trust)"
                        )
                    })?;
                self.over(stream, request, url).await?
            }
        };
        let status = answer.status();
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|error| anyhow!("cannot read the answer from {url}: {error}"))?
            .to_bytes();
        interpret(status, &body, url)
    }

    /// Sends `request` over `stream` and waits for the answer's head.
    async fn over<S>(
        &self,
        stream: S,
        request: Request<Full<Bytes>>,
        url: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("cannot speak HTTP/1.1 with {url}"))?;
        // Drives the connection; it ends once the answer is read and `sender` is gone.
        tokio::spawn(connection);
        sender
            .send_request(request)
            .await
            .with_context(|| format!("the request to {url} failed"))
    }
}

/// `answer` read as the view `T`, or an error naming `url` and what did not fit.
pub(super) fn view<T: DeserializeOwned>(answer: Value, url: &str) -> Result<T> {
    serde_json::from_value(answer).map_err(|error| {
        anyhow!(
            "{url} answered with JSON this voicehost does not understand: {}; is the host a \
             different version of voicehost? (--json prints the answer as it is)",
            clean(&error.to_string())
        )
    })
}

/// The JSON of a successful answer (`None` when it has no body), or the error it says.
pub(super) fn interpret(status: StatusCode, body: &[u8], url: &str) -> Result<Option<Value>> {
    if status.is_success() {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        return serde_json::from_slice(body).map(Some).map_err(|_| {
            anyhow!(
                "{url} answered HTTP {status} with something that is not JSON: is --admin the \
                 admin API of `voicehost serve`?"
            )
        });
    }
    if let Some(error) = ApiError::from_answer(status, body) {
        return Err(error.into());
    }
    // Not the API's error (a proxy's, say): its status and the start of what it said.
    let text = String::from_utf8_lossy(body);
    let first = clean(
        text.lines()
            .find(|line| !line.trim().is_empty())
            .unwrap_or(""),
    );
    let first: String = first.trim().chars().take(200).collect();
    if first.is_empty() {
        bail!("{url} answered HTTP {status}");
    }
    bail!("{url} answered HTTP {status}: {first}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn admin_urls() {
        let url = AdminUrl::parse(DEFAULT_ADMIN).unwrap();
        assert_eq!(
            url,
            AdminUrl {
                tls: false,
                host: "127.0.0.1".into(),
                port: 7070,
                authority: "127.0.0.1:7070".into(),
                prefix: String::new()
            }
        );
        assert_eq!(url.target("/v1/agents"), "/v1/agents");
        assert_eq!(url.url("/v1/agents"), "http://127.0.0.1:7070/v1/agents");

        let url = AdminUrl::parse("https://admin.internal/voicehost/").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("admin.internal", 443));
        assert_eq!(url.target("/v1/sessions"), "/voicehost/v1/sessions");
        assert_eq!(
            url.url("/v1/sessions"),
            "https://admin.internal/voicehost/v1/sessions"
        );
        let error = AdminUrl::parse("http://admin.internal:7070")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("plain http:// to another machine"),
            "{error}"
        );
        assert!(AdminUrl::parse("http://localhost:7070").is_ok());

        let url = AdminUrl::parse("http://[::1]:7070").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", 7070));
        assert_eq!(url.authority, "[::1]:7070");

        let url = AdminUrl::parse("https://admin.example.com").unwrap();
        assert!(url.tls);
        assert_eq!((url.host.as_str(), url.port), ("admin.example.com", 443));
        assert_eq!(url.url("/healthz"), "https://admin.example.com/healthz");
        assert!(AdminUrl::parse("ftp://host").is_err());
        assert!(AdminUrl::parse("127.0.0.1:7070").is_err());
        assert!(AdminUrl::parse("http://host:7070/?x=1").is_err());
        assert!(AdminUrl::parse("not a url").is_err());
        let error = AdminUrl::parse("http://user:pa55@host")
            .unwrap_err()
            .to_string();
        assert!(!error.contains("pa55"), "{error}");
    }

    #[test]
    fn api_errors_read_as_message_code_and_status() {
        let body = br#"{"error": {"code": "not_found", "message": "no agent agent_x"}}"#;
        let error =
            interpret(StatusCode::NOT_FOUND, body, "http://h/v1/agents/agent_x").unwrap_err();
        assert_eq!(error.to_string(), "no agent agent_x (not_found, HTTP 404)");
        assert_eq!(
            error.downcast_ref::<ApiError>().map(|e| e.code.as_str()),
            Some("not_found")
        );

        let error = interpret(
            StatusCode::BAD_GATEWAY,
            b"<html>\n<h1>Bad gateway</h1>",
            "http://h/x",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(error, "http://h/x answered HTTP 502 Bad Gateway: <html>");
        let error = interpret(StatusCode::UNAUTHORIZED, b"", "http://h/x").unwrap_err();
        assert_eq!(
            error.to_string(),
            "http://h/x answered HTTP 401 Unauthorized"
        );

        assert_eq!(interpret(StatusCode::NO_CONTENT, b"", "u").unwrap(), None);
        assert_eq!(
            interpret(StatusCode::OK, br#"{"agents": []}"#, "u").unwrap(),
            Some(json!({"agents": []}))
        );
        assert!(interpret(StatusCode::OK, b"<html>", "u").is_err());
    }

    #[test]
    fn an_answer_of_another_shape_is_a_clear_error_naming_the_url() {
        let url = "http://h/v1/agents";
        let understood = |answer: Value| view::<AgentList>(answer, url).map_err(|e| e.to_string());
        for (answer, why) in [
            (
                json!({"agents": {}}),
                "invalid type: map, expected a sequence",
            ),
            (json!(null), "invalid type: null, expected struct AgentList"),
            (json!({"sessions": []}), "missing field `agents`"),
            (
                json!({"agents": [{"agent_id": "agent_1", "status": "serving"}]}),
                "missing field `failure_policy`",
            ),
            (
                json!({"agents": [{"agent_id": "agent_1", "status": "paused\u{1b}[2J"}]}),
                "unknown variant `paused\u{fffd}[2J`",
            ),
        ] {
            let error = understood(answer.clone()).unwrap_err();
            assert!(
                error.starts_with(&format!(
                    "{url} answered with JSON this voicehost does not understand: {why}"
                )),
                "{answer}: {error}"
            );
        }
        assert!(understood(json!({"agents": [], "next": null})).is_ok());
    }
}
