//! Outbound HTTP for agents: `wasi:http/outgoing-handler`, allowed only to the origins of a tenant's
//! allowlist ([`HttpPolicy`]).
//!
//! Every request a guest makes goes through [`PolicyHooks::send_request`] (wasmtime-wasi-http's
//! `WasiHttpHooks`). Its scheme, host and port must equal one allowed [`Origin`]; otherwise it fails with
//! `error-code::HTTP-request-denied`, which the guest reads like any other `wasi:http` error, and the host
//! logs a warning with the scheme, host and port only (never the path, query or headers: they may hold the
//! tenant's secrets).
//!
//! An allowed request runs under [`HttpPolicy::timeout`]: as the connect, first-byte and between-bytes
//! timeouts (the smaller of the guest's own `request-options` and the policy), and as the bound of the whole
//! exchange, body included. The response body is read by the host, up to
//! [`HttpPolicy::max_response_bytes`], before the guest gets the response: a `Content-Length` over the cap
//! fails at once and a body that passes it fails as soon as it does, both with
//! `error-code::HTTP-response-body-size`. Reading the body first is what lets the guest see these errors
//! (and the timeouts) as error codes: wasmtime-wasi-http 48 turns an error in a streamed response body into
//! a `wasi:io` stream error that `http-error-code` does not recognise. The price is that the guest gets no
//! byte before the last one, and the host holds up to `max_response_bytes` per open response; a call has at
//! most [`MAX_OPEN_REQUESTS`] requests and unread responses at once.

use super::cpu::{charged, Share};
use super::egress::{self, Reach};
use super::limits::{self, HTTP_BODY_CHUNK_BYTES};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::http::{self, HeaderMap, Method, StatusCode};
use rustls::pki_types::ServerName;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks, WasiHttpView};

/// Requests in flight plus responses the guest has not finished reading, per instance. One more fails
/// with `error-code::connection-limit-reached`.
pub const MAX_OPEN_REQUESTS: usize = 16;

/// The longest authority (`host:port`) an outgoing request may be given; longer is refused to the guest.
/// wasmtime-wasi-http checks only its syntax, and keeps it on the host.
pub const MAX_AUTHORITY_BYTES: usize = 512;

/// The longest method an outgoing request may be given (an extension method is any token).
pub const MAX_METHOD_BYTES: usize = 32;

/// The version of `wasi:http` that wasmtime-wasi-http 48 links (its WIT's package); a guest's import of
/// any `0.2.x` resolves to it.
const WASI_HTTP_TYPES: &str = "wasi:http/types@0.2.12";

/// Re-defines `set-authority` and `set-method` of `wasi:http/types` in `linker` (which has it) so that a
/// value over [`MAX_AUTHORITY_BYTES`] or [`MAX_METHOD_BYTES`] is refused before the library keeps it.
pub(super) fn cap_request_strings<T: WasiHttpView + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    use wasmtime_wasi_http::p2::bindings::http::types::{
        HostOutgoingRequest as _, Method, OutgoingRequest,
    };
    linker.allow_shadowing(true);
    let mut types = linker.instance(WASI_HTTP_TYPES)?;
    types.func_wrap(
        "[method]outgoing-request.set-authority",
        |mut store: StoreContextMut<'_, T>,
         (request, authority): (Resource<OutgoingRequest>, Option<String>)| {
            if authority
                .as_ref()
                .is_some_and(|a| a.len() > MAX_AUTHORITY_BYTES)
            {
                return Ok((Err(()),));
            }
            Ok((store.data_mut().http().set_authority(request, authority)?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-method",
        |mut store: StoreContextMut<'_, T>,
         (request, method): (Resource<OutgoingRequest>, Method)| {
            if matches!(&method, Method::Other(other) if other.len() > MAX_METHOD_BYTES) {
                return Ok((Err(()),));
            }
            Ok((store.data_mut().http().set_method(request, method)?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Where an agent may send HTTP requests, and how long and how large they may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPolicy {
    /// The origins requests may go to; a request must match one exactly (scheme, host and port).
    pub allow: Vec<Origin>,
    /// Origins of `allow` whose names may resolve to loopback, private, link-local or other non-public
    /// addresses ([`egress`]); any other name must resolve to a public one. An origin written as an IP
    /// literal names its address and needs no entry here.
    pub allow_private: Vec<Origin>,
    /// The connect, first-byte and between-bytes timeout, and the bound of one whole request.
    pub timeout: Duration,
    /// The largest response body the guest may receive, in bytes.
    pub max_response_bytes: u64,
    /// The tenant's places for name lookups, shared by every call under this policy.
    pub lookups: egress::Lookups,
    /// Allowed origins answered by a stand-in on this machine instead: `voicehost test`'s mocked origins.
    /// A request to one connects to the address given, in plain HTTP whatever its scheme; all else (the
    /// timeouts, the cap, the slots, the CPU charged) is as for any request. No config sets these.
    pub stand_ins: Vec<(Origin, SocketAddr)>,
}

/// The longest [`HttpPolicy::timeout`] a config may set: a request waited on longer holds its call's
/// handler (whose own bound is `wall_ms`).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// The largest [`HttpPolicy::max_response_bytes`] a config may set: the host holds a response whole before
/// the guest reads it, once per open response (at most [`super::limits::MAX_HANDLES`] of them).
pub const MAX_RESPONSE_BYTES: u64 = 64 << 20;

impl Default for HttpPolicy {
    /// Nothing allowed; the limits' defaults (10 s and 1 MiB) for when something is.
    fn default() -> Self {
        HttpPolicy {
            allow: Vec::new(),
            allow_private: Vec::new(),
            timeout: limits::HTTP_TIMEOUT,
            max_response_bytes: limits::HTTP_MAX_RESPONSE_BYTES,
            lookups: egress::Lookups::default(),
            stand_ins: Vec::new(),
        }
    }
}

impl HttpPolicy {
    /// The default policy with these origins allowed.
    pub fn allowing(allow: impl IntoIterator<Item = Origin>) -> HttpPolicy {
        HttpPolicy {
            allow: allow.into_iter().collect(),
            ..HttpPolicy::default()
        }
    }

    /// Whether a request to `scheme://host:port` may go out (`host` as in the request, any case).
    pub fn allows(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        let Ok(host) = normalize_host(host) else {
            return false;
        };
        self.allow
            .iter()
            .any(|o| o.scheme == scheme && o.port == port && o.host == host)
    }

    /// The address of the stand-in answering `scheme://host:port`, if one does.
    fn stand_in(&self, scheme: Scheme, host: &str, port: u16) -> Option<SocketAddr> {
        let host = normalize_host(host).ok()?;
        self.stand_ins
            .iter()
            .find(|(o, _)| o.scheme == scheme && o.port == port && o.host == host)
            .map(|(_, address)| *address)
    }

    /// Which addresses a request to an allowed `scheme://host:port` may connect to: any, for an IP
    /// literal or an origin of [`HttpPolicy::allow_private`]; public ones otherwise.
    pub fn reach(&self, scheme: Scheme, host: &str, port: u16) -> Reach {
        let Ok(host) = normalize_host(host) else {
            return Reach::Public;
        };
        let private = self
            .allow_private
            .iter()
            .any(|o| o.scheme == scheme && o.port == port && o.host == host);
        if private || egress::literal(&host).is_some() {
            Reach::Any
        } else {
            Reach::Public
        }
    }
}

/// The scheme of an [`Origin`]: only HTTP and HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http`, port 80 unless one is given.
    Http,
    /// `https`, port 443 unless one is given.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// 80 or 443.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One allowed destination: scheme, host (lowercase; an IPv6 address in brackets) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    scheme: Scheme,
    host: String,
    port: u16,
}

/// Why a text is not an [`Origin`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// No `://`: the text is not `scheme://host[:port]`.
    #[error("{0:?} is not an origin: write scheme://host[:port], like https://api.example.com")]
    NoScheme(String),
    /// A scheme other than `http` and `https`.
    #[error("{0:?} is not an origin: only http and https can be allowed")]
    Scheme(String),
    /// Nothing where the host should be.
    #[error("{0:?} is not an origin: it has no host")]
    NoHost(String),
    /// A user name or password (`user@`) in the authority.
    #[error("{0:?} is not an origin: a user name or password does not belong in it")]
    UserInfo(String),
    /// A path other than `/`, a query or a fragment.
    #[error("{0:?} is not an origin: a path, query or fragment does not belong in it (origins are scheme://host[:port])")]
    Path(String),
    /// A port that is not a number from 1 to 65535.
    #[error("{0:?} is not an origin: the port must be a number from 1 to 65535")]
    Port(String),
    /// A host with characters other than ASCII letters, digits, `-` and `.`, or a bracketed IPv6 address that
    /// does not parse.
    #[error("{0:?} is not an origin: the host may hold only ASCII letters, digits, '-' and '.' (an internationalised name in its xn-- form), or an IP address (an IPv4 address written whole, like 127.0.0.1: a name ending in a number is taken for one)")]
    Host(String),
}

impl Origin {
    /// Parses `scheme://host[:port]`: `https://api.example.com`, `http://127.0.0.1:8089`,
    /// `http://[::1]:8080`. The port defaults to the scheme's; the host is lowercased; a trailing `/` is
    /// accepted, any other path, a query, a fragment or a user name are not.
    pub fn parse(text: &str) -> Result<Origin, OriginError> {
        let input = text.trim();
        let owned = || input.to_string();
        let (scheme, rest) = input
            .split_once("://")
            .ok_or_else(|| OriginError::NoScheme(owned()))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(OriginError::Scheme(owned())),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            return Err(OriginError::UserInfo(owned()));
        }
        if authority.contains(['/', '?', '#']) {
            return Err(OriginError::Path(owned()));
        }
        let (host, port) = if authority.starts_with('[') {
            // An IPv6 address: [addr] or [addr]:port.
            match authority.split_once(']') {
                Some((address, "")) => (format!("{address}]"), None),
                Some((address, after)) => match after.strip_prefix(':') {
                    Some(port) => (format!("{address}]"), Some(port)),
                    None => return Err(OriginError::Host(owned())),
                },
                None => return Err(OriginError::Host(owned())),
            }
        } else {
            match authority.split_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(OriginError::NoHost(owned()));
        }
        let host = normalize_host(&host).map_err(|()| OriginError::Host(owned()))?;
        let port = match port {
            None => scheme.default_port(),
            Some(digits) => match digits.parse::<u16>() {
                Ok(port) if port != 0 && digits.bytes().all(|b| b.is_ascii_digit()) => port,
                _ => return Err(OriginError::Port(owned())),
            },
        };
        Ok(Origin { scheme, host, port })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Lowercase; an IPv6 address in brackets, as in a URL.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port: the one written, or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl FromStr for Origin {
    type Err = OriginError;

    fn from_str(text: &str) -> Result<Origin, OriginError> {
        Origin::parse(text)
    }
}

impl fmt::Display for Origin {
    /// `scheme://host`, with `:port` when it is not the scheme's default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// The host as origins keep it: lowercase ASCII, an IPv6 address in brackets in its canonical form.
fn normalize_host(host: &str) -> Result<String, ()> {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let address: std::net::Ipv6Addr = inner.parse().map_err(|_| ())?;
        return Ok(format!("[{address}]"));
    }
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    // A name whose last label is a number is an IPv4 address to resolvers and URL parsers (`127.1`,
    // `2130706433`, `0x7f.1`, `0177.0.0.1`): only the canonical dotted quad is one here.
    let last = host.rsplit('.').next().unwrap_or_default();
    let numeric = !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || last.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("0x")));
    if numeric && host.parse::<std::net::Ipv4Addr>().is_err() {
        return Err(());
    }
    if valid {
        Ok(host.to_ascii_lowercase())
    } else {
        Err(())
    }
}

/// The `wasi:http` hooks of one instance: the policy's decision on each request, its timeouts and its cap.
pub struct PolicyHooks {
    policy: Arc<HttpPolicy>,
    open: Arc<AtomicUsize>,
    refusals: Arc<Refusals>,
    /// The call's guest CPU, which the host's work for its requests (the lookup's answer, TLS, HTTP,
    /// reading the body) is charged to, as the guest's own code is: wasmtime-wasi-http polls a request in
    /// a task of its own, outside the guest's polls.
    cpu: Option<Share>,
}

/// The log of an instance's refused requests: the first at warn, the rest at debug, so that a guest
/// looping over refused requests cannot flood the host's log.
struct Refusals {
    /// The call whose instance makes the requests.
    session: String,
    warned: std::sync::atomic::AtomicBool,
}

impl Refusals {
    /// Logs a refused request to `host:port` (never its path, query or headers), and why.
    fn log(&self, host: &str, port: u16, why: &str) {
        let host = super::guest_log::clip(host);
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                session = self.session,
                host,
                port,
                "an agent's HTTP request was refused: {why}"
            );
        } else {
            tracing::warn!(
                session = self.session,
                host,
                port,
                "an agent's HTTP request was refused: {why} (the call's further refusals are logged at debug)"
            );
        }
    }
}

impl PolicyHooks {
    /// The hooks of one instance under `policy`, with no request open; `session` names its call in the log.
    pub fn new(policy: Arc<HttpPolicy>, session: impl Into<String>) -> PolicyHooks {
        PolicyHooks {
            policy,
            open: Arc::new(AtomicUsize::new(0)),
            refusals: Arc::new(Refusals {
                session: session.into(),
                warned: Default::default(),
            }),
            cpu: None,
        }
    }

    /// The host's work for the requests is charged to `cpu`, the call's guest CPU.
    pub(super) fn charged_to(mut self, cpu: Share) -> PolicyHooks {
        self.cpu = Some(cpu);
        self
    }

    /// Where `request` goes, if it may go out: its scheme, host and port must be an allowed origin.
    fn check(&self, request: &http::Request<WasiBody>) -> Result<Target, Error> {
        let uri = request.uri();
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            _ => return Err(Error::HttpRequestDenied),
        };
        let Some(authority) = uri.authority() else {
            return Err(Error::HttpRequestUriInvalid);
        };
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(scheme.default_port());
        // A user name in the authority is never allowed: the host is checked and connected to as one
        // string, with nothing for two parsers to read differently.
        if authority.as_str().contains('@') || !self.policy.allows(scheme, host, port) {
            self.refusals
                .log(host, port, "its origin is not on the allowlist");
            return Err(Error::HttpRequestDenied);
        }
        let stand_in = self.policy.stand_in(scheme, host, port);
        Ok(Target {
            tls: scheme == Scheme::Https && stand_in.is_none(),
            host: host.to_string(),
            port,
            reach: self.policy.reach(scheme, host, port),
            stand_in,
        })
    }
}

/// Where an allowed request connects.
struct Target {
    tls: bool,
    /// As in the request's URI (an IPv6 literal in brackets).
    host: String,
    port: u16,
    reach: Reach,
    /// Where the request goes instead, in plain HTTP ([`HttpPolicy::stand_ins`]).
    stand_in: Option<SocketAddr>,
}

/// A place among [`MAX_OPEN_REQUESTS`], given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_OPEN_REQUESTS).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A future that only reports whether something failed: the I/O of a response's connection after its
/// head arrived (and, in `send_request`, the unused report of response processing errors).
type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send>;

impl WasiHttpHooks for PolicyHooks {
    // An unsent body holds its chunks on the host: small ones, one buffered (see `limits::MAX_HANDLES`).
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        HTTP_BODY_CHUNK_BYTES
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        let target = match self.check(&request) {
            Ok(target) => target,
            Err(error) => return Box::new(async move { Err(error) }),
        };
        let Some(slot) = Slot::take(&self.open) else {
            let why = format!("it has {MAX_OPEN_REQUESTS} requests open, as many as it may");
            self.refusals.log(&target.host, target.port, &why);
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        };
        let policy = self.policy.clone();
        let refusals = self.refusals.clone();
        let cpu = self.cpu.clone();
        let sending = send(
            request,
            options,
            policy,
            target,
            refusals,
            slot,
            cpu.clone(),
        );
        match cpu {
            Some(cpu) => Box::new(charged(cpu, sending)),
            None => Box::new(sending),
        }
    }
}

async fn send(
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    policy: Arc<HttpPolicy>,
    target: Target,
    refusals: Arc<Refusals>,
    slot: Slot,
    cpu: Option<Share>,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let guest = options.unwrap_or_default();
    // One deadline for the lookup, the connection, TLS and HTTP's handshake together.
    let connected_by = tokio::time::Instant::now() + bounded(guest.connect_timeout, policy.timeout);
    let first_byte = bounded(guest.first_byte_timeout, policy.timeout);
    let between_bytes = bounded(guest.between_bytes_timeout, policy.timeout);
    let cap = policy.max_response_bytes;
    let head = request.method() == Method::HEAD;
    let (whole, lookups) = (policy.timeout, policy.lookups.clone());
    let exchange = async move {
        let refused = || {
            let why = "its host resolves only to non-public addresses (allow them with \
                       [tenants.http] allow_private)";
            refusals.log(&target.host, target.port, why);
        };
        let stream = match target.stand_in {
            Some(address) => {
                tokio::time::timeout_at(connected_by, tokio::net::TcpStream::connect(address))
                    .await
                    .map_err(|_| Error::ConnectionTimeout)?
                    .map_err(Error::Connect)?
            }
            None => {
                egress::connect(
                    &target.host,
                    target.port,
                    target.reach,
                    &lookups,
                    connected_by,
                    refused,
                )
                .await?
            }
        };
        let (response, io) =
            exchange(request, stream, &target, connected_by, first_byte, cpu).await?;
        let bodiless = head
            || response.status().is_informational()
            || response.status() == StatusCode::NO_CONTENT
            || response.status() == StatusCode::NOT_MODIFIED;
        if !bodiless {
            if let Some(length) = content_length(response.headers()) {
                if length > cap {
                    return Err(Error::HttpResponseBodySize(Some(length)));
                }
            }
        }
        let (parts, body) = response.into_parts();
        let (data, trailers) = read_body(body, cap, between_bytes).await?;
        let body = Buffered {
            data: Some(data),
            trailers,
            _slot: slot,
        };
        Ok((http::Response::from_parts(parts, body.boxed_unsync()), io))
    };
    match tokio::time::timeout(whole, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::HttpResponseTimeout),
    }
}

/// The smaller of the guest's timeout, if any, and the policy's.
fn bounded(guest: Option<Duration>, policy: Duration) -> Duration {
    guest.map_or(policy, |guest| guest.min(policy))
}

/// Sends `request` over `stream` (in TLS for `https`, verified against the web's root certificates) and
/// waits for the response's head. The connection's I/O goes on in a task of its own, which the returned
/// future reports on; it ends with the connection and is aborted if the guest drops the response first.
async fn exchange(
    mut request: http::Request<WasiBody>,
    stream: tokio::net::TcpStream,
    target: &Target,
    connected_by: tokio::time::Instant,
    first_byte: Duration,
    cpu: Option<Share>,
) -> Result<(http::Response<hyper::body::Incoming>, IoFuture), Error> {
    let stream: Box<dyn Stream> = if target.tls {
        let name = match egress::literal(&target.host) {
            Some(ip) => ServerName::from(ip),
            None => {
                ServerName::try_from(target.host.clone()).map_err(Error::InvalidDnsNameError)?
            }
        };
        let tls = tokio::time::timeout_at(connected_by, tls_connector().connect(name, stream))
            .await
            .map_err(|_| Error::ConnectionTimeout)?
            .map_err(Error::Tls)?;
        Box::new(tls)
    } else {
        Box::new(stream)
    };
    let (mut sender, connection) = tokio::time::timeout_at(
        connected_by,
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    let connection = async move { connection.await.map_err(Error::from) };
    let io = match cpu {
        Some(cpu) => wasmtime_wasi::runtime::spawn(charged(cpu, connection)),
        None => wasmtime_wasi::runtime::spawn(connection),
    };
    // The request line carries the path only: the scheme and authority went into the connection (and
    // the `Host` header, which wasmtime-wasi-http sets).
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    *request.uri_mut() = path;
    let response = tokio::time::timeout(first_byte, sender.send_request(request))
        .await
        .map_err(|_| Error::ConnectionReadTimeout)??;
    Ok((response, Box::new(io)))
}

/// What a request is sent over: a TCP stream, or TLS over one.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The TLS client of every `https` request: the web's root certificates (webpki-roots).
fn tls_connector() -> &'static tokio_rustls::TlsConnector {
    static CONNECTOR: LazyLock<tokio_rustls::TlsConnector> = LazyLock::new(|| {
        crate::tls::client(None).expect("the web's root certificates need no file")
    });
    &CONNECTOR
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The whole body and its trailers; past `cap` bytes, `HttpResponseBodySize`; no frame for `between`,
/// `ConnectionReadTimeout`.
async fn read_body(
    mut body: hyper::body::Incoming,
    cap: u64,
    between: Duration,
) -> Result<(Bytes, Option<HeaderMap>), Error> {
    let mut data = Vec::new();
    let mut trailers = None;
    loop {
        let frame = match tokio::time::timeout(between, body.frame()).await {
            Err(_) => return Err(Error::ConnectionReadTimeout),
            Ok(None) => break,
            Ok(Some(frame)) => frame?,
        };
        match frame.into_data() {
            Ok(chunk) => {
                let total = data.len() as u64 + chunk.len() as u64;
                if total > cap {
                    return Err(Error::HttpResponseBodySize(Some(total)));
                }
                data.extend_from_slice(&chunk);
            }
            Err(frame) => {
                if let Ok(map) = frame.into_trailers() {
                    trailers = Some(map);
                }
            }
        }
    }
    Ok((Bytes::from(data), trailers))
}

/// A response body the host has read whole: the data, then the trailers. It holds its request's
/// [`Slot`] until the guest has read it or dropped it.
struct Buffered {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    _slot: Slot,
}

impl Body for Buffered {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if let Some(data) = self.data.take().filter(|data| !data.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|map| Ok(Frame::trailers(map))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.as_ref().is_none_or(Bytes::is_empty) && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_hosts_work_for_a_guests_request_is_charged_to_its_calls_cpu() {
        // A server answering one request with 256 KiB, written in small pieces.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head).await;
            let body = 256 << 10;
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {body}\r\n\r\n");
            socket.write_all(answer.as_bytes()).await.unwrap();
            for _ in 0..body / 512 {
                socket.write_all(&[b'x'; 512]).await.unwrap();
            }
        });
        let policy = HttpPolicy {
            allow: vec![origin(&format!("http://127.0.0.1:{port}"))],
            ..HttpPolicy::default()
        };
        let cpu = Share::default();
        let mut hooks = PolicyHooks::new(Arc::new(policy), "s").charged_to(cpu.clone());
        let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .unwrap();
        let sending = hooks.send_request(request, None, Box::new(async { Ok(()) }));
        let (response, _io) = Box::into_pin(sending).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            cpu.used() > 0,
            "connecting and reading 256 KiB cost the call's CPU nothing"
        );
    }

    fn origin(text: &str) -> Origin {
        Origin::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn origins_parse_with_the_default_port_of_their_scheme_and_a_lowercase_host() {
        let o = origin("https://API.Example.com");
        assert_eq!(
            (o.scheme(), o.host(), o.port()),
            (Scheme::Https, "api.example.com", 443)
        );
        let o = origin("http://127.0.0.1:8089");
        assert_eq!(
            (o.scheme(), o.host(), o.port()),
            (Scheme::Http, "127.0.0.1", 8089)
        );
        assert_eq!(origin("http://example.com").port(), 80);
        assert_eq!(origin("HTTPS://example.com:8443/").port(), 8443);
        assert_eq!(origin("  https://example.com  ").host(), "example.com");
        let o = origin("http://[0:0::1]:8080");
        assert_eq!((o.host(), o.port()), ("[::1]", 8080));
        assert_eq!(origin("https://[::1]").port(), 443);
        assert_eq!(
            origin("https://xn--bcher-kva.example").host(),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn origins_display_as_scheme_host_and_a_port_only_when_it_is_not_the_default() {
        assert_eq!(
            origin("https://API.example.com:443").to_string(),
            "https://api.example.com"
        );
        assert_eq!(
            origin("http://127.0.0.1:8089/").to_string(),
            "http://127.0.0.1:8089"
        );
        assert_eq!(origin("http://[::1]:80").to_string(), "http://[::1]");
        assert_eq!(
            "https://a.example:444"
                .parse::<Origin>()
                .unwrap()
                .to_string(),
            "https://a.example:444"
        );
    }

    #[test]
    fn texts_that_are_not_origins_are_refused_with_the_reason() {
        type Case = (&'static str, fn(String) -> OriginError);
        let cases: &[Case] = &[
            ("api.example.com", OriginError::NoScheme),
            ("", OriginError::NoScheme),
            ("ftp://example.com", OriginError::Scheme),
            ("ws://example.com", OriginError::Scheme),
            ("https://", OriginError::NoHost),
            ("https://:443", OriginError::NoHost),
            ("https://user:secret@example.com", OriginError::UserInfo),
            ("https://example.com/v1", OriginError::Path),
            ("https://example.com//", OriginError::Path),
            ("https://example.com?key=secret", OriginError::Path),
            ("https://example.com#top", OriginError::Path),
            ("https://example.com:", OriginError::Port),
            ("https://example.com:0", OriginError::Port),
            ("https://example.com:65536", OriginError::Port),
            ("https://example.com:+80", OriginError::Port),
            ("https://example.com:http", OriginError::Port),
            ("https://exa_mple.com", OriginError::Host),
            ("http://2130706433", OriginError::Host),
            ("http://127.1", OriginError::Host),
            ("http://0x7f.1", OriginError::Host),
            ("http://0177.0.0.1", OriginError::Host),
            ("http://example.123", OriginError::Host),
            ("https://bücher.example", OriginError::Host),
            ("https://exa%6dple.com", OriginError::Host),
            ("http://[::1", OriginError::Host),
            ("http://[not-ipv6]", OriginError::Host),
            ("http://[::1]x", OriginError::Host),
        ];
        for (text, expected) in cases {
            assert_eq!(
                Origin::parse(text),
                Err(expected(text.trim().to_string())),
                "{text:?}"
            );
        }
        let message = Origin::parse("https://example.com/v1")
            .unwrap_err()
            .to_string();
        assert!(message.contains("path"), "{message}");
    }

    #[test]
    fn a_policy_allows_exactly_its_origins() {
        let policy = HttpPolicy::allowing([
            origin("https://api.example.com"),
            origin("http://[::1]:8080"),
        ]);
        assert!(policy.allows(Scheme::Https, "api.example.com", 443));
        assert!(policy.allows(Scheme::Https, "API.example.COM", 443));
        assert!(policy.allows(Scheme::Http, "[0::1]", 8080));
        assert!(!policy.allows(Scheme::Http, "api.example.com", 443));
        assert!(!policy.allows(Scheme::Https, "api.example.com", 8443));
        assert!(!policy.allows(Scheme::Https, "evil.api.example.com", 443));
        assert!(!policy.allows(Scheme::Https, "api.example.com.", 443));
        assert!(!HttpPolicy::default().allows(Scheme::Https, "api.example.com", 443));
        assert_eq!(HttpPolicy::default().timeout, Duration::from_secs(10));
        assert_eq!(HttpPolicy::default().max_response_bytes, 1 << 20);
    }

    #[test]
    fn the_open_requests_of_an_instance_are_bounded() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<Slot> = (0..MAX_OPEN_REQUESTS)
            .map(|_| Slot::take(&open).expect("a slot"))
            .collect();
        assert!(Slot::take(&open).is_none());
        drop(slots);
        assert_eq!(open.load(Ordering::Acquire), 0);
        assert!(Slot::take(&open).is_some());
    }
}
