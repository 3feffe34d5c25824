//! One WebSocket to Sent: the handshake and its refusals, `connection.ready`, a bounded reader and a
//! writer (`protocol.md` §2). Whether the connection is dead (Sent silent, or taking nothing) is the core's
//! rule: the reader and the writer record what they did in the [`Outbox`], and the agent reports it.
//!
//! [`run`] is the connection's task: it dials (with `TCP_NODELAY`), waits for `connection.ready`, then
//! reads until the connection ends. Everything it has to say it hands to its agent's [`EventSink`] itself,
//! tagged with the connection's id, in order: [`Event::Opened`] (or [`Event::DialFailed`]) first, then
//! Sent's frames, pings and audio, and exactly one [`Event::Closed`] last, however the task ends. The sink
//! handles each at once (the agent's router, under its lock), so a frame costs no hop to another task and
//! the reader reads on only once its last message is handled. What the agent writes goes through the
//! connection's [`Outbox`], which the writer task drains, pongs first.
//!
//! Neither the API key nor the contents of a frame (which may hold a resume token) is ever logged.

mod outbox;

pub use outbox::Outbox;

use crate::stats::Stats;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt as _, SinkExt, StreamExt};
use sentdm_voice_agents::frames::ConnectionReady;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, UrlError};
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Bytes, Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::{debug, info, warn, Instrument as _};
use voicehost_proto::call::ConnId;
use voicehost_proto::wire::{self, Frame, FromSent, MAX_MESSAGE_BYTES, SUBPROTOCOL};

/// How long the upgrade may take, and again how long `connection.ready` may take after it (the SDK's 10 s).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection's read buffer: a dozen voice frames per read (see [`websocket_config`]).
pub const READ_BUFFER_BYTES: usize = 8 << 10;

/// How long a closing connection waits for Sent's side of the close handshake (or for the writer to finish).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Messages Sent may send before `connection.ready` that are kept for after it (frames; pings are
/// answered at once): more, and the connection is not one to keep.
pub const MAX_EARLY: usize = 64;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The account API key. Its `Debug` and `Display` never show it; only [`ApiKey::expose`] does.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps the account's API key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for the `Authorization` header. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> ApiKey {
        ApiKey(key)
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> ApiKey {
        ApiKey(key.to_string())
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("…")
    }
}

/// Sent's endpoint for agents: where `run` and `serve` connect unless told otherwise.
pub const SENT_URL: &str = "wss://voice.sent.dm/v1/agents/connect";

/// Where and as whom to connect. Its `Debug` does not show the key.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The connect endpoint, e.g. `wss://voice.sent.dm/v1/agents/connect`; `agent_id` is appended.
    pub url: String,
    /// The agent to serve, as Sent knows it (`agent_…`): the connect URL's `agent_id`.
    pub agent_id: String,
    /// The account's API key, sent as `Authorization: Bearer`.
    pub api_key: ApiKey,
    /// How long the upgrade may take, and again how long `connection.ready` may take after it.
    pub handshake_timeout: Duration,
}

impl Dial {
    /// A dial with the protocol's [`HANDSHAKE_TIMEOUT`].
    pub fn new(
        url: impl Into<String>,
        agent_id: impl Into<String>,
        api_key: impl Into<ApiKey>,
    ) -> Dial {
        Dial {
            url: url.into(),
            agent_id: agent_id.into(),
            api_key: api_key.into(),
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }

    /// Whether `url` can be dialled: it parses as a request URL and its scheme is `ws` or `wss`. The config
    /// checks the Sent URL with this at start; every handshake builds its request with it.
    pub fn check_url(url: &str) -> Result<(), ConnectError> {
        client_request(url).map(drop)
    }

    /// The URL with `agent_id` appended (`?` or `&`).
    pub fn connect_url(&self) -> String {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        format!(
            "{}{separator}agent_id={}",
            self.url,
            percent_encode(&self.agent_id)
        )
    }
}

/// Why a connection could not be opened.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// 400/401/403/404: needs a person, never retried.
    #[error("Sent refused the connection ({status}): {reason}")]
    Refused {
        /// The HTTP status Sent answered the upgrade with.
        status: u16,
        /// What that status means ([`refusal_reason`]).
        reason: &'static str,
    },
    /// The dial itself is wrong (a URL that does not parse, an unsupported scheme, a key that cannot be a
    /// header value): needs a person, never retried.
    #[error("cannot dial: {0}")]
    Invalid(String),
    /// Anything else (a network error, another status, a timeout, no `connection.ready` in time): retry with
    /// backoff.
    #[error("could not connect: {0}")]
    Transient(String),
}

impl ConnectError {
    /// Whether retrying cannot help: the error needs a person.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ConnectError::Transient(_))
    }
}

/// Why Sent refuses a handshake with each status that needs a person (`protocol.md` §2.2).
/// [scenario: refused_agent_stops]
pub fn refusal_reason(status: u16) -> Option<&'static str> {
    match status {
        400 => Some("agent_id or the subprotocol is missing"),
        401 => Some("the API key is not valid"),
        403 => Some("voice is not enabled for the account, or the key does not own the agent"),
        404 => Some("the agent does not exist"),
        _ => None,
    }
}

/// What a connection tells its agent, in this order: `Opened` or `DialFailed`; then Sent's frames, pings
/// and audio; then `Closed`, exactly once (never after `DialFailed`).
#[derive(Debug)]
pub enum Event {
    /// The connection is ready: Sent's `connection.ready`, and the queue the agent writes through.
    Opened {
        /// Sent's `connection.ready`: the heartbeat interval, the connection's `max_sessions`.
        ready: ConnectionReady,
        /// Where the agent queues what this connection's writer sends.
        outbox: Arc<Outbox>,
    },
    /// The connection could not be opened, and why; no `Closed` follows.
    DialFailed(ConnectError),
    /// Every valid frame of Sent's but `ping`. Boxed, so the events of the audio path stay small.
    Frame(Box<Frame>),
    /// A `ping` with its `ts`: the pong is the agent's to queue, once it has handled every event before.
    Ping(i64),
    /// A binary audio message: its stream number and samples.
    Audio {
        /// The stream number Sent gave the call on this connection.
        stream: u16,
        /// 16-bit little-endian samples, the header stripped (a trailing odd byte dropped).
        samples: Bytes,
    },
    /// The connection has ended: the last event it sends.
    Closed {
        /// Why, for the log, e.g. `closed by Sent with 1001`.
        why: String,
    },
}

/// Where a connection's events go: its agent, which handles each at once, in the connection's task.
pub trait EventSink: Send + Sync + 'static {
    /// Handles `event` of connection `id`; `false` when nobody listens any more (the connection then
    /// closes with 1001, its calls resumable elsewhere).
    fn handle(&self, id: ConnId, event: Event) -> bool;
}

/// The sink of one agent's connections.
pub type Events = Arc<dyn EventSink>;

/// A connection's task: dials after `delay`, waits for `connection.ready`, tells the agent, then reads
/// until the connection ends. [`Event::Closed`] is sent last whether the reading returns or panics.
pub async fn run(id: ConnId, dial: Dial, delay: Duration, events: Events, stats: Arc<Stats>) {
    let span = tracing::info_span!("connection", conn = id);
    async move {
        tokio::time::sleep(delay).await;
        let opened = open(&dial).await;
        let (socket, ready, early) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                match &error {
                    ConnectError::Transient(_) => warn!(%error, "could not connect"),
                    _ => tracing::error!(%error, "could not connect"),
                }
                events.handle(id, Event::DialFailed(error));
                return;
            }
        };
        info!(
            protocol_version = %ready.protocol_version,
            heartbeat_interval_ms = ready.heartbeat_interval_ms,
            max_sessions = ready.max_sessions,
            "ready"
        );
        let outbox = Arc::new(Outbox::default());
        // [scenario: starts_behind_ready_not_dropped] `Opened` is handled before the reader reads anything
        // more: a frame written right behind `connection.ready` arrives after it.
        let opened = Event::Opened {
            ready,
            outbox: outbox.clone(),
        };
        if !events.handle(id, opened) {
            return;
        }
        let (sink, source) = socket.split();
        let (done_tx, done) = oneshot::channel();
        let writer =
            tokio::spawn(write(sink, outbox.clone(), done_tx).instrument(tracing::Span::current()));
        let mut reader = Reader {
            id,
            source,
            outbox,
            events: events.clone(),
            done,
            writer,
            stats,
        };
        let why = AssertUnwindSafe(reader.run(early))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| "the connection's reader panicked".into());
        info!(why = %why, "closed");
        events.handle(id, Event::Closed { why });
    }
    .instrument(span)
    .await
}

/// Dials and waits for `connection.ready` (each step within `dial.handshake_timeout`).
pub async fn open(dial: &Dial) -> Result<(Socket, ConnectionReady, Vec<Event>), ConnectError> {
    let mut socket = handshake(dial).await?;
    let (ready, early) = await_ready(&mut socket, dial.handshake_timeout).await?;
    Ok((socket, ready, early))
}

/// The WebSocket limits (scenario `oversized_message_closes_the_connection`): no message or frame past
/// [`MAX_MESSAGE_BYTES`], and a bounded write buffer. The read buffer is sized for voice frames: tungstenite
/// zero-fills the free part of it before every read, which at its default 128 KiB cost more than the rest
/// of reading an audio frame (a 20 ms frame at 16 kHz is 646 bytes on the wire; a larger message still
/// arrives, in more reads).
pub fn websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
        .write_buffer_size(128 << 10)
        .max_write_buffer_size(4 << 20)
}

// ----- the handshake -----

/// The upgrade request for `url`, if it parses and its scheme is `ws` or `wss`.
fn client_request(url: &str) -> Result<Request, ConnectError> {
    let request = url
        .into_client_request()
        .map_err(|e| ConnectError::Invalid(format!("the URL does not work: {e}")))?;
    if !matches!(request.uri().scheme_str(), Some("ws" | "wss")) {
        return Err(ConnectError::Invalid(
            "the URL's scheme must be ws or wss".into(),
        ));
    }
    Ok(request)
}

async fn handshake(dial: &Dial) -> Result<Socket, ConnectError> {
    let mut request = client_request(&dial.connect_url())?;
    let mut authorization = HeaderValue::from_str(&format!("Bearer {}", dial.api_key.expose()))
        .map_err(|_| ConnectError::Invalid("the API key cannot be a header value".into()))?;
    authorization.set_sensitive(true);
    let headers = request.headers_mut();
    headers.insert(AUTHORIZATION, authorization);
    headers.insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    // `true`: TCP_NODELAY, so a frame never waits for the peer's ACK of the one before.
    let connecting =
        tokio_tungstenite::connect_async_with_config(request, Some(websocket_config()), true);
    match tokio::time::timeout(dial.handshake_timeout, connecting).await {
        Err(_) => Err(ConnectError::Transient(format!(
            "the handshake took longer than {:?}",
            dial.handshake_timeout
        ))),
        Ok(Ok((socket, _))) => Ok(socket),
        Ok(Err(WsError::Http(response))) => {
            let status = response.status().as_u16();
            Err(match refusal_reason(status) {
                Some(reason) => ConnectError::Refused { status, reason },
                None => ConnectError::Transient(format!("Sent answered the upgrade with {status}")),
            })
        }
        Ok(Err(WsError::Url(UrlError::UnableToConnect(e)))) => Err(ConnectError::Transient(e)),
        Ok(Err(WsError::Url(e))) => {
            Err(ConnectError::Invalid(format!("the URL does not work: {e}")))
        }
        Ok(Err(e)) => Err(ConnectError::Transient(e.to_string())),
    }
}

/// Reads until `connection.ready`, answering pings; returns it with whatever else came first.
async fn await_ready(
    socket: &mut Socket,
    within: Duration,
) -> Result<(ConnectionReady, Vec<Event>), ConnectError> {
    let deadline = Instant::now() + within;
    let mut early = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline, socket.next())
            .await
            .map_err(|_| {
                ConnectError::Transient(format!("no connection.ready within {within:?}"))
            })?;
        let message = match next {
            None => {
                return Err(ConnectError::Transient(
                    "the socket ended before connection.ready".into(),
                ))
            }
            Some(Err(e)) => {
                return Err(ConnectError::Transient(format!(
                    "lost before connection.ready: {e}"
                )))
            }
            Some(Ok(message)) => message,
        };
        match read(message, None) {
            Read::Event(Event::Frame(frame)) => match *frame {
                Frame::ConnectionReady(ready) => return Ok((ready, early)),
                _ if early.len() >= MAX_EARLY => {
                    return Err(ConnectError::Transient(format!(
                        "more than {MAX_EARLY} frames before connection.ready"
                    )))
                }
                frame => early.push(Event::Frame(Box::new(frame))),
            },
            Read::Event(Event::Ping(ts)) => {
                let pong = wire::pong(ts);
                socket.send(Message::Text(pong.into())).await.map_err(|e| {
                    ConnectError::Transient(format!("lost before connection.ready: {e}"))
                })?;
            }
            Read::Event(_) if early.len() >= MAX_EARLY => {
                return Err(ConnectError::Transient(format!(
                    "more than {MAX_EARLY} messages before connection.ready"
                )))
            }
            Read::Event(event) => early.push(event),
            Read::Closed(code) => {
                return Err(ConnectError::Transient(format!(
                    "Sent closed the socket with {code} before connection.ready"
                )))
            }
            Read::Nothing => {}
        }
    }
}

// ----- reading -----

enum Read {
    Event(Event),
    Closed(u16),
    Nothing,
}

/// One message from Sent, through the intake; what it drops is logged (never its contents) and counted.
fn read(message: Message, stats: Option<&Stats>) -> Read {
    let invalid = |error: wire::Invalid, bytes: usize| {
        warn!(bytes, %error, "dropped a message from Sent");
        if let Some(stats) = stats {
            stats.frames_invalid.inc();
        }
        Read::Nothing
    };
    match message {
        Message::Text(text) => match wire::read_text(&text) {
            Ok(FromSent::Ping(ts)) => Read::Event(Event::Ping(ts)),
            Ok(FromSent::Frame(frame)) => Read::Event(Event::Frame(frame)),
            Err(error) => invalid(error, text.len()),
        },
        Message::Binary(data) => match wire::read_binary(&data) {
            Ok((stream, samples)) => {
                let samples = data.slice(wire::AUDIO_HEADER..wire::AUDIO_HEADER + samples.len());
                Read::Event(Event::Audio { stream, samples })
            }
            Err(error) => invalid(error, data.len()),
        },
        Message::Close(frame) => Read::Closed(close_code(&frame)),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Read::Nothing,
    }
}

fn close_code(frame: &Option<CloseFrame>) -> u16 {
    frame.as_ref().map_or(1005, |f| u16::from(f.code))
}

/// Why the writer stopped on its own.
struct WriterEnd {
    why: String,
    /// It sent a close frame: the reader waits a little for Sent's side of the close.
    linger: bool,
}

struct Reader {
    id: ConnId,
    source: SplitStream<Socket>,
    outbox: Arc<Outbox>,
    events: Events,
    done: oneshot::Receiver<WriterEnd>,
    writer: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

impl Reader {
    async fn run(&mut self, early: Vec<Event>) -> String {
        let why = self.read(early).await;
        // The writer finishes a close frame or the reply to Sent's, then stops.
        self.outbox.reader_gone();
        if tokio::time::timeout(CLOSE_GRACE, &mut self.writer)
            .await
            .is_err()
        {
            debug!("the writer did not stop in time: aborting it");
            self.writer.abort();
        }
        self.outbox.writer_gone();
        why
    }

    /// Hands an event to the agent, marked as heard: while it waits for the agent's lock, the time passes
    /// as the agent's, not as Sent's silence.
    fn send(&self, event: Event) -> bool {
        self.outbox.heard(true);
        let sent = self.events.handle(self.id, event);
        self.outbox.heard(false);
        sent
    }

    /// Reads until the connection ends, and says why it ended.
    async fn read(&mut self, early: Vec<Event>) -> String {
        for event in early {
            if !self.send(event) {
                return self.give_up();
            }
        }
        let mut writer_stopped = false;
        // Set once the writer sent a clean close: why, and until when Sent's answer is awaited.
        let mut closing: Option<(String, Instant)> = None;
        // Armed only while closing, for Sent's side of the close.
        let timer = tokio::time::sleep(Duration::MAX / 4);
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                end = &mut self.done, if !writer_stopped => {
                    writer_stopped = true;
                    match end {
                        Ok(WriterEnd { why, linger: true }) => {
                            let until = Instant::now() + CLOSE_GRACE;
                            timer.as_mut().reset(until);
                            closing = Some((why, until));
                        }
                        Ok(WriterEnd { why, linger: false }) => return why,
                        Err(_) => return "the writer stopped".into(),
                    }
                }
                () = &mut timer, if closing.is_some() => {
                    if let Some((why, _)) = closing {
                        return why;
                    }
                }
                next = self.source.next() => {
                    let message = match next {
                        None => {
                            return closing.map_or_else(|| "lost: the socket ended".into(), |(why, _)| why)
                        }
                        Some(Err(WsError::Capacity(e))) => {
                            // [scenario: oversized_message_closes_the_connection] A message past the limit
                            // ends the connection (its calls resume on another).
                            warn!(error = %e, "Sent sent a message over the limit: closing");
                            self.stats.frames_invalid.inc();
                            self.outbox.close_with(CloseCode::Size, "message too big");
                            // The rest of the message is unread: a socket dropped now is reset, and the
                            // reset can overtake the close frame. The writer sends it; Sent gets a moment
                            // to read it before the socket goes (the read side is past use: what follows
                            // the too-long frame's header is its payload, not frames).
                            if !writer_stopped {
                                let _ = tokio::time::timeout(CLOSE_GRACE, &mut self.done).await;
                            }
                            tokio::time::sleep(CLOSE_GRACE).await;
                            return match e {
                                CapacityError::MessageTooLong { size, max_size } => {
                                    format!("closed with 1009: a message of {size} bytes (at most {max_size})")
                                }
                                e => format!("closed with 1009: {e}"),
                            };
                        }
                        Some(Err(e)) => {
                            return closing.map_or_else(|| format!("lost: {e}"), |(why, _)| why)
                        }
                        Some(Ok(message)) => message,
                    };
                    self.outbox.heard(false);
                    if let Some((why, _)) = &closing {
                        // Closing: only Sent's close matters now.
                        if matches!(message, Message::Close(_)) {
                            return why.clone();
                        }
                        continue;
                    }
                    match read(message, Some(&self.stats)) {
                        Read::Event(event) => {
                            if !self.send(event) {
                                return self.give_up();
                            }
                        }
                        Read::Closed(code) => {
                            info!(code, "Sent closed the connection");
                            return format!("closed by Sent with {code}");
                        }
                        Read::Nothing => {}
                    }
                }
            }
        }
    }

    /// Nobody reads the events: close with 1001 (the sessions stay resumable).
    fn give_up(&self) -> String {
        self.outbox.close_with(CloseCode::Away, "no listener");
        "nobody reads the connection's events".into()
    }
}

// ----- writing -----

/// The writer: pongs first, then what is queued, fed as a batch and flushed once; what it flushed is
/// recorded in the outbox (the core's rule on a Sent that takes nothing is judged from it). Aborted, it
/// stops at once, mid-write: the socket takes nothing.
async fn write(
    mut sink: SplitSink<Socket, Message>,
    outbox: Arc<Outbox>,
    done: oneshot::Sender<WriterEnd>,
) {
    let end = |why: String, linger: bool| WriterEnd { why, linger };
    let result: Result<(), WriterEnd> = async {
        loop {
            outbox.ready().await;
            if outbox.is_aborted() {
                return Err(end(STALLED.into(), false));
            }
            let batch = outbox.take();
            let abort = outbox.clone();
            let aborted = async move {
                while !abort.is_aborted() {
                    abort.ready().await;
                    if !abort.is_aborted() {
                        // Something else to take: the write in progress takes it next turn.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            tokio::pin!(aborted);
            for message in batch.messages {
                tokio::select! {
                    fed = sink.feed(message) => {
                        if let Err(e) = fed {
                            return Err(end(format!("lost while sending: {e}"), false));
                        }
                    }
                    () = &mut aborted => return Err(end(STALLED.into(), false)),
                }
            }
            if let Some((code, why)) = batch.close {
                let frame = CloseFrame {
                    code,
                    reason: "".into(),
                };
                let sent =
                    tokio::time::timeout(CLOSE_GRACE, sink.send(Message::Close(Some(frame)))).await;
                let linger = matches!(sent, Ok(Ok(())));
                if !linger {
                    debug!(code = u16::from(code), "the close frame did not go out");
                }
                return Err(end(why.into(), linger));
            }
            tokio::select! {
                flushed = sink.flush() => {
                    if let Err(e) = flushed {
                        return Err(end(format!("lost while sending: {e}"), false));
                    }
                }
                () = &mut aborted => return Err(end(STALLED.into(), false)),
            }
            outbox.flushed();
            if batch.reader_gone {
                // Flushes a pending reply to Sent's close, or sends a close of our own.
                let _ = tokio::time::timeout(CLOSE_GRACE, sink.close()).await;
                return Ok(());
            }
        }
    }
    .await;
    outbox.writer_gone();
    if let Err(end) = result {
        let _ = done.send(end);
    }
}

/// Why a writer that was aborted stopped.
const STALLED: &str = "dead: Sent took nothing written for 3 heartbeat intervals";

fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
