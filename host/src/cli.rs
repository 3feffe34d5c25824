//! `voicehost agents` and `voicehost token`: the operator's side of the admin API of `voicehost serve`
//! (described in `host/openapi.json`). The client speaks plain HTTP/1.1 over hyper, one request per
//! connection, and never shows the admin token: not in output, not in an error.

use crate::api_views::{
    ActivateRequest, AgentList, AgentView, ErrorBody, PartyView, SessionList, VersionView,
};
use crate::call::FailurePolicy;
use crate::config::token_sha256;
use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::io::{BufRead as _, IsTerminal as _, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpStream;

/// Where `voicehost serve` listens for admin requests unless told otherwise.
const DEFAULT_ADMIN: &str = "http://127.0.0.1:7070";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// More than any answer of the API should ever be.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Talks to the admin API of `voicehost serve`. The tenant's admin token comes from --token-file or the
/// VOICEHOST_TOKEN environment variable, never from a flag (flags show in `ps`).
#[derive(clap::Args)]
pub struct AgentsArgs {
    /// The admin API of `voicehost serve`; plain http:// (for a remote host, use an SSH tunnel or a
    /// TLS-terminating proxy on the host's machine).
    #[arg(long, global = true, value_name = "URL", env = "VOICEHOST_ADMIN", default_value = DEFAULT_ADMIN)]
    admin: String,
    /// A file holding the tenant's admin token (instead of the VOICEHOST_TOKEN environment variable).
    #[arg(long, global = true, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for a whole request (an upload waits for the host to compile the component).
    #[arg(long, global = true, value_name = "SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    #[command(subcommand)]
    command: AgentsCommand,
}

#[derive(clap::Subcommand, Debug, PartialEq, Eq)]
enum AgentsCommand {
    /// The tenant's agents: active version, number of versions, live calls, failure policy.
    List,
    /// One agent and its versions.
    Show {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
    },
    /// Upload a component (.wasm) as the agent's next version; the host compiles and checks it before
    /// storing anything. The first upload for an agent id creates the agent.
    Upload {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// The component, e.g. target/wasm32-wasip2/release/my_agent.wasm.
        file: PathBuf,
        /// Make it the active version at once (new calls get it; live calls finish on theirs).
        #[arg(long)]
        activate: bool,
    },
    /// Make a version the active one: new calls get it, live calls finish on theirs.
    Activate {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// The version number (see `voicehost agents show AGENT`).
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        version: u32,
    },
    /// Activate the version that was active before the current one.
    Rollback {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
    },
    /// Delete one version (not the active one), or without --version the whole agent: its connections to
    /// Sent close and its live calls go to Sent's fallback.
    Delete {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// Delete only this version.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        version: Option<u32>,
    },
    /// What happens to a call whose agent keeps trapping: `hangup`, or `transfer:KIND:VALUE` (e.g.
    /// `transfer:number:+14155550100`).
    Policy {
        /// The agent's id, as Sent knows it (agent_…).
        #[arg(value_name = "AGENT", value_parser = agent_id)]
        agent: String,
        /// `hangup`, or `transfer:KIND:VALUE` where KIND is Sent's party kind (number, user, agent, …).
        #[arg(value_name = "hangup|transfer:KIND:VALUE")]
        policy: FailurePolicy,
    },
    /// The tenant's live calls.
    Sessions,
}

/// Makes the admin tokens of tenants for the host's configuration, which keeps only their SHA-256.
#[derive(clap::Subcommand, Debug, PartialEq, Eq)]
pub enum TokenCommand {
    /// Read a token from standard input and print its SHA-256 in hex (the config's `token_sha256`).
    Hash,
    /// Make a fresh random token: prints the token, then the `token_sha256 = "…"` line for the config.
    New,
}

/// `voicehost agents …`: one request to the admin API, its answer as a table (or JSON with --json).
pub async fn run(args: AgentsArgs) -> Result<()> {
    let client = Client::new(
        &args.admin,
        read_token(args.token_file.as_deref())?,
        Duration::from_secs(args.timeout),
    )?;
    let output = execute(&client, args.command, args.json).await?;
    print!("{output}");
    Ok(())
}

/// `voicehost token hash|new`.
pub fn token(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Hash => {
            let token = token_from_stdin()?;
            println!("{}", token_sha256(&token));
        }
        TokenCommand::New => {
            let token = new_token()?;
            println!("{token}");
            println!("token_sha256 = \"{}\"", token_sha256(&token));
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "(the first line is the tenant's token, shown only now; the second goes in the \
                     tenant's entry of the config)"
                );
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Arguments

/// An agent id as the API takes it (the config's rule, [`crate::config::valid_agent_id`]; safe in a
/// URL path as it is).
fn agent_id(text: &str) -> Result<String, String> {
    if crate::config::valid_agent_id(text) {
        Ok(text.to_string())
    } else {
        Err(crate::config::AGENT_ID_RULE.into())
    }
}

// ---------------------------------------------------------------------------------------------------
// Tokens

/// The tenant's admin token, from `file` or else VOICEHOST_TOKEN, trimmed. No error shows any of it.
fn read_token(file: Option<&Path>) -> Result<String> {
    let text = match file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the admin token from {}", path.display()))?,
        // Not `?` on the VarError: its message would show a value that is not Unicode.
        None => std::env::var("VOICEHOST_TOKEN")
            .map_err(|_| anyhow!("no admin token: set VOICEHOST_TOKEN or pass --token-file"))?,
    };
    let token = text.trim();
    let from = match file {
        Some(path) => path.display().to_string(),
        None => "VOICEHOST_TOKEN".into(),
    };
    if token.is_empty() {
        bail!("the admin token in {from} is empty");
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "the admin token in {from} holds spaces or characters that cannot go in an HTTP header"
        );
    }
    Ok(token.to_string())
}

fn token_from_stdin() -> Result<String> {
    let stdin = std::io::stdin();
    let mut text = String::new();
    if stdin.is_terminal() {
        eprint!("token (then Enter): ");
        stdin.lock().read_line(&mut text)
    } else {
        stdin.lock().read_to_string(&mut text)
    }
    .context("cannot read the token from standard input")?;
    let token = text.trim();
    if token.is_empty() {
        bail!("no token on standard input");
    }
    if token.chars().any(char::is_whitespace) {
        bail!("standard input holds more than the token (spaces or several lines)");
    }
    Ok(token.to_string())
}

/// `vh_` and 32 random bytes from the kernel, in hex.
fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(format!("vh_{}", crate::content::hex(&bytes)))
}

// ---------------------------------------------------------------------------------------------------
// The HTTP client

/// The admin API's address: `http://HOST[:PORT][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AdminUrl {
    /// What to connect to (an IPv6 address without its brackets).
    host: String,
    port: u16,
    /// The `Host` header: the URL's authority as written.
    authority: String,
    /// A path the API sits under (a proxy's), without the trailing slash; usually empty.
    prefix: String,
}

impl AdminUrl {
    fn parse(text: &str) -> Result<AdminUrl> {
        let text = text.trim();
        let uri: Uri = text
            .parse()
            .map_err(|_| anyhow!("the admin URL {text:?} is not a URL like {DEFAULT_ADMIN}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!(
                "the admin URL {text} is https://, but voicehost speaks plain HTTP to its admin API: \
                 for a remote host, use an SSH tunnel (ssh -L 7070:127.0.0.1:7070 HOST, then --admin \
                 http://127.0.0.1:7070) or a TLS-terminating proxy on the same machine as \
                 `voicehost serve`, and give its http:// address"
            ),
            Some(other) => bail!("the admin URL must start with http://, not {other}://"),
            None => bail!("the admin URL {text:?} needs http://, as in {DEFAULT_ADMIN}"),
        }
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
        Ok(AdminUrl {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: uri.port_u16().unwrap_or(80),
            authority: authority.to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// The origin-form target of an API path (`/v1/agents`).
    fn target(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// The full URL of an API path, for messages.
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.authority, self.target(path))
    }
}

/// An error the API answered with: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiError {
    status: u16,
    code: String,
    message: String,
}

impl ApiError {
    /// The API's error, if `body` is one ([`ErrorBody`]); else `None` (a proxy's page, say).
    fn from_answer(status: StatusCode, body: &[u8]) -> Option<ApiError> {
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
    Empty,
    Json(Value),
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

pub struct Client {
    admin: AdminUrl,
    token: String,
    /// For the whole request: connecting, sending, the host's work, the answer.
    timeout: Duration,
}

impl Client {
    /// A client of the admin API at `admin` (`http://host:port`), as the tenant whose token this is.
    pub fn new(admin: &str, token: String, timeout: Duration) -> Result<Client> {
        Ok(Client {
            admin: AdminUrl::parse(admin)?,
            token,
            timeout,
        })
    }

    /// One request; the answer's JSON, or `None` for an answer with no body (204).
    async fn send(&self, method: Method, path: &str, body: Body) -> Result<Option<Value>> {
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

    /// A request whose answer must be the view `T` of [`crate::api_views`] (an [`AgentList`], an
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

    async fn exchange(
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
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("cannot speak HTTP/1.1 with {url}"))?;
        // Drives the connection; it ends once the answer is read and `sender` is gone.
        tokio::spawn(connection);
        let answer = sender
            .send_request(request)
            .await
            .with_context(|| format!("the request to {url} failed"))?;
        let status = answer.status();
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|error| anyhow!("cannot read the answer from {url}: {error}"))?
            .to_bytes();
        interpret(status, &body, url)
    }
}

/// `answer` read as the view `T`, or an error naming `url` and what did not fit.
fn view<T: DeserializeOwned>(answer: Value, url: &str) -> Result<T> {
    serde_json::from_value(answer).map_err(|error| {
        anyhow!(
            "{url} answered with JSON this voicehost does not understand: {}; is the host a \
             different version of voicehost? (--json prints the answer as it is)",
            clean(&error.to_string())
        )
    })
}

/// The JSON of a successful answer (`None` when it has no body), or the error it says.
fn interpret(status: StatusCode, body: &[u8], url: &str) -> Result<Option<Value>> {
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

// ---------------------------------------------------------------------------------------------------
// The commands

async fn execute(client: &Client, command: AgentsCommand, json: bool) -> Result<String> {
    let output = match command {
        AgentsCommand::List => {
            let answer = client.json(Method::GET, "/v1/agents", Body::Empty).await?;
            render(client, "/v1/agents", answer, json, agents_table)?
        }
        AgentsCommand::Show { agent } => {
            let path = format!("/v1/agents/{agent}");
            let answer = client.json(Method::GET, &path, Body::Empty).await?;
            render(client, &path, answer, json, agent_text)?
        }
        AgentsCommand::Upload {
            agent,
            file,
            activate,
        } => {
            let wasm =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let query = if activate { "?activate=true" } else { "" };
            let path = format!("/v1/agents/{agent}/versions{query}");
            let answer = client.json(Method::POST, &path, Body::Wasm(wasm)).await?;
            render(client, &path, answer, json, |version: &VersionView| {
                uploaded(&agent, version)
            })?
        }
        AgentsCommand::Activate { agent, version } => {
            let path = format!("/v1/agents/{agent}/activate");
            let body = Body::json(&ActivateRequest { version })?;
            let answer = client.json(Method::POST, &path, body).await?;
            render(client, &path, answer, json, activated)?
        }
        AgentsCommand::Rollback { agent } => {
            let path = format!("/v1/agents/{agent}/rollback");
            let answer = client.json(Method::POST, &path, Body::Empty).await?;
            render(client, &path, answer, json, activated)?
        }
        AgentsCommand::Delete { agent, version } => {
            let path = match version {
                Some(version) => format!("/v1/agents/{agent}/versions/{version}"),
                None => format!("/v1/agents/{agent}"),
            };
            // 204: no JSON to print, so --json prints nothing.
            client.send(Method::DELETE, &path, Body::Empty).await?;
            match (json, version) {
                (true, _) => String::new(),
                (false, Some(version)) => format!("{agent}: deleted version {version}\n"),
                (false, None) => format!(
                    "{agent}: deleted; its connections to Sent are closed and its live calls went to \
                     Sent's fallback\n"
                ),
            }
        }
        AgentsCommand::Policy { agent, policy } => {
            let path = format!("/v1/agents/{agent}/failure-policy");
            let answer = client
                .json(Method::PUT, &path, Body::json(&policy)?)
                .await?;
            render(client, &path, answer, json, |agent: &AgentView| {
                format!(
                    "{}: a call whose agent keeps trapping gets {}\n",
                    clean(&agent.agent_id),
                    policy_text(&agent.failure_policy)
                )
            })?
        }
        AgentsCommand::Sessions => {
            let answer = client
                .json(Method::GET, "/v1/sessions", Body::Empty)
                .await?;
            render(client, "/v1/sessions", answer, json, sessions_table)?
        }
    };
    Ok(output)
}

/// The answer to `path`: with --json, the host's JSON as it came (not re-read as a view, so nothing a
/// newer host adds is dropped, and a script sees exactly what the API says); else read as the view `T`
/// and rendered as text.
fn render<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    answer: Value,
    json: bool,
    text: impl FnOnce(&T) -> String,
) -> Result<String> {
    if json {
        return Ok(pretty(&answer));
    }
    Ok(text(&view(answer, &client.admin.url(path))?))
}

// ---------------------------------------------------------------------------------------------------
// Rendering

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

/// Columns padded to their widest cell, two spaces apart, no trailing spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|title| title.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|title| title.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}  "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What the server or Sent sent, safe to print on a terminal (no escape sequences).
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// A number, or `-` for none.
fn number_text(number: Option<u32>) -> String {
    number.map_or_else(|| "-".into(), |number| number.to_string())
}

fn policy_text(policy: &FailurePolicy) -> String {
    clean(&policy.to_string())
}

fn party_text(party: &PartyView) -> String {
    match &party.value {
        Some(value) => clean(&format!("{}:{value}", party.kind)),
        // An anonymous caller has no value.
        None => clean(&party.kind),
    }
}

fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..0x10_0000 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)),
    }
}

/// `sha256:` and the first 12 hex digits.
fn short_digest(digest: &str) -> String {
    let digest = clean(digest);
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() > 12 => format!("sha256:{}", &hex[..12]),
        _ => digest,
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` in UTC.
fn time_text(seconds: u64) -> String {
    // Past i64 is past any date worth printing; held there, the arithmetic below cannot overflow.
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// The agent's status, with Sent's reason when it refused the agent.
fn status_text(agent: &AgentView) -> String {
    let status = agent.status.as_str();
    match &agent.status_detail {
        Some(detail) => format!("{status} ({})", clean(detail)),
        None => status.into(),
    }
}

/// `voicehost agents list`: one line per agent.
pub fn agents_table(list: &AgentList) -> String {
    if list.agents.is_empty() {
        return "no agents yet (voicehost agents upload AGENT FILE --activate)\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .agents
        .iter()
        .map(|agent| {
            vec![
                clean(&agent.agent_id),
                agent.status.as_str().into(),
                number_text(agent.active_version),
                agent.versions.len().to_string(),
                agent.live_sessions.to_string(),
                policy_text(&agent.failure_policy),
            ]
        })
        .collect();
    table(
        &[
            "AGENT",
            "STATUS",
            "ACTIVE",
            "VERSIONS",
            "LIVE CALLS",
            "ON FAILURE",
        ],
        &rows,
    )
}

/// `voicehost agents show`: the agent, then its versions.
fn agent_text(agent: &AgentView) -> String {
    let active = match agent.active_version {
        None => "none (the agent serves no calls)".to_string(),
        Some(version) => format!("version {version}"),
    };
    let mut out = table(
        &["agent", &clean(&agent.agent_id)],
        &[
            vec!["status".into(), status_text(agent)],
            vec!["active".into(), active],
            vec!["on failure".into(), policy_text(&agent.failure_policy)],
            vec!["live calls".into(), agent.live_sessions.to_string()],
        ],
    );
    out.push('\n');
    if agent.versions.is_empty() {
        out.push_str("no versions\n");
        return out;
    }
    let rows: Vec<Vec<String>> = agent
        .versions
        .iter()
        .map(|version| {
            vec![
                version.version.to_string(),
                short_digest(&version.digest),
                size_text(version.size_bytes),
                time_text(version.uploaded_at),
                if version.active {
                    "*".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &["VERSION", "DIGEST", "SIZE", "UPLOADED (UTC)", "ACTIVE"],
        &rows,
    ));
    out
}

/// `voicehost agents sessions`: one line per live call.
fn sessions_table(list: &SessionList) -> String {
    if list.sessions.is_empty() {
        return "no live calls\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .sessions
        .iter()
        .map(|session| {
            let media = match session.sample_rate {
                Some(rate) => format!("{} {rate} Hz", session.media.as_str()),
                None => session.media.as_str().into(),
            };
            vec![
                clean(&session.session_id),
                clean(&session.call_id),
                clean(&session.agent_id),
                session.version.to_string(),
                session.direction.as_str().into(),
                media,
                party_text(&session.from),
                party_text(&session.to),
                clean(&session.started_at),
            ]
        })
        .collect();
    table(
        &[
            "SESSION",
            "CALL",
            "AGENT",
            "VERSION",
            "DIRECTION",
            "MEDIA",
            "FROM",
            "TO",
            "STARTED",
        ],
        &rows,
    )
}

fn uploaded(agent: &str, version: &VersionView) -> String {
    let number = version.version;
    let then = if version.active {
        "it is active: new calls get it".to_string()
    } else {
        format!("activate it with `voicehost agents activate {agent} {number}`")
    };
    format!(
        "{agent}: uploaded version {number} ({}, {}); {then}\n",
        clean(&version.digest),
        size_text(version.size_bytes)
    )
}

fn activated(agent: &AgentView) -> String {
    format!(
        "{}: version {} is active: new calls get it, live calls finish on theirs\n",
        clean(&agent.agent_id),
        number_text(agent.active_version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::json;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// The commands as main.rs declares them.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Agents(AgentsArgs),
        #[command(subcommand)]
        Token(TokenCommand),
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        let args = std::iter::once("voicehost").chain(args.iter().copied());
        Cli::try_parse_from(args).map(|cli| cli.command)
    }

    fn agents(args: &[&str]) -> AgentsArgs {
        match parse(&[&["agents"][..], args].concat()) {
            Ok(Command::Agents(args)) => args,
            Ok(Command::Token(_)) => panic!("not agents"),
            Err(error) => panic!("{args:?}: {error}"),
        }
    }

    #[test]
    fn the_commands_are_well_formed() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn policy_arguments_parse_into_the_apis_body() {
        let args = agents(&["policy", "agent_abc123", "hangup"]);
        assert_eq!(
            args.command,
            AgentsCommand::Policy {
                agent: "agent_abc123".into(),
                policy: FailurePolicy::HangUp
            }
        );
        let args = agents(&["policy", "agent_1", "transfer:sip:sip:desk@example.com"]);
        let AgentsCommand::Policy { policy, .. } = args.command else {
            panic!("not policy");
        };
        assert_eq!(
            json!(policy),
            json!({"action": "transfer", "to": {"kind": "sip", "value": "sip:desk@example.com"}})
        );
        for bad in ["", "hang-up", "transfer:number", "transfer::+1"] {
            assert!(
                parse(&["agents", "policy", "agent_1", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn agent_ids_versions_and_options_are_checked_when_parsing() {
        assert!(agent_id("agent_abc123").is_ok());
        assert!(agent_id(&format!("agent_{}", "a".repeat(58))).is_ok());
        for bad in [
            "",
            "agent/../x",
            "agent abc",
            "agent_with_underscores",
            "agént",
            &"a".repeat(65),
            "a?b",
        ] {
            assert!(agent_id(bad).is_err(), "{bad:?}");
            assert!(parse(&["agents", "show", bad]).is_err(), "{bad:?}");
        }
        assert!(parse(&["agents", "activate", "agent_1", "0"]).is_err());
        assert!(parse(&["agents", "activate", "agent_1", "two"]).is_err());
        assert!(parse(&["agents", "delete", "agent_1", "--version", "-1"]).is_err());
        assert!(parse(&["agents", "--timeout", "0", "list"]).is_err());
        assert!(parse(&["agents"]).is_err(), "a subcommand is required");

        let args = agents(&[
            "upload",
            "agent_1",
            "a.wasm",
            "--activate",
            "--json",
            "--admin",
            "http://10.0.0.2:8080",
        ]);
        assert!(args.json);
        assert_eq!(args.admin, "http://10.0.0.2:8080");
        assert_eq!(
            args.command,
            AgentsCommand::Upload {
                agent: "agent_1".into(),
                file: "a.wasm".into(),
                activate: true
            }
        );
        let args = agents(&[
            "--token-file",
            "/run/token",
            "delete",
            "agent_1",
            "--version",
            "2",
        ]);
        assert_eq!(args.token_file, Some(PathBuf::from("/run/token")));
        assert_eq!(
            args.command,
            AgentsCommand::Delete {
                agent: "agent_1".into(),
                version: Some(2)
            }
        );
        assert_eq!(args.timeout, 120);
        assert!(matches!(
            parse(&["token", "new"]),
            Ok(Command::Token(TokenCommand::New))
        ));
        assert!(matches!(
            parse(&["token", "hash"]),
            Ok(Command::Token(TokenCommand::Hash))
        ));
        assert!(parse(&["token", "--token-file", "x", "hash"]).is_err());
    }

    #[test]
    fn a_token_hashes_to_its_sha256_and_new_tokens_are_random() {
        assert_eq!(
            token_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (one, two) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(one, two);
        assert!(one.starts_with("vh_"));
        assert_eq!(one.len(), 3 + 64);
        assert!(one[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_token_file_is_trimmed_and_never_shown_in_an_error() {
        let dir = std::env::temp_dir().join(format!("voicehost-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "  vh_s3cret\n").unwrap();
        assert_eq!(read_token(Some(&file)).unwrap(), "vh_s3cret");
        std::fs::write(&file, "vh_s3cret with-space\n").unwrap();
        let error = format!("{:#}", read_token(Some(&file)).unwrap_err());
        assert!(!error.contains("s3cret"), "{error}");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_token(Some(&file)).is_err());
        let error = format!("{:#}", read_token(Some(&dir.join("absent"))).unwrap_err());
        assert!(error.contains("absent"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn admin_urls() {
        let url = AdminUrl::parse(DEFAULT_ADMIN).unwrap();
        assert_eq!(
            url,
            AdminUrl {
                host: "127.0.0.1".into(),
                port: 7070,
                authority: "127.0.0.1:7070".into(),
                prefix: String::new()
            }
        );
        assert_eq!(url.target("/v1/agents"), "/v1/agents");
        assert_eq!(url.url("/v1/agents"), "http://127.0.0.1:7070/v1/agents");

        let url = AdminUrl::parse("http://admin.internal/voicehost/").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("admin.internal", 80));
        assert_eq!(url.target("/v1/sessions"), "/voicehost/v1/sessions");
        assert_eq!(
            url.url("/v1/sessions"),
            "http://admin.internal/voicehost/v1/sessions"
        );

        let url = AdminUrl::parse("http://[::1]:7070").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", 7070));
        assert_eq!(url.authority, "[::1]:7070");

        let error = AdminUrl::parse("https://admin.example.com")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("SSH tunnel") && error.contains("TLS-terminating proxy"),
            "{error}"
        );
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

    /// `answer` read as the view the CLI expects: the rendering tests feed the API's JSON as written.
    fn parsed<T: DeserializeOwned>(answer: Value) -> T {
        serde_json::from_value(answer).unwrap()
    }

    fn agent_json() -> Value {
        json!({
            "agent_id": "agent_abc123",
            "status": "refused",
            "status_detail": "Sent refused the connection (401): the API key is not valid",
            "active_version": 2,
            "failure_policy": {"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}},
            "live_sessions": 3,
            "versions": [
                {"version": 1, "digest": format!("sha256:{}", "9f86d081884c".repeat(5) + "7d65"),
                 "size_bytes": 1843201, "uploaded_at": 1767225600, "active": false},
                {"version": 2, "digest": format!("sha256:{}", "60303ae22b99".repeat(5) + "8861"),
                 "size_bytes": 900, "uploaded_at": 1767312001, "active": true}
            ]
        })
    }

    #[test]
    fn the_agents_table() {
        let idle = json!({"agent_id": "agent_new", "status": "inactive", "active_version": null,
                          "failure_policy": {"action": "hangup"}, "live_sessions": 0, "versions": []});
        let answer = json!({"agents": [agent_json(), idle]});
        assert_eq!(
            agents_table(&parsed(answer)),
            "AGENT         STATUS    ACTIVE  VERSIONS  LIVE CALLS  ON FAILURE\n\
             agent_abc123  refused   2       2         3           transfer:number:+14155550100\n\
             agent_new     inactive  -       0         0           hangup\n"
        );
        assert!(agents_table(&AgentList { agents: vec![] }).starts_with("no agents yet"));
    }

    #[test]
    fn the_agent_view() {
        assert_eq!(
            agent_text(&parsed(agent_json())),
            "agent       agent_abc123\n\
             status      refused (Sent refused the connection (401): the API key is not valid)\n\
             active      version 2\n\
             on failure  transfer:number:+14155550100\n\
             live calls  3\n\
             \n\
             VERSION  DIGEST               SIZE     UPLOADED (UTC)       ACTIVE\n\
             1        sha256:9f86d081884c  1.8 MiB  2026-01-01 00:00:00\n\
             2        sha256:60303ae22b99  900 B    2026-01-02 00:00:01  *\n"
        );
    }

    #[test]
    fn the_sessions_table() {
        let answer = json!({"sessions": [
            {"session_id": "vs_1", "call_id": "call_1", "agent_id": "agent_abc123", "version": 2,
             "direction": "inbound", "media": "audio", "sample_rate": 16000,
             "started_at": "2026-01-02T15:04:05Z",
             "from": {"kind": "number", "value": "+14155550100"},
             "to": {"kind": "agent", "value": "agent_abc123"}},
            {"session_id": "vs_2", "call_id": "call_2", "agent_id": "agent_abc123", "version": 1,
             "direction": "outbound", "media": "text", "sample_rate": null,
             "started_at": "2026-01-02T15:00:00Z",
             "from": {"kind": "agent", "value": "agent_abc123"},
             "to": {"kind": "number", "value": "+1415\u{1b}[2J"}}
        ]});
        assert_eq!(
            sessions_table(&parsed(answer)),
            "SESSION  CALL    AGENT         VERSION  DIRECTION  MEDIA           FROM                 \
             TO                  STARTED\n\
             vs_1     call_1  agent_abc123  2        inbound    audio 16000 Hz  number:+14155550100  \
             agent:agent_abc123  2026-01-02T15:04:05Z\n\
             vs_2     call_2  agent_abc123  1        outbound   text            agent:agent_abc123   \
             number:+1415\u{fffd}[2J    2026-01-02T15:00:00Z\n"
        );
        assert_eq!(
            sessions_table(&SessionList { sessions: vec![] }),
            "no live calls\n"
        );
    }

    #[test]
    fn sizes_times_and_upload_lines() {
        assert_eq!(size_text(1023), "1023 B");
        assert_eq!(size_text(1536), "1.5 KiB");
        assert_eq!(size_text(18 << 20), "18.0 MiB");
        assert_eq!(time_text(0), "1970-01-01 00:00:00");
        assert_eq!(time_text(951_825_599), "2000-02-29 11:59:59");
        assert!(time_text(u64::MAX).ends_with(" 15:30:07"));
        assert_eq!(
            party_text(&parsed(json!({"kind": "anonymous", "value": null}))),
            "anonymous"
        );
        assert_eq!(
            party_text(&PartyView {
                kind: "number".into(),
                value: Some("+14155550100".into())
            }),
            "number:+14155550100"
        );
        let version = VersionView {
            version: 4,
            digest: "sha256:ab".into(),
            size_bytes: 2048,
            uploaded_at: 0,
            active: false,
        };
        assert_eq!(
            uploaded("agent_1", &version),
            "agent_1: uploaded version 4 (sha256:ab, 2.0 KiB); activate it with \
             `voicehost agents activate agent_1 4`\n"
        );
    }

    #[test]
    fn the_cli_calls_only_what_openapi_json_describes() {
        let document: Value = serde_json::from_str(include_str!("../openapi.json")).unwrap();
        assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
        for (path, method) in [
            ("/v1/agents", "get"),
            ("/v1/agents/{agent_id}", "get"),
            ("/v1/agents/{agent_id}", "delete"),
            ("/v1/agents/{agent_id}/versions", "post"),
            ("/v1/agents/{agent_id}/versions/{version}", "delete"),
            ("/v1/agents/{agent_id}/activate", "post"),
            ("/v1/agents/{agent_id}/rollback", "post"),
            ("/v1/agents/{agent_id}/failure-policy", "put"),
            ("/v1/sessions", "get"),
        ] {
            assert!(
                document["paths"][path][method].is_object(),
                "{method} {path}"
            );
        }
        let codes = &document["components"]["schemas"]["ErrorCode"]["enum"];
        assert_eq!(codes.as_array().unwrap().len(), 10);
        assert_eq!(
            document["components"]["parameters"]["AgentId"]["schema"]["$ref"],
            "#/components/schemas/AgentId"
        );
    }

    /// A one-shot HTTP server on loopback: answers one request with `answer` and hands back the request.
    async fn one_answer(answer: String) -> (Client, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            loop {
                let read = socket.read(&mut buffer).await.unwrap();
                request.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&request).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length: "))
                        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
                assert!(read > 0, "the client closed early");
            }
            socket.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&request).to_string()
        });
        (client(&format!("http://{address}")), server)
    }

    fn client(admin: &str) -> Client {
        Client {
            admin: AdminUrl::parse(admin).unwrap(),
            token: "vh_test".into(),
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn list_sends_the_token_and_renders_the_answer() {
        let (client, server) = one_answer(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"agents\":[]}"
                .into(),
        )
        .await;
        let output = execute(&client, AgentsCommand::List, false).await.unwrap();
        assert!(output.starts_with("no agents yet"), "{output}");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /v1/agents HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("authorization: Bearer vh_test\r\n"),
            "{request}"
        );
        assert!(
            request.contains(&format!("host: {}\r\n", client.admin.authority)),
            "{request}"
        );
    }

    #[tokio::test]
    async fn upload_posts_the_component_and_an_api_error_reads_well() {
        let body = r#"{"error":{"code":"core_module","message":"a core module, not a component"}}"#;
        let (client, server) = one_answer(format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
        .await;
        let file = std::env::temp_dir().join(format!("voicehost-cli-{}.wasm", std::process::id()));
        std::fs::write(&file, b"\0asm\x01\0\0\0").unwrap();
        let command = AgentsCommand::Upload {
            agent: "agent_1".into(),
            file: file.clone(),
            activate: true,
        };
        let error = execute(&client, command, false).await.unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            format!("{error:#}"),
            "a core module, not a component (core_module, HTTP 400)"
        );
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /v1/agents/agent_1/versions?activate=true HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/wasm\r\n"),
            "{request}"
        );
        assert!(request.ends_with("\r\n\r\n\0asm\x01\0\0\0"), "{request:?}");
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

    #[tokio::test]
    async fn a_malformed_answer_fails_the_command_but_json_prints_it() {
        let body = r#"{"sessions":[{"session_id":"vs_1","media":"video"}]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (client, server) = one_answer(answer.clone()).await;
        let error = execute(&client, AgentsCommand::Sessions, false)
            .await
            .unwrap_err()
            .to_string();
        server.await.unwrap();
        let url = client.admin.url("/v1/sessions");
        assert!(
            error.starts_with(&format!(
                "{url} answered with JSON this voicehost does not understand: "
            )),
            "{error}"
        );

        let (client, server) = one_answer(answer).await;
        let output = execute(&client, AgentsCommand::Sessions, true)
            .await
            .unwrap();
        server.await.unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&output).unwrap(),
            serde_json::from_str::<Value>(body).unwrap()
        );
    }

    #[tokio::test]
    async fn delete_of_a_version_and_its_204() {
        let (client, server) = one_answer("HTTP/1.1 204 No Content\r\n\r\n".into()).await;
        let command = AgentsCommand::Delete {
            agent: "agent_1".into(),
            version: Some(2),
        };
        let output = execute(&client, command, false).await.unwrap();
        assert_eq!(output, "agent_1: deleted version 2\n");
        let request = server.await.unwrap();
        assert!(request.starts_with("DELETE /v1/agents/agent_1/versions/2 HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url_and_a_silent_host_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let error = execute(
            &client(&format!("http://{address}")),
            AgentsCommand::Sessions,
            false,
        )
        .await
        .unwrap_err();
        let error = format!("{error:#}");
        assert!(
            error.contains(&format!("http://{address}/v1/sessions")),
            "{error}"
        );
        assert!(!error.contains("vh_test"), "{error}");

        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = client(&format!("http://{}", silent.local_addr().unwrap()));
        client.timeout = Duration::from_millis(300);
        let error = execute(&client, AgentsCommand::List, false)
            .await
            .unwrap_err();
        assert!(
            error.to_string().starts_with("no answer from http://"),
            "{error}"
        );
    }
}
