//! One WebSocket to Sent: the handshake and its refusals, `connection.ready`, `ping` → `pong`, the
//! dead-silence rule, and a reader and a writer task (`protocol.md` §2).
//!
//! [`Connection::open`] dials (with `TCP_NODELAY`), waits for `connection.ready`, then spawns the
//! connection's two tasks and returns. Everything Sent sends (but `ping`, which the reader answers itself)
//! arrives on the events channel as [`Incoming`], tagged with the connection's id, and the last event is
//! always exactly one [`Incoming::Closed`]. What the agent sends goes through [`Connection::send`] or a
//! [`Sender`]; the writer feeds everything queued to the socket and flushes once.
//!
//! Neither the API key nor the contents of a frame (which may hold a resume token) is ever logged.

use crate::protocol::{frames, Frame, AUDIO_HEADER, SUBPROTOCOL};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use sentdm_voice_agents::frames::{self as wire, ConnectionReady};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::UrlError;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::{debug, info, warn, Instrument as _};

/// The payload type of audio messages both ways (the whole message: stream number, then samples).
pub use tokio_tungstenite::tungstenite::Bytes;

/// How long the upgrade may take, and again how long `connection.ready` may take after it (the SDK's 10 s).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Heartbeat intervals with no incoming message at all after which the connection is dead.
pub const SILENT_INTERVALS: u32 = 3;

/// How long a closing connection waits for Sent's side of the close handshake (or for the writer to finish).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The most messages the writer feeds before it flushes.
const MAX_BATCH: usize = 64;

/// The longest silence the dead-connection rule waits for, whatever `heartbeat_interval_ms` says.
const MAX_SILENCE: Duration = Duration::from_secs(24 * 60 * 60);

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The account API key. Its `Debug` and `Display` never show it; only [`ApiKey::expose`] does.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
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

/// Where and as whom to connect. Its `Debug` does not show the key.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The connect endpoint, e.g. `wss://voice.sent.dm/v1/agents/connect`; `agent_id` is appended.
    pub url: String,
    pub agent_id: String,
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
    Refused { status: u16, reason: &'static str },
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
pub fn refusal_reason(status: u16) -> Option<&'static str> {
    match status {
        400 => Some("agent_id or the subprotocol is missing"),
        401 => Some("the API key is not valid"),
        403 => Some("voice is not enabled for the account, or the key does not own the agent"),
        404 => Some("the agent does not exist"),
        _ => None,
    }
}

/// What the agent sends on the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// A frame's JSON text.
    Text(String),
    /// A binary audio message: the stream number (big-endian), then the samples.
    Audio(Bytes),
    /// A clean close (code 1000: Sent sends the connection's calls to their fallback at once); the
    /// connection ends after it, and anything queued behind it is dropped.
    Close,
}

/// What Sent sent on the connection, or its end.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// Every valid frame but `ping`. Invalid text is logged and dropped. Boxed, so the events of the audio
    /// path stay small.
    Frame(Box<Frame>),
    /// A `ping`: send its pong once every event before it has been handled, so that the pong tells Sent
    /// that everything the agent did about earlier frames (a `session.end` above all) has taken effect.
    Ping(Pong),
    /// A binary audio message of at least [`AUDIO_HEADER`] bytes, as it arrived (stream number, samples).
    Audio(Bytes),
    /// The connection has ended: the last event, exactly once.
    Closed { why: String },
}

/// The pong owed for one ping.
#[derive(Debug, Clone)]
pub struct Pong {
    text: String,
    /// Weak, so a pong waiting somewhere never keeps the connection open.
    outbox: mpsc::WeakUnboundedSender<Outgoing>,
}

impl PartialEq for Pong {
    fn eq(&self, other: &Pong) -> bool {
        self.text == other.text
    }
}

impl Pong {
    /// Queues the pong behind what is already queued.
    pub fn send(self) {
        if let Some(outbox) = self.outbox.upgrade() {
            let _ = outbox.send(Outgoing::Text(self.text));
        }
    }
}

/// A cheap handle that queues messages for one connection's writer.
#[derive(Debug, Clone)]
pub struct Sender {
    id: u64,
    outbox: mpsc::UnboundedSender<Outgoing>,
}

impl Sender {
    /// The id of the connection this sends on.
    pub fn conn_id(&self) -> u64 {
        self.id
    }

    /// Queues `out`; `false` when the connection is gone.
    pub fn send(&self, out: Outgoing) -> bool {
        self.outbox.send(out).is_ok()
    }

    /// Queues a frame's JSON text; `false` when the connection is gone.
    pub fn text(&self, text: impl Into<String>) -> bool {
        self.send(Outgoing::Text(text.into()))
    }

    /// Queues a binary audio message (stream number, then samples); `false` when the connection is gone.
    pub fn audio(&self, message: impl Into<Bytes>) -> bool {
        self.send(Outgoing::Audio(message.into()))
    }

    /// Whether the connection's writer has stopped: nothing sent from now on goes out.
    pub fn is_closed(&self) -> bool {
        self.outbox.is_closed()
    }
}

/// One open, ready WebSocket to Sent. Dropping it (and every [`Sender`]) closes the connection with 1001,
/// which leaves its sessions resumable; [`Connection::close`] closes it cleanly with 1000.
#[derive(Debug)]
pub struct Connection {
    pub id: u64,
    /// What Sent announced: its protocol version, heartbeat interval and `max_sessions`.
    pub ready: ConnectionReady,
    sender: Sender,
    pinged: Arc<AtomicBool>,
}

impl Connection {
    /// Dials, waits for `connection.ready` (each step within `dial.handshake_timeout`), then spawns the
    /// connection's tasks and returns. Events go to `events`, tagged with `id`; the last is
    /// [`Incoming::Closed`].
    pub async fn open(
        id: u64,
        dial: &Dial,
        events: mpsc::UnboundedSender<(u64, Incoming)>,
    ) -> Result<Connection, ConnectError> {
        let span = tracing::info_span!("connection", conn = id);
        let (socket, ready, early) = async {
            let mut socket = handshake(dial).await?;
            let (ready, early) = await_ready(&mut socket, dial.handshake_timeout).await?;
            info!(
                protocol_version = %ready.protocol_version,
                heartbeat_interval_ms = ready.heartbeat_interval_ms,
                max_sessions = ready.max_sessions,
                "ready"
            );
            Ok::<_, ConnectError>((socket, ready, early))
        }
        .instrument(span.clone())
        .await
        .inspect_err(|error| match error {
            ConnectError::Transient(_) => warn!(conn = id, %error, "could not connect"),
            _ => tracing::error!(conn = id, %error, "could not connect"),
        })?;

        let silence = silence_for(&ready);
        let (sink, source) = socket.split();
        let (outbox_tx, outbox) = mpsc::unbounded_channel();
        let (control_tx, control) = mpsc::unbounded_channel();
        let (done_tx, done) = oneshot::channel();
        let events = Events {
            id,
            tx: events,
            why: None,
        };
        let writer = tokio::spawn(write(sink, control, outbox, done_tx).instrument(span.clone()));
        let pinged = Arc::new(AtomicBool::new(false));
        let reader = Reader {
            source,
            control: control_tx,
            events,
            done,
            writer,
            silence,
            pinged: pinged.clone(),
            outbox: outbox_tx.downgrade(),
        };
        tokio::spawn(reader.run(early).instrument(span));
        Ok(Connection {
            id,
            ready,
            sender: Sender {
                id,
                outbox: outbox_tx,
            },
            pinged,
        })
    }

    /// Queues `out`; `false` when the connection is gone.
    pub fn send(&self, out: Outgoing) -> bool {
        self.sender.send(out)
    }

    /// A cheap handle that can send on this connection.
    pub fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// Whether a ping arrived after `connection.ready`: the official SDKs call such a connection a good one
    /// and start their backoff over when it is lost.
    pub fn pinged(&self) -> bool {
        self.pinged.load(Ordering::Relaxed)
    }

    /// Closes cleanly with 1000 after what is already queued.
    pub fn close(&self) {
        self.sender.send(Outgoing::Close);
    }

    /// Whether the connection's writer has stopped.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// How long the connection may hear nothing before it is dead: three heartbeat intervals.
    pub fn silence_limit(&self) -> Duration {
        silence_for(&self.ready)
    }
}

fn silence_for(ready: &ConnectionReady) -> Duration {
    let interval = u64::try_from(ready.heartbeat_interval_ms)
        .unwrap_or(1000)
        .max(1000);
    Duration::from_millis(interval)
        .saturating_mul(SILENT_INTERVALS)
        .min(MAX_SILENCE)
}

// ----- the handshake -----

async fn handshake(dial: &Dial) -> Result<Socket, ConnectError> {
    let mut request = dial
        .connect_url()
        .into_client_request()
        .map_err(|e| ConnectError::Invalid(format!("the URL does not work: {e}")))?;
    if !matches!(request.uri().scheme_str(), Some("ws" | "wss")) {
        return Err(ConnectError::Invalid(
            "the URL's scheme must be ws or wss".into(),
        ));
    }
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
    let connecting = tokio_tungstenite::connect_async_with_config(request, None, true);
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
) -> Result<(ConnectionReady, Vec<Incoming>), ConnectError> {
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
        match message {
            Message::Text(text) => match read_text(&text) {
                Read::Ready(ready) => return Ok((ready, early)),
                Read::Ping(pong) => {
                    socket.send(Message::Text(pong.into())).await.map_err(|e| {
                        ConnectError::Transient(format!("lost before connection.ready: {e}"))
                    })?;
                }
                Read::Frame(frame) => early.push(Incoming::Frame(frame)),
                Read::Invalid => {}
            },
            Message::Binary(data) => early.extend(read_binary(data)),
            Message::Close(frame) => {
                return Err(ConnectError::Transient(format!(
                    "Sent closed the socket with {} before connection.ready",
                    close_code(&frame)
                )))
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
}

// ----- reading -----

enum Read {
    Ready(ConnectionReady),
    /// A ping, and the pong text that answers it.
    Ping(String),
    Frame(Box<Frame>),
    Invalid,
}

fn read_text(text: &str) -> Read {
    match frames::decode(text) {
        Ok(Frame::ConnectionReady(ready)) => Read::Ready(ready),
        Ok(Frame::Ping(ping)) => {
            match frames::encode_to_string(&Frame::Pong(wire::Pong { ts: ping.ts })) {
                Ok(pong) => Read::Ping(pong),
                Err(e) => {
                    warn!(error = %loggable(&e.message), "cannot answer a ping");
                    Read::Invalid
                }
            }
        }
        Ok(frame) => Read::Frame(Box::new(frame)),
        Err(e) => {
            // Only the frame's type, its session and the rule it broke: its contents may hold a token.
            let json = serde_json::from_str::<serde_json::Value>(text).ok();
            let field = |name: &str| {
                json.as_ref()
                    .and_then(|j| j.get(name))
                    .and_then(serde_json::Value::as_str)
                    .map(|s| s.chars().take(64).collect::<String>())
            };
            let (frame_type, session_id) = (field("type"), field("session_id"));
            warn!(
                frame_type = frame_type.as_deref(),
                session_id = session_id.as_deref(),
                bytes = text.len(),
                error = %loggable(&e.message),
                "dropped an invalid frame from Sent"
            );
            Read::Invalid
        }
    }
}

fn read_binary(data: Bytes) -> Option<Incoming> {
    if data.len() < AUDIO_HEADER {
        warn!(
            bytes = data.len(),
            "dropped a binary message too short for a stream number"
        );
        return None;
    }
    Some(Incoming::Audio(data))
}

/// An error message without anything quoted in it (a value from the frame), and not too long.
fn loggable(message: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in message.chars() {
        if c == '"' {
            if !quoted {
                out.push_str("\"…\"");
            }
            quoted = !quoted;
        } else if !quoted {
            out.push(c);
        }
        if out.len() > 200 {
            out.push('…');
            break;
        }
    }
    out
}

fn close_code(frame: &Option<CloseFrame>) -> u16 {
    frame.as_ref().map_or(1005, |f| u16::from(f.code))
}

/// The events channel, which sends [`Incoming::Closed`] exactly once: when it is dropped, however the
/// reader task ends (returns, panics or is aborted).
struct Events {
    id: u64,
    tx: mpsc::UnboundedSender<(u64, Incoming)>,
    why: Option<String>,
}

impl Events {
    /// `false` when nobody reads the events any more.
    fn send(&self, event: Incoming) -> bool {
        self.tx.send((self.id, event)).is_ok()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let why = self
            .why
            .take()
            .unwrap_or_else(|| "the connection's task stopped".into());
        info!(conn = self.id, why = %why, "closed");
        let _ = self.tx.send((self.id, Incoming::Closed { why }));
    }
}

/// What the reader asks of the writer.
enum Control {
    /// Send a close frame with this code and stop.
    Close(CloseCode, &'static str),
}

/// Why the writer stopped on its own.
struct WriterEnd {
    why: String,
    /// It sent a close frame: the reader waits a little for Sent's side of the close.
    linger: bool,
}

struct Reader {
    source: SplitStream<Socket>,
    control: mpsc::UnboundedSender<Control>,
    events: Events,
    done: oneshot::Receiver<WriterEnd>,
    writer: tokio::task::JoinHandle<()>,
    silence: Duration,
    pinged: Arc<AtomicBool>,
    /// Weak, so dropping every handle still closes the connection.
    outbox: mpsc::WeakUnboundedSender<Outgoing>,
}

impl Reader {
    async fn run(mut self, early: Vec<Incoming>) {
        let why = self.read(early).await;
        // The writer sees the control channel end: it finishes a close frame or the reply to Sent's, then stops.
        let Reader {
            control,
            mut events,
            mut writer,
            source,
            ..
        } = self;
        drop(control);
        if tokio::time::timeout(CLOSE_GRACE, &mut writer)
            .await
            .is_err()
        {
            debug!("the writer did not stop in time: aborting it");
            writer.abort();
            let _ = writer.await;
        }
        drop(source);
        events.why = Some(why);
    }

    /// Reads until the connection ends, and says why it ended.
    async fn read(&mut self, early: Vec<Incoming>) -> String {
        for event in early {
            if !self.events.send(event) {
                return self.give_up();
            }
        }
        let mut last_heard = Instant::now();
        let mut writer_stopped = false;
        // Set once the writer sent a clean close: why, and until when Sent's answer is awaited.
        let mut closing: Option<(String, Instant)> = None;
        // Armed for the silence deadline, and re-armed only when it fires early (not on every message).
        let timer = tokio::time::sleep(self.silence);
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
                () = &mut timer => {
                    let now = Instant::now();
                    let due = match &closing {
                        Some((_, until)) => *until,
                        None => last_heard + self.silence,
                    };
                    if due > now {
                        timer.as_mut().reset(due);
                        continue;
                    }
                    if let Some((why, _)) = closing {
                        return why;
                    }
                    let _ = self.control.send(Control::Close(CloseCode::Away, "silent"));
                    warn!(silence = ?self.silence, "no message for 3 heartbeat intervals: closing");
                    return format!(
                        "dead: no message for {} ms ({SILENT_INTERVALS} heartbeat intervals)",
                        self.silence.as_millis()
                    );
                }
                next = self.source.next() => {
                    let message = match next {
                        None => {
                            return closing.map_or_else(|| "lost: the socket ended".into(), |(why, _)| why)
                        }
                        Some(Err(e)) => {
                            return closing.map_or_else(|| format!("lost: {e}"), |(why, _)| why)
                        }
                        Some(Ok(message)) => message,
                    };
                    last_heard = Instant::now();
                    if let Some((why, _)) = &closing {
                        // Closing: only Sent's close matters now.
                        if matches!(message, Message::Close(_)) {
                            return why.clone();
                        }
                        continue;
                    }
                    match message {
                        Message::Text(text) => match read_text(&text) {
                            Read::Ping(text) => {
                                self.pinged.store(true, Ordering::Relaxed);
                                let pong = Pong {
                                    text,
                                    outbox: self.outbox.clone(),
                                };
                                if !self.events.send(Incoming::Ping(pong)) {
                                    return self.give_up();
                                }
                            }
                            Read::Ready(ready) => {
                                if !self.events.send(Incoming::Frame(Box::new(Frame::ConnectionReady(ready)))) {
                                    return self.give_up();
                                }
                            }
                            Read::Frame(frame) => {
                                if !self.events.send(Incoming::Frame(frame)) {
                                    return self.give_up();
                                }
                            }
                            Read::Invalid => {}
                        },
                        Message::Binary(data) => {
                            if let Some(audio) = read_binary(data) {
                                if !self.events.send(audio) {
                                    return self.give_up();
                                }
                            }
                        }
                        Message::Close(frame) => {
                            let code = close_code(&frame);
                            info!(code, "Sent closed the connection");
                            return format!("closed by Sent with {code}");
                        }
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                    }
                }
            }
        }
    }

    /// Nobody reads the events: close with 1001 (the sessions stay resumable).
    fn give_up(&self) -> String {
        let _ = self
            .control
            .send(Control::Close(CloseCode::Away, "no listener"));
        "nobody reads the connection's events".into()
    }
}

// ----- writing -----

enum Step {
    Send(Message),
    /// Send this close frame and stop; `Some` says why, for the reader (the writer chose to stop).
    Close(CloseFrame, Option<String>),
    /// The reader has stopped: finish what tungstenite has pending (a close reply) and stop.
    ReaderGone,
}

fn step_of_control(control: Option<Control>) -> Step {
    match control {
        Some(Control::Close(code, reason)) => Step::Close(
            CloseFrame {
                code,
                reason: reason.into(),
            },
            None,
        ),
        None => Step::ReaderGone,
    }
}

fn step_of_outgoing(out: Option<Outgoing>) -> Step {
    match out {
        Some(Outgoing::Text(text)) => Step::Send(Message::Text(text.into())),
        Some(Outgoing::Audio(data)) => Step::Send(Message::Binary(data)),
        Some(Outgoing::Close) => Step::Close(
            CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            },
            Some("closed by the agent with 1000".into()),
        ),
        // Every handle is gone: nobody can send on it any more. 1001 keeps its sessions resumable.
        None => Step::Close(
            CloseFrame {
                code: CloseCode::Away,
                reason: "".into(),
            },
            Some("every handle on the connection was dropped: closed with 1001".into()),
        ),
    }
}

/// The writer: pongs first, then what is queued, fed as a batch and flushed once.
async fn write(
    mut sink: SplitSink<Socket, Message>,
    mut control: mpsc::UnboundedReceiver<Control>,
    mut outbox: mpsc::UnboundedReceiver<Outgoing>,
    done: oneshot::Sender<WriterEnd>,
) {
    let mut outbox_open = true;
    loop {
        let first = tokio::select! {
            biased;
            c = control.recv() => step_of_control(c),
            o = outbox.recv(), if outbox_open => step_of_outgoing(o),
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && matches!(batch.last(), Some(Step::Send(_))) {
            match control.try_recv() {
                Ok(c) => {
                    batch.push(step_of_control(Some(c)));
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    batch.push(Step::ReaderGone);
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            match outbox.try_recv() {
                Ok(o) => batch.push(step_of_outgoing(Some(o))),
                Err(mpsc::error::TryRecvError::Disconnected) if outbox_open => {
                    outbox_open = false;
                    batch.push(step_of_outgoing(None));
                }
                Err(_) => break,
            }
        }
        for step in batch {
            match step {
                Step::Send(message) => {
                    if let Err(e) = sink.feed(message).await {
                        let _ = done.send(WriterEnd {
                            why: format!("lost while sending: {e}"),
                            linger: false,
                        });
                        return;
                    }
                }
                Step::Close(frame, why) => {
                    let code = u16::from(frame.code);
                    let sent = sink.send(Message::Close(Some(frame))).await;
                    if let Some(why) = why {
                        let linger = sent.is_ok();
                        if !linger {
                            debug!(code, "the close frame did not go out");
                        }
                        let _ = done.send(WriterEnd { why, linger });
                    }
                    return;
                }
                Step::ReaderGone => {
                    // Flushes a pending reply to Sent's close, or sends a close of our own.
                    let _ = sink.close().await;
                    return;
                }
            }
        }
        if let Err(e) = sink.flush().await {
            let _ = done.send(WriterEnd {
                why: format!("lost while sending: {e}"),
                linger: false,
            });
            return;
        }
    }
}

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
