//! Sent's side of the protocol on loopback: the connect endpoint and its refusals, connections with
//! `connection.ready` and heartbeats, sessions with Sent-side counting, retention, resume and replay, tool
//! results, draining, drops and closes. Scenarios drive it through [`Sim`], [`ConnHandle`] and [`Call`].
//!
//! One lock guards the whole state and every frame is queued for its socket while that lock is held, so
//! what the recorder shows is the order on the wire.

use crate::record::{describe, Dir, Recorder, Violation, What};
use crate::wire::{self, AgentFrame, Refusal};
use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use sentdm_voice_agents::frames::{
    ConnectionDraining, ConnectionReady, ErrorFrame, ErrorInfo, Frame, Party, Ping, Resume,
    SessionEnd, SessionResumed, SessionResumedAudio, SessionStart, SessionStartAudio, ToolResult,
    UserSaid, CONNECT_PATH, RETAINED_FRAMES, SUBPROTOCOL,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

/// The agent the official conformance program connects as.
pub const CONFORMANCE_AGENT: &str = "agent_conformance";
/// The API key the official conformance program connects with: it owns [`CONFORMANCE_AGENT`].
pub const CONFORMANCE_KEY: &str = "conformance";

/// How long a scenario waits for anything before it fails with what arrived instead.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// One API key and the agents it owns.
#[derive(Debug, Clone)]
pub struct Account {
    /// The key an agent presents in its handshake.
    pub api_key: String,
    /// The ids of the agents the key may connect as.
    pub agents: Vec<String>,
}

/// How the simulated Sent behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// `connection.ready.protocol_version`.
    pub protocol_version: String,
    /// `connection.ready.heartbeat_interval_ms`: how often Sent pings.
    pub heartbeat_interval_ms: u64,
    /// `connection.ready.max_sessions`, unless a [`ConnPlan`] says otherwise.
    pub max_sessions: usize,
    /// `resume.window_ms` of every session.
    pub window_ms: u64,
    /// Heartbeat intervals without a pong before Sent drops the connection (the protocol does not say how
    /// many Sent allows; three, as the agent's own rule for a silent Sent).
    pub pong_intervals: u32,
    /// Who may connect as which agent.
    pub accounts: Vec<Account>,
    /// `SO_RCVBUF` of Sent's sockets (set on the listener, so the TCP window is sized from it), and a small
    /// read buffer in front of them: while a connection's reading is paused
    /// ([`ConnHandle::pause_reading`]), what Sent's side holds unread stays small. `None`: the system's.
    pub recv_buffer_bytes: Option<u32>,
    /// The largest TCP segment Sent takes (`TCP_MAXSEG` on the listener, announced to the agent). On loopback
    /// the segment is 64 KiB, and the agent's kernel sizes its send buffer in segments; small segments keep
    /// what the agent's kernel buffers for a paused Sent to about 100-200 KB on a fresh connection. `None`:
    /// the system's.
    pub max_segment_bytes: Option<u32>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            protocol_version: "0.2.0".into(),
            heartbeat_interval_ms: 15_000,
            max_sessions: 10,
            window_ms: 15_000,
            pong_intervals: 3,
            accounts: vec![
                Account {
                    api_key: CONFORMANCE_KEY.into(),
                    agents: vec![CONFORMANCE_AGENT.into()],
                },
                // A second account, so a key that does not own the agent (403) can be tried.
                Account {
                    api_key: "other-account".into(),
                    agents: vec!["agent_other".into()],
                },
            ],
            recv_buffer_bytes: None,
            max_segment_bytes: None,
        }
    }
}

/// What the next connection the agent opens gets, instead of the defaults. Plans are used in order.
#[derive(Debug, Clone, Default)]
pub struct ConnPlan {
    /// Refuse the handshake with this HTTP status.
    pub refuse: Option<u16>,
    /// `max_sessions` for this connection.
    pub max_sessions: Option<usize>,
    /// Wait this long after the upgrade before `connection.ready`.
    pub ready_delay: Duration,
    /// Sessions started right after `connection.ready`, before anything the agent sends is read.
    pub prestart: Vec<SessionSpec>,
    /// Wait this long before answering a `session.resume` on this connection.
    pub resume_delay: Duration,
    /// `connection.ready` and the `prestart` session.starts (and a close that `close_after_ready` asks for)
    /// go out in one write: fed to the socket back to back and flushed once, so the agent reads them
    /// together. Otherwise each message is flushed on its own.
    pub one_write: bool,
    /// Right after `connection.ready` (and the `prestart` sessions), Sent ends the connection this way.
    pub close_after_ready: Option<CloseAfterReady>,
    /// `session.resumed` on this connection carries no `audio`, even for a live audio session: the session
    /// has no stream here (Sent's mistake), so audio the agent sends for it can only be misplaced.
    pub resume_without_audio: bool,
    /// Sent answers no `session.resume` on this connection until the scenario does, with
    /// [`Call::answer_resume`] (`resume_delay` is not used then).
    pub hold_resumes: bool,
}

/// How Sent ends a connection right after `connection.ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseAfterReady {
    /// No close frame: the socket drops.
    Abrupt,
    /// A close frame with this code, then the socket closes.
    Close(u16),
}

/// The kind of call a session carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A text session: `user.said` in, `agent.say` out, no audio stream.
    Text,
    /// An audio session, with a stream of its own on the connection.
    Audio {
        /// The audio's sample rate in Hz, as `session.start` announces it.
        sample_rate: u32,
    },
}

/// A session to start.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// Whether the session is text or audio, and at which sample rate.
    pub kind: Kind,
    /// Whether `session.start` carries a resume token.
    pub resumable: bool,
    /// `session.start`'s `context`: what the customer's backend passed for the call.
    pub context: Option<Map<String, Value>>,
}

impl SessionSpec {
    /// A resumable text session with no `context`.
    pub fn text() -> SessionSpec {
        SessionSpec {
            kind: Kind::Text,
            resumable: true,
            context: None,
        }
    }

    /// A resumable audio session at `sample_rate` Hz with no `context`.
    pub fn audio(sample_rate: u32) -> SessionSpec {
        SessionSpec {
            kind: Kind::Audio { sample_rate },
            resumable: true,
            context: None,
        }
    }
}

/// How Sent answers a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPlan {
    /// `ok: true`. A successful `hangup` or `transfer` then ends the session.
    Ok,
    /// `ok: false` with this error code.
    Fail(String),
    /// No answer until the scenario gives one with [`Call::answer`].
    Hold,
    /// Sent refuses the `tool.call` itself: an `error` frame with this code, the session's id and
    /// `frame_type: "tool.call"`. The refusal has no effect on the call and no `tool.result` follows, but
    /// Sent read the frame on the session's own connection, so it counts (as every frame read there does).
    Refuse(String),
}

// ----- the state -----

enum Out {
    Text(String),
    Binary(Vec<u8>),
    /// A close frame with this code, then the socket closes.
    Close(u16),
    /// The socket drops with no close frame, as a crashed peer or a cut cable.
    Kill,
    /// These, fed back to back and flushed once (a `Close` or `Kill` among them ends the batch).
    Batch(Vec<Out>),
}

struct Conn {
    /// The agent the connection authenticated as.
    agent: String,
    out: mpsc::UnboundedSender<Out>,
    open: bool,
    ready: bool,
    draining: bool,
    /// Sent stops sending anything on it, pings included.
    muted: bool,
    max_sessions: usize,
    resume_delay: Duration,
    hold_resumes: bool,
    /// Sent waits this long after each message it reads (zero: it reads as fast as it can).
    read_delay: Duration,
    sessions: HashSet<String>,
    streams: HashMap<u16, String>,
    pings: HashSet<i64>,
    last_pong: Instant,
    /// Sent does not read the socket while this is true (the agent's writes back up).
    paused: tokio::sync::watch::Sender<bool>,
    /// A stream number is free again once its session has ended (by default it stays taken).
    reuse_streams: bool,
    resume_without_audio: bool,
    /// While set, what Sent sends here is gathered for one write instead of going out.
    batch: Option<Vec<Out>>,
}

impl Conn {
    fn free_stream(&self) -> u16 {
        // Each connection numbers its streams from 1, so a session that moves may meet its old number there.
        (1..=u16::MAX)
            .find(|n| !self.streams.contains_key(n))
            .unwrap_or(u16::MAX)
    }
}

struct Sess {
    kind: Kind,
    conn: Option<u32>,
    stream: Option<u16>,
    token: Option<String>,
    detached_at: Option<Instant>,
    /// Sent will refuse the next resume as if the window had passed.
    expired: bool,
    /// Sent's counted frames for the session: how many it sent, how many it no longer keeps, the kept ones.
    sent: usize,
    before: usize,
    kept: VecDeque<String>,
    /// The agent's counted frames Sent read.
    received: usize,
    /// Sent answers the next resume with this `received` instead of the true count.
    pretend_received: Option<u64>,
    /// The session.start as sent, for a duplicate.
    start: String,
    /// A `session.resume` arrived on this connection and is not answered yet.
    resuming: Option<u32>,
    /// The `received` of that resume, for an answer the scenario gives ([`Call::answer_resume`]).
    resume_read: usize,
    /// The connection the session was on before its last resume: frames the agent sent there before it
    /// moved may still arrive (no order holds across sockets); they are refused, and the agent's replay
    /// brings them again.
    moved_from: Option<u32>,
    ended: Option<String>,
    lost: bool,
    tools: HashMap<String, ToolPlan>,
    call_refs: HashSet<String>,
    /// The agent's audio for the session is counted here instead of recorded (a benchmark's flood).
    unrecorded_audio: Option<u64>,
}

impl Sess {
    fn live(&self) -> bool {
        self.ended.is_none() && !self.lost
    }

    /// Detached longer than `window`: Sent has sent the call to its fallback, and refuses its resume.
    fn window_passed(&self, window: Duration) -> bool {
        self.detached_at.is_some_and(|at| at.elapsed() > window)
    }
}

struct State {
    next_conn: u32,
    next_session: u64,
    next_token: u64,
    attempts: usize,
    /// Every handshake is refused with this status, until told otherwise.
    refuse_all: Option<u16>,
    plans: VecDeque<ConnPlan>,
    conns: BTreeMap<u32, Conn>,
    sessions: HashMap<String, Sess>,
}

struct Inner {
    config: SimConfig,
    addr: SocketAddr,
    recorder: Recorder,
    state: Mutex<State>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The simulated Sent. Clone it freely: every clone is the same simulator.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
}

/// What Sent knows of a session, for scenarios to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallState {
    /// The connection the session is on; `None` while it is detached (its connection closed and no
    /// resume has moved it yet).
    pub conn: Option<u32>,
    /// The session's audio stream number on that connection; `None` for a text session or a detached one.
    pub stream: Option<u16>,
    /// Sent's counted frames sent to the agent.
    pub sent: usize,
    /// The agent's counted frames Sent read.
    pub received: usize,
    /// A `session.resume` for the session arrived and Sent has not answered it yet.
    pub resuming: bool,
    /// The `session.end` reason, once the session has ended.
    pub ended: Option<String>,
    /// The session can no longer be resumed and its call has gone to its fallback: its resume was refused
    /// (bad token, window passed, frames no longer kept) or the agent closed its connection cleanly.
    pub lost: bool,
}

impl Sim {
    /// Starts the simulator on `addr` (use port 0 for any free port on loopback).
    pub async fn start(config: SimConfig, addr: &str) -> Result<Sim> {
        let listener = listen(&config, addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let addr = listener.local_addr()?;
        let sim = Sim {
            inner: Arc::new(Inner {
                config,
                addr,
                recorder: Recorder::default(),
                state: Mutex::new(State {
                    next_conn: 1,
                    next_session: 1,
                    next_token: 1,
                    attempts: 0,
                    refuse_all: None,
                    plans: VecDeque::new(),
                    conns: BTreeMap::new(),
                    sessions: HashMap::new(),
                }),
                tasks: Mutex::new(Vec::new()),
            }),
        };
        let accepting = sim.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let sim = accepting.clone();
                let task = tokio::spawn(async move { sim.serve_socket(stream).await });
                accepting.tasks().push(task);
            }
        });
        sim.tasks().push(task);
        Ok(sim)
    }

    /// Starts the simulator on a free loopback port.
    pub async fn start_local(config: SimConfig) -> Result<Sim> {
        Sim::start(config, "127.0.0.1:0").await
    }

    /// Stops listening and drops every connection.
    pub fn shutdown(&self) {
        for task in self.tasks().drain(..) {
            task.abort();
        }
        let mut state = self.state();
        for conn in state.conns.values_mut() {
            let _ = conn.out.send(Out::Kill);
        }
    }

    fn tasks(&self) -> MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration the simulator was started with.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The URL an agent connects to (without `agent_id`, which the agent appends).
    pub fn url(&self) -> String {
        format!("ws://{}{CONNECT_PATH}", self.inner.addr)
    }

    /// The recorder of everything the simulator saw.
    pub fn recorder(&self) -> &Recorder {
        &self.inner.recorder
    }

    /// How many handshakes were tried, accepted or not.
    pub fn attempts(&self) -> usize {
        self.state().attempts
    }

    /// Makes the next connection the agent opens follow `plan`.
    pub fn plan(&self, plan: ConnPlan) {
        self.state().plans.push_back(plan);
    }

    /// Drops the plans no connection has used yet: the next connections get the defaults.
    pub fn clear_plans(&self) {
        self.state().plans.clear();
    }

    /// The violations recorded at or after record `from`.
    pub fn violations_since(&self, from: usize) -> Vec<Violation> {
        self.inner.recorder.violations_since(from)
    }

    /// The newest connection that is open, ready and not draining, once the agent has answered a ping on it
    /// (a connection that answered a ping is one the official SDK counts as good: its backoff starts over).
    pub async fn connection(&self) -> Result<ConnHandle> {
        self.connection_for(None).await
    }

    /// [`Sim::connection`] of one agent, when several agents are connected.
    pub async fn connection_for(&self, agent: Option<&str>) -> Result<ConnHandle> {
        let agent = agent.map(str::to_string);
        let fits = move |c: &Conn| {
            c.open
                && c.ready
                && !c.draining
                && !c.muted
                && agent.as_ref().is_none_or(|a| *a == c.agent)
        };
        let sim = self.clone();
        let check = fits.clone();
        // A pong on the newest usable connection: the one a scenario then drives.
        let usable = move |conn: u32| {
            let state = sim.state();
            let newest = state
                .conns
                .iter()
                .rev()
                .find(|(_, c)| check(c))
                .map(|(id, _)| *id);
            newest == Some(conn)
        };
        let found = self
            .inner
            .recorder
            .wait_for(
                0,
                Duration::from_secs(40),
                "an open connection whose pings the agent answers",
                |r| r.session.is_none(),
                |r| r.is_frame(Dir::FromAgent, "pong") && usable(r.conn),
            )
            .await?;
        // The newest usable one, in case several are.
        let newest = {
            let state = self.state();
            state
                .conns
                .iter()
                .rev()
                .find(|(_, c)| fits(c))
                .map(|(id, _)| *id)
        };
        Ok(ConnHandle {
            sim: self.clone(),
            id: newest.unwrap_or(found.conn),
        })
    }

    /// Waits for a connection newer than `after` to get `connection.ready`.
    pub async fn connection_after(&self, after: u32, within: Duration) -> Result<ConnHandle> {
        let found = self
            .inner
            .recorder
            .wait_for(
                0,
                within,
                &format!("a connection after connection {after} to become ready"),
                |r| r.conn > after && r.session.is_none(),
                |r| r.conn > after && r.is_frame(Dir::ToAgent, "connection.ready"),
            )
            .await?;
        Ok(ConnHandle {
            sim: self.clone(),
            id: found.conn,
        })
    }

    /// A handle on connection `id`.
    pub fn conn(&self, id: u32) -> ConnHandle {
        ConnHandle {
            sim: self.clone(),
            id,
        }
    }

    /// A handle on a session the simulator started, for scenarios that learn its id from a record.
    pub fn call(&self, id: &str) -> Call {
        Call {
            sim: self.clone(),
            id: id.to_string(),
            frames_from: 0,
            audio_from: 0,
        }
    }

    /// Refuses every handshake with `status` (a transient one such as 503, as an unreachable Sent) until
    /// called again with `None`.
    pub fn refuse_all(&self, status: Option<u16>) {
        self.state().refuse_all = status;
    }

    /// The connections open now (ready or not, draining or not), of one agent or of all, oldest first.
    pub fn open_connections(&self, agent: Option<&str>) -> Vec<ConnHandle> {
        self.state()
            .conns
            .iter()
            .filter(|(_, c)| c.open && agent.is_none_or(|a| a == c.agent))
            .map(|(id, _)| self.conn(*id))
            .collect()
    }

    /// The connections of `agent` a new session can start on: open, ready, not draining or muted, with room
    /// for one more session.
    pub fn usable_connections(&self, agent: &str) -> Vec<ConnHandle> {
        self.state()
            .conns
            .iter()
            .filter(|(_, c)| {
                c.open
                    && c.ready
                    && !c.draining
                    && !c.muted
                    && c.agent == agent
                    && c.sessions.len() < c.max_sessions
            })
            .map(|(id, _)| self.conn(*id))
            .collect()
    }

    /// Ends every live session with `caller_hung_up`, forgets detached ones and drops unused connection
    /// plans: a clean slate for the next scenario on the same agent.
    pub fn end_all(&self) {
        let ids: Vec<String> = self.state().sessions.keys().cloned().collect();
        for id in ids {
            let mut state = self.state();
            let attached = state
                .sessions
                .get(&id)
                .is_some_and(|s| s.live() && s.conn.is_some() && s.resuming.is_none());
            if attached {
                self.end_locked(&mut state, &id, "caller_hung_up");
            }
            state.sessions.remove(&id);
        }
        let mut state = self.state();
        for conn in state.conns.values_mut() {
            conn.sessions.clear();
        }
        // A plan a scenario made but its agent never used must not fall on the next scenario.
        state.plans.clear();
    }

    // ----- the socket -----

    async fn serve_socket(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let mut refused_with = None;
        let mut agent = String::new();
        // tungstenite's callback type fixes the large error response: nothing to box here.
        #[allow(clippy::result_large_err)]
        let callback = |request: &Request, mut response: Response| {
            let admitted = self.admit(request);
            if let Ok(id) = &admitted {
                agent = id.clone();
            }
            if let Err(status) = admitted {
                refused_with = Some(status);
                let mut refusal = ErrorResponse::new(Some(refusal_reason(status).into()));
                *refusal.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
                return Err(refusal);
            }
            response.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                HeaderValue::from_static(SUBPROTOCOL),
            );
            Ok(response)
        };
        // With a small receive buffer, a small read buffer too: what a paused reader holds stays small.
        let config =
            self.inner.config.recv_buffer_bytes.map(|bytes| {
                WebSocketConfig::default().read_buffer_size((bytes as usize).max(4096))
            });
        let socket =
            tokio_tungstenite::accept_hdr_async_with_config(stream, callback, config).await;
        let socket = match socket {
            Ok(socket) => socket,
            Err(error) => {
                let status = refused_with.unwrap_or(400);
                self.inner
                    .recorder
                    .push(0, Dir::ToAgent, None, What::Refused { status });
                tracing::info!(status, %error, "handshake refused");
                return;
            }
        };
        let (out, mut outgoing) = mpsc::unbounded_channel();
        let plan = {
            let mut state = self.state();
            state.plans.pop_front().unwrap_or_default()
        };
        let (paused, mut paused_rx) = tokio::sync::watch::channel(false);
        let id = {
            let mut state = self.state();
            let id = state.next_conn;
            state.next_conn += 1;
            state.conns.insert(
                id,
                Conn {
                    agent,
                    out,
                    open: true,
                    ready: false,
                    draining: false,
                    muted: false,
                    max_sessions: plan.max_sessions.unwrap_or(self.inner.config.max_sessions),
                    resume_delay: plan.resume_delay,
                    hold_resumes: plan.hold_resumes,
                    read_delay: Duration::ZERO,
                    sessions: HashSet::new(),
                    streams: HashMap::new(),
                    pings: HashSet::new(),
                    last_pong: Instant::now(),
                    paused,
                    reuse_streams: false,
                    resume_without_audio: plan.resume_without_audio,
                    batch: None,
                },
            );
            self.inner
                .recorder
                .push(id, Dir::ToAgent, None, What::Opened);
            id
        };
        let (mut sink, mut source) = socket.split();
        // Dropped when the writer stops (a kill or a close): the reader stops with it.
        let (writer_alive, mut writer_gone) = tokio::sync::oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            let _alive = writer_alive;
            while let Some(out) = outgoing.recv().await {
                let (items, flush_each) = match out {
                    Out::Batch(items) => (items, false),
                    out => (vec![out], true),
                };
                for out in items {
                    let message = match out {
                        Out::Text(text) => Message::Text(text.into()),
                        Out::Binary(data) => Message::Binary(data.into()),
                        Out::Close(code) => {
                            let frame = CloseFrame {
                                code: CloseCode::from(code),
                                reason: "".into(),
                            };
                            let _ = sink.send(Message::Close(Some(frame))).await;
                            return Some(sink);
                        }
                        Out::Kill => {
                            // What a batch fed before it goes out first.
                            if !flush_each {
                                let _ = sink.flush().await;
                            }
                            return None;
                        }
                        Out::Batch(_) => continue,
                    };
                    let result = if flush_each {
                        sink.send(message).await
                    } else {
                        sink.feed(message).await
                    };
                    if result.is_err() {
                        return None;
                    }
                }
                if !flush_each && sink.flush().await.is_err() {
                    return None;
                }
            }
            None
        });
        // connection.ready, then the planned sessions, before anything the agent sends is read.
        if !plan.ready_delay.is_zero() {
            tokio::time::sleep(plan.ready_delay).await;
        }
        {
            let mut state = self.state();
            if plan.one_write {
                if let Some(conn) = state.conns.get_mut(&id) {
                    conn.batch = Some(Vec::new());
                }
            }
            let max_sessions = state.conns.get(&id).map_or(1, |c| c.max_sessions);
            self.send_conn_frame(
                &mut state,
                id,
                Frame::ConnectionReady(ConnectionReady {
                    protocol_version: self.inner.config.protocol_version.clone(),
                    heartbeat_interval_ms: self.inner.config.heartbeat_interval_ms as i64,
                    max_sessions: max_sessions as i64,
                }),
            );
            if let Some(conn) = state.conns.get_mut(&id) {
                conn.ready = true;
                conn.last_pong = Instant::now();
            }
            for spec in &plan.prestart {
                self.start_locked(&mut state, id, spec, None);
            }
            // A close right after: in the same write when the plan asks for one write.
            let (last, how) = match plan.close_after_ready {
                None => (None, None),
                Some(CloseAfterReady::Abrupt) => (Some(Out::Kill), Some("dropped by Sent".into())),
                Some(CloseAfterReady::Close(code)) => (
                    Some(Out::Close(code)),
                    Some(format!("closed by Sent with {code}")),
                ),
            };
            if let Some(conn) = state.conns.get_mut(&id) {
                match conn.batch.take() {
                    Some(mut batch) => {
                        batch.extend(last);
                        let _ = conn.out.send(Out::Batch(batch));
                    }
                    None => {
                        if let Some(last) = last {
                            let _ = conn.out.send(last);
                        }
                    }
                }
            }
            if let Some(how) = how {
                // Sent knows at once that the connection is gone (under the same lock as its
                // connection.ready): its sessions are detached from now on.
                self.closed_locked(&mut state, id, &how, false);
            }
        }
        let heartbeat = self.clone();
        let pinger = tokio::spawn(async move { heartbeat.heartbeat(id).await });
        let how = 'reading: loop {
            // Paused: Sent reads nothing, so the agent's writes back up in the socket.
            while *paused_rx.borrow_and_update() {
                tokio::select! {
                    biased;
                    _ = &mut writer_gone => break 'reading "closed by Sent".to_string(),
                    changed = paused_rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                }
            }
            let message = tokio::select! {
                biased;
                _ = &mut writer_gone => break "closed by Sent".to_string(),
                _ = paused_rx.changed() => continue,
                message = source.next() => message,
            };
            let Some(message) = message else {
                break "lost: the agent's socket closed without a close frame".to_string();
            };
            match message {
                Ok(Message::Text(text)) => self.read_text(id, &text),
                Ok(Message::Binary(data)) => self.read_audio(id, &data),
                Ok(Message::Close(frame)) => {
                    let code = frame.as_ref().map_or(1005, |f| u16::from(f.code));
                    break format!("closed by the agent with {code}");
                }
                Ok(_) => {}
                Err(error) => break format!("lost: {error}"),
            }
            // Reading slowly: the agent's writes back up, but everything is read in the end.
            let delay = self
                .state()
                .conns
                .get(&id)
                .map_or(Duration::ZERO, |c| c.read_delay);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        };
        pinger.abort();
        let clean_close_by_agent = how == "closed by the agent with 1000";
        self.closed(id, &how, clean_close_by_agent);
        // Let the writer finish a close frame it is sending, then drop the socket.
        if let Ok(Some(mut sink)) = writer.await {
            let _ = sink.close().await;
        }
    }

    /// Which status, if any, refuses this upgrade: the protocol's 400, 401, 403 and 404, or a planned one.
    fn admit(&self, request: &Request) -> Result<String, u16> {
        let mut state = self.state();
        state.attempts += 1;
        if request.uri().path() != CONNECT_PATH {
            return Err(404);
        }
        if let Some(status) = state.refuse_all {
            return Err(status);
        }
        if let Some(status) = state.plans.front().and_then(|p| p.refuse) {
            state.plans.pop_front();
            return Err(status);
        }
        let agent_id = request.uri().query().and_then(|query| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix("agent_id="))
                .filter(|id| !id.is_empty())
        });
        let subprotocol = request
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim() == SUBPROTOCOL));
        let Some(agent_id) = agent_id.filter(|_| subprotocol) else {
            return Err(400);
        };
        let key = request
            .headers()
            .get("Authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let accounts = &self.inner.config.accounts;
        let Some(account) = key.and_then(|key| accounts.iter().find(|a| a.api_key == key)) else {
            return Err(401);
        };
        if account.agents.iter().any(|a| a == agent_id) {
            return Ok(agent_id.to_string());
        }
        if accounts
            .iter()
            .any(|a| a.agents.iter().any(|x| x == agent_id))
        {
            Err(403)
        } else {
            Err(404)
        }
    }

    async fn heartbeat(&self, id: u32) {
        let interval = Duration::from_millis(self.inner.config.heartbeat_interval_ms);
        let allowed = interval * self.inner.config.pong_intervals;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            ticks.tick().await;
            let mut state = self.state();
            let Some(conn) = state.conns.get_mut(&id) else {
                return;
            };
            if !conn.open {
                return;
            }
            if conn.muted {
                continue;
            }
            if *conn.paused.borrow() || !conn.read_delay.is_zero() {
                // Sent reads nothing (or slowly): the pongs wait in the socket, through no fault of the
                // agent's.
                conn.last_pong = Instant::now();
            }
            if conn.last_pong.elapsed() > allowed {
                tracing::info!(conn = id, "no pong: dropping the agent");
                let _ = conn.out.send(Out::Close(1008));
                return;
            }
            let ts = now_ms();
            conn.pings.insert(ts);
            self.send_conn_frame(&mut state, id, Frame::Ping(Ping { ts }));
        }
    }

    fn closed(&self, id: u32, how: &str, clean_close_by_agent: bool) {
        let mut state = self.state();
        self.closed_locked(&mut state, id, how, clean_close_by_agent);
    }

    fn closed_locked(&self, state: &mut State, id: u32, how: &str, clean_close_by_agent: bool) {
        let Some(conn) = state.conns.get_mut(&id) else {
            return;
        };
        if !conn.open {
            return;
        }
        conn.open = false;
        let sessions: Vec<String> = conn.sessions.drain().collect();
        conn.streams.clear();
        self.inner
            .recorder
            .push(id, Dir::FromAgent, None, What::Closed { how: how.into() });
        for session_id in sessions {
            let Some(sess) = state.sessions.get_mut(&session_id) else {
                continue;
            };
            sess.conn = None;
            sess.stream = None;
            sess.detached_at = Some(Instant::now());
            // A clean close by the agent sends its calls to their fallback at once: nothing to resume.
            if clean_close_by_agent {
                sess.lost = true;
            }
        }
        for sess in state.sessions.values_mut() {
            if sess.resuming == Some(id) {
                sess.resuming = None;
            }
        }
    }

    // ----- reading what the agent sends -----

    fn read_text(&self, id: u32, text: &str) {
        let mut state = self.state();
        // Once Sent has dropped a connection it reads nothing more from it.
        if !state.conns.get(&id).is_some_and(|c| c.open) {
            return;
        }
        let recorder = &self.inner.recorder;
        let frame = match wire::decode_from_agent(text) {
            Ok(frame) => frame,
            Err(refusal) => {
                let session = session_of(text);
                recorder.push(
                    id,
                    Dir::FromAgent,
                    session.as_deref(),
                    What::Raw { text: text.into() },
                );
                recorder.violation(
                    id,
                    session.as_deref(),
                    format!("{}: {}", refusal.code, refusal.message),
                );
                let frame_type = type_of(text);
                self.refuse(
                    &mut state,
                    id,
                    &refusal,
                    session.as_deref(),
                    frame_type.as_deref(),
                );
                return;
            }
        };
        match &frame.frame {
            Frame::Pong(pong) => {
                recorder.push(id, Dir::FromAgent, None, frame_record(&frame));
                if let Some(conn) = state.conns.get_mut(&id) {
                    if conn.pings.remove(&pong.ts) {
                        conn.last_pong = Instant::now();
                    } else {
                        recorder.violation(
                            id,
                            None,
                            format!("a pong with ts {} no ping had", pong.ts),
                        );
                    }
                }
            }
            Frame::SessionResume(_) => self.read_resume(&mut state, id, frame),
            _ => self.read_session_frame(&mut state, id, frame),
        }
    }

    fn read_session_frame(&self, state: &mut State, id: u32, frame: AgentFrame) {
        let recorder = &self.inner.recorder;
        let session_id = frame.session_id().unwrap_or_default().to_string();
        let frame_type = frame.frame_type().to_string();
        let in_flight = state
            .sessions
            .get(&session_id)
            .is_some_and(|s| s.live() && s.conn != Some(id) && s.moved_from == Some(id));
        let refusal = match state.sessions.get(&session_id) {
            None => Some(("frame_not_allowed", "no such session".to_string(), true)),
            Some(sess) if sess.resuming.is_some() => Some((
                "frame_not_allowed",
                "sent while the session's resume was unanswered".into(),
                true,
            )),
            Some(sess) if sess.conn != Some(id) && sess.live() => Some((
                "frame_not_allowed",
                "the session is not on this connection".into(),
                !in_flight,
            )),
            // The agent may not have read session.end yet: refused, but no fault of the agent's.
            Some(sess) if !sess.live() => {
                Some(("frame_not_allowed", "the session has ended".into(), false))
            }
            Some(sess) => {
                let session_type = match sess.kind {
                    Kind::Text => "text",
                    Kind::Audio { .. } => "audio",
                };
                match wire::check_session_type(&frame_type, session_type) {
                    Err(refusal) => Some((refusal.code, refusal.message, true)),
                    Ok(()) => match &frame.frame {
                        Frame::ToolCall(call) if sess.call_refs.contains(&call.call_ref) => Some((
                            "frame_not_allowed",
                            format!("call_ref {} was used before in this session", call.call_ref),
                            true,
                        )),
                        _ => None,
                    },
                }
            }
        };
        if let Some((code, message, fault)) = refusal {
            let text = frame.json.to_string();
            // A frame still in flight on the old connection is no frame of the session's: the replay is.
            let owner = (!in_flight).then_some(session_id.as_str());
            recorder.push(id, Dir::FromAgent, owner, What::Raw { text });
            if fault {
                recorder.violation(id, Some(&session_id), format!("{frame_type}: {message}"));
            }
            let refusal = Refusal { code, message };
            self.refuse(state, id, &refusal, Some(&session_id), Some(&frame_type));
            return;
        }
        // A tool.call Sent refuses by plan, on the session's own connection: Sent read it, so it counts
        // (as every frame read on the session's connection does); it is answered with an error.
        let refused_by_plan = match (&frame.frame, state.sessions.get(&session_id)) {
            (Frame::ToolCall(call), Some(sess)) => match sess.tools.get(&call.name) {
                Some(ToolPlan::Refuse(code)) => Some((code.clone(), call.call_ref.clone())),
                _ => None,
            },
            _ => None,
        };
        if let Some((code, call_ref)) = refused_by_plan {
            recorder.push(id, Dir::FromAgent, Some(&session_id), frame_record(&frame));
            if let Some(sess) = state.sessions.get_mut(&session_id) {
                sess.received += 1;
                sess.call_refs.insert(call_ref);
            }
            let frame = Frame::ErrorFrame(ErrorFrame {
                error: ErrorInfo {
                    message: "the simulator's script refuses this tool call".into(),
                    code,
                },
                session_id: Some(session_id.clone()),
                frame_type: Some(frame_type),
            });
            self.send_on(state, id, Some(&session_id), &frame);
            return;
        }
        recorder.push(id, Dir::FromAgent, Some(&session_id), frame_record(&frame));
        let Some(sess) = state.sessions.get_mut(&session_id) else {
            return;
        };
        if wire::counted(&frame_type) {
            sess.received += 1;
        }
        if let Frame::ToolCall(call) = &frame.frame {
            sess.call_refs.insert(call.call_ref.clone());
            let plan = sess.tools.get(&call.name).cloned().unwrap_or(ToolPlan::Ok);
            let call_ref = call.call_ref.clone();
            let name = call.name.clone();
            match plan {
                ToolPlan::Hold | ToolPlan::Refuse(_) => {}
                ToolPlan::Ok => self.answer_locked(state, &session_id, &call_ref, &name, None),
                ToolPlan::Fail(code) => {
                    self.answer_locked(state, &session_id, &call_ref, &name, Some(code))
                }
            }
        }
    }

    fn read_resume(&self, state: &mut State, id: u32, frame: AgentFrame) {
        let recorder = &self.inner.recorder;
        let Frame::SessionResume(resume) = &frame.frame else {
            return;
        };
        let session_id = resume.session_id.clone();
        recorder.push(id, Dir::FromAgent, Some(&session_id), frame_record(&frame));
        let failed = Refusal {
            code: "resume_failed",
            message: "the token is unknown, used or expired".into(),
        };
        let window = Duration::from_millis(self.inner.config.window_ms);
        let at_capacity = state
            .conns
            .get(&id)
            .is_some_and(|c| c.sessions.len() >= c.max_sessions);
        let resume_delay = state
            .conns
            .get(&id)
            .map_or(Duration::ZERO, |c| c.resume_delay);
        let hold = state.conns.get(&id).is_some_and(|c| c.hold_resumes);
        let Some(sess) = state.sessions.get_mut(&session_id) else {
            self.refuse(
                state,
                id,
                &failed,
                Some(&session_id),
                Some("session.resume"),
            );
            return;
        };
        if sess.token.as_deref() != Some(resume.token.as_str()) || sess.lost {
            self.refuse(
                state,
                id,
                &failed,
                Some(&session_id),
                Some("session.resume"),
            );
            return;
        }
        let out_of_window = sess.window_passed(window);
        if sess.expired || out_of_window {
            // The token was good but its window has passed: the call has gone to its fallback.
            sess.lost = true;
            sess.token = None;
            self.refuse(
                state,
                id,
                &failed,
                Some(&session_id),
                Some("session.resume"),
            );
            return;
        }
        if at_capacity {
            let full = Refusal {
                code: "connection_full",
                message: "the connection already carries max_sessions sessions".into(),
            };
            self.refuse(state, id, &full, Some(&session_id), Some("session.resume"));
            return;
        }
        let read = resume.received as usize;
        if read < sess.before {
            // The agent needs frames Sent no longer keeps.
            sess.lost = true;
            sess.token = None;
            self.refuse(
                state,
                id,
                &failed,
                Some(&session_id),
                Some("session.resume"),
            );
            return;
        }
        if read > sess.sent {
            recorder.violation(
                id,
                Some(&session_id),
                format!(
                    "session.resume says {read} frames were read, but Sent sent {}",
                    sess.sent
                ),
            );
        }
        sess.resuming = Some(id);
        sess.resume_read = read;
        if hold {
            return;
        }
        if resume_delay.is_zero() {
            self.resumed_locked(state, id, &session_id, read);
            return;
        }
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(resume_delay).await;
            let mut state = sim.state();
            let still = state
                .sessions
                .get(&session_id)
                .is_some_and(|s| s.resuming == Some(id));
            if still {
                sim.resumed_locked(&mut state, id, &session_id, read);
            }
        });
    }

    /// Moves the session onto connection `id`, answers `session.resumed`, and replays what the agent did
    /// not read.
    fn resumed_locked(&self, state: &mut State, id: u32, session_id: &str, read: usize) {
        let token = self.token(state);
        let Some(sess) = state.sessions.get_mut(session_id) else {
            return;
        };
        sess.resuming = None;
        let old = sess.conn.take();
        sess.moved_from = old;
        let old_stream = sess.stream.take();
        let ended = sess.ended.is_some();
        let kind = sess.kind;
        if let Some(old) = old {
            if let Some(conn) = state.conns.get_mut(&old) {
                conn.sessions.remove(session_id);
                if let Some(stream) = old_stream {
                    conn.streams.remove(&stream);
                }
            }
            self.close_if_drained(state, old);
        }
        let no_audio = state.conns.get(&id).is_some_and(|c| c.resume_without_audio);
        let stream = match (kind, ended) {
            (Kind::Audio { .. }, false) if !no_audio => state.conns.get_mut(&id).map(|conn| {
                let stream = conn.free_stream();
                conn.streams.insert(stream, session_id.to_string());
                stream
            }),
            _ => None,
        };
        if let Some(conn) = state.conns.get_mut(&id) {
            conn.sessions.insert(session_id.to_string());
        }
        let Some(sess) = state.sessions.get_mut(session_id) else {
            return;
        };
        sess.conn = Some(id);
        sess.stream = stream;
        sess.detached_at = None;
        // What Sent claims it read. A claim below the truth is as if the rest were lost in the dying socket
        // (the agent sends them again, and they count again); a claim above it changes nothing of Sent's
        // own count.
        let claimed = sess.pretend_received.take().unwrap_or(sess.received as u64);
        sess.received = sess
            .received
            .min(usize::try_from(claimed).unwrap_or(usize::MAX));
        sess.token = (!ended).then_some(token.clone());
        let frame = Frame::SessionResumed(SessionResumed {
            session_id: session_id.to_string(),
            received: i64::try_from(claimed).unwrap_or(i64::MAX),
            resume: (!ended).then(|| Resume {
                token,
                window_ms: self.inner.config.window_ms as i64,
            }),
            audio: stream.map(|stream| SessionResumedAudio {
                stream: stream as i64,
            }),
        });
        let replay: Vec<String> = sess.kept.iter().skip(read - sess.before).cloned().collect();
        self.send_on(state, id, Some(session_id), &frame);
        for text in replay {
            let record = record_of_text(&text);
            self.push_out(state, id, Some(session_id), Out::Text(text), record);
        }
        if ended {
            self.forget_locked(state, session_id);
        }
    }

    fn read_audio(&self, id: u32, data: &[u8]) {
        let mut state = self.state();
        if !state.conns.get(&id).is_some_and(|c| c.open) {
            return;
        }
        let recorder = &self.inner.recorder;
        let (stream, samples) = match wire::split_audio(data) {
            Ok(audio) => audio,
            Err(refusal) => {
                recorder.violation(id, None, refusal.message);
                return;
            }
        };
        let session = state
            .conns
            .get(&id)
            .and_then(|c| c.streams.get(&stream))
            .cloned();
        if let Some(count) = session
            .as_ref()
            .and_then(|s| state.sessions.get_mut(s))
            .and_then(|s| s.unrecorded_audio.as_mut())
        {
            *count += 1;
            return;
        }
        recorder.push(
            id,
            Dir::FromAgent,
            session.as_deref(),
            What::Audio {
                stream,
                samples: samples.to_vec(),
            },
        );
        match session {
            None => recorder.violation(
                id,
                None,
                format!("audio on stream {stream}, which no session has on this connection"),
            ),
            // Audio after the end is the scenario's to judge (it fences what was in flight).
            Some(session) => {
                if state
                    .sessions
                    .get(&session)
                    .is_some_and(|s| s.resuming.is_some())
                {
                    recorder.violation(id, Some(&session), "audio while its resume was unanswered");
                }
            }
        }
    }

    // ----- what Sent sends -----

    fn refuse(
        &self,
        state: &mut State,
        id: u32,
        refusal: &Refusal,
        session: Option<&str>,
        frame_type: Option<&str>,
    ) {
        let error = |session: Option<&str>, frame_type: Option<&str>| {
            Frame::ErrorFrame(ErrorFrame {
                error: ErrorInfo {
                    code: refusal.code.into(),
                    message: refusal.message.clone(),
                },
                session_id: session.map(str::to_string),
                frame_type: frame_type.map(str::to_string),
            })
        };
        // A session id or type the agent made up may not fit the schema: then the error names neither.
        let frame = error(session, frame_type);
        let frame = if sentdm_voice_agents::frames::encode(&frame).is_ok() {
            frame
        } else {
            error(None, None)
        };
        self.send_on(state, id, session, &frame);
    }

    fn send_conn_frame(&self, state: &mut State, id: u32, frame: Frame) {
        self.send_on(state, id, None, &frame);
    }

    fn send_on(&self, state: &mut State, id: u32, session: Option<&str>, frame: &Frame) {
        let text = wire::encode(frame.clone());
        let record = record_of_text(&text);
        self.push_out(state, id, session, Out::Text(text), record);
    }

    fn push_out(&self, state: &mut State, id: u32, session: Option<&str>, out: Out, what: What) {
        let Some(conn) = state.conns.get_mut(&id) else {
            return;
        };
        if !conn.open || conn.muted {
            return;
        }
        self.inner.recorder.push(id, Dir::ToAgent, session, what);
        match &mut conn.batch {
            Some(batch) => batch.push(out),
            None => {
                let _ = conn.out.send(out);
            }
        }
    }

    /// Sends a counted or uncounted frame of a session: counted ones are kept for a replay, and go on the
    /// wire only while the session is on a connection.
    fn send_session_frame(&self, state: &mut State, session_id: &str, frame: Frame) {
        let text = wire::encode(frame.clone());
        let Some(sess) = state.sessions.get_mut(session_id) else {
            return;
        };
        if wire::counted(frame.frame_type()) {
            sess.sent += 1;
            sess.kept.push_back(text.clone());
            if sess.kept.len() > RETAINED_FRAMES {
                sess.kept.pop_front();
                sess.before += 1;
            }
        }
        if let (Some(id), None) = (sess.conn, sess.resuming) {
            let record = record_of_text(&text);
            self.push_out(state, id, Some(session_id), Out::Text(text), record);
        }
    }

    fn token(&self, state: &mut State) -> String {
        state.next_token += 1;
        let seed = now_ms() as u64 ^ (self.inner.addr.port() as u64) << 48;
        format!("vsr_{:016x}{:016x}", seed, state.next_token)
    }

    /// Starts a session on connection `id`, named `session_id` (the next `vs_sim-N` when `None`).
    fn start_locked(
        &self,
        state: &mut State,
        id: u32,
        spec: &SessionSpec,
        session_id: Option<&str>,
    ) -> String {
        let number = state.next_session;
        state.next_session += 1;
        let session_id = session_id.map_or_else(|| format!("vs_sim-{number}"), str::to_string);
        let token = spec.resumable.then(|| self.token(state));
        let stream = match spec.kind {
            Kind::Audio { .. } => state.conns.get_mut(&id).map(|conn| {
                let stream = conn.free_stream();
                conn.streams.insert(stream, session_id.clone());
                stream
            }),
            Kind::Text => None,
        };
        if let Some(conn) = state.conns.get_mut(&id) {
            conn.sessions.insert(session_id.clone());
        }
        let agent = state
            .conns
            .get(&id)
            .map_or_else(|| CONFORMANCE_AGENT.to_string(), |c| c.agent.clone());
        let frame = Frame::SessionStart(SessionStart {
            session_id: session_id.clone(),
            call_id: format!("call_sim-{number}"),
            agent_id: agent.clone(),
            direction: "inbound".into(),
            from: Party {
                kind: "number".into(),
                value: Some("+14155550100".into()),
            },
            to: Party {
                kind: "agent".into(),
                value: Some(agent),
            },
            session_type: match spec.kind {
                Kind::Text => "text".into(),
                Kind::Audio { .. } => "audio".into(),
            },
            language: Some("en-US".into()),
            audio: match spec.kind {
                Kind::Audio { sample_rate } => Some(SessionStartAudio {
                    stream: stream.unwrap_or(1) as i64,
                    sample_rate: Some(sample_rate as i64),
                }),
                Kind::Text => None,
            },
            max_duration_ms: Some(1_800_000),
            context: spec.context.clone(),
            resume: token.clone().map(|token| Resume {
                token,
                window_ms: self.inner.config.window_ms as i64,
            }),
            started_at: "2026-11-30T10:00:00Z".into(),
        });
        let start = wire::encode(frame.clone());
        state.sessions.insert(
            session_id.clone(),
            Sess {
                kind: spec.kind,
                conn: Some(id),
                stream,
                token,
                detached_at: None,
                expired: false,
                sent: 0,
                before: 0,
                kept: VecDeque::new(),
                received: 0,
                pretend_received: None,
                start,
                resuming: None,
                resume_read: 0,
                moved_from: None,
                ended: None,
                lost: false,
                tools: HashMap::new(),
                call_refs: HashSet::new(),
                unrecorded_audio: None,
            },
        );
        self.send_session_frame(state, &session_id, frame);
        session_id
    }

    fn answer_locked(
        &self,
        state: &mut State,
        session_id: &str,
        call_ref: &str,
        name: &str,
        error: Option<String>,
    ) {
        let ok = error.is_none();
        let frame = Frame::ToolResult(ToolResult {
            session_id: session_id.into(),
            call_ref: call_ref.into(),
            ok,
            error: error.map(|code| ErrorInfo {
                message: format!("the simulator's script fails {name} with {code}"),
                code,
            }),
        });
        self.send_session_frame(state, session_id, frame);
        let ends = match name {
            "hangup" if ok => Some("agent_hung_up"),
            "transfer" if ok => Some("transferred"),
            _ => None,
        };
        if let Some(reason) = ends {
            self.end_locked(state, session_id, reason);
        }
    }

    fn end_locked(&self, state: &mut State, session_id: &str, reason: &str) {
        let Some(sess) = state.sessions.get_mut(session_id) else {
            return;
        };
        if !sess.live() {
            return;
        }
        sess.ended = Some(reason.into());
        let attached = sess.conn.is_some() && sess.resuming.is_none();
        let frame = Frame::SessionEnd(SessionEnd {
            session_id: session_id.into(),
            reason: reason.into(),
            duration_ms: 1000,
        });
        self.send_session_frame(state, session_id, frame);
        // A detached session waits, ended, for a resume that collects its replay.
        if attached {
            self.forget_locked(state, session_id);
        }
    }

    /// The session leaves its connection for good; a draining connection left empty closes.
    fn forget_locked(&self, state: &mut State, session_id: &str) {
        let Some(sess) = state.sessions.get_mut(session_id) else {
            return;
        };
        let conn = sess.conn.take();
        let stream = sess.stream;
        sess.token = None;
        // The stream number stays taken on the connection, so audio the agent sends after the end is still
        // told apart from another session's; unless the connection reuses stream numbers, as Sent may.
        if let Some(id) = conn {
            if let Some(c) = state.conns.get_mut(&id) {
                c.sessions.remove(session_id);
                if let Some(stream) = stream.filter(|_| c.reuse_streams) {
                    if c.streams.get(&stream).map(String::as_str) == Some(session_id) {
                        c.streams.remove(&stream);
                    }
                }
            }
            self.close_if_drained(state, id);
        }
    }

    fn close_if_drained(&self, state: &mut State, id: u32) {
        if let Some(conn) = state.conns.get_mut(&id) {
            if conn.draining && conn.open && conn.sessions.is_empty() {
                let _ = conn.out.send(Out::Close(1000));
            }
        }
    }
}

/// The listener, with the socket options of `config` (which accepted sockets inherit).
async fn listen(config: &SimConfig, addr: &str) -> Result<TcpListener> {
    if config.recv_buffer_bytes.is_none() && config.max_segment_bytes.is_none() {
        return Ok(TcpListener::bind(addr).await?);
    }
    let at = tokio::net::lookup_host(addr)
        .await?
        .next()
        .context("the address resolves to nothing")?;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(at),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if let Some(bytes) = config.recv_buffer_bytes {
        socket.set_recv_buffer_size(bytes as usize)?;
    }
    if let Some(bytes) = config.max_segment_bytes {
        socket.set_tcp_mss(bytes)?;
    }
    socket.bind(&at.into())?;
    socket.listen(128)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into())?)
}

fn refusal_reason(status: u16) -> &'static str {
    match status {
        400 => "agent_id or the subprotocol is missing",
        401 => "the API key is not valid",
        403 => "the key does not own the agent",
        404 => "the agent does not exist",
        _ => "refused",
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn frame_record(frame: &AgentFrame) -> What {
    What::Frame {
        frame_type: frame.frame_type().into(),
        json: frame.json.clone(),
        counted: wire::counted(frame.frame_type()) && frame.session_id().is_some(),
    }
}

/// The record of a text Sent sends: a frame when it parses as one, raw text otherwise.
fn record_of_text(text: &str) -> What {
    match serde_json::from_str::<Value>(text) {
        Ok(json) if json.get("type").and_then(Value::as_str).is_some() => {
            let frame_type = json["type"].as_str().unwrap_or_default().to_string();
            let counted = wire::counted(&frame_type) && json.get("session_id").is_some();
            What::Frame {
                frame_type,
                json,
                counted,
            }
        }
        _ => What::Raw { text: text.into() },
    }
}

fn session_of(text: &str) -> Option<String> {
    let json: Value = serde_json::from_str(text).ok()?;
    json.get("session_id")?.as_str().map(str::to_string)
}

fn type_of(text: &str) -> Option<String> {
    let json: Value = serde_json::from_str(text).ok()?;
    json.get("type")?.as_str().map(str::to_string)
}

// ----- handles for scenarios -----

/// One connection the agent opened, as a scenario drives it.
#[derive(Clone)]
pub struct ConnHandle {
    sim: Sim,
    /// The connection's number, as in [`crate::Record::conn`].
    pub id: u32,
}

impl ConnHandle {
    /// Starts a session on this connection.
    pub fn start(&self, spec: SessionSpec) -> Call {
        let from = self.sim.inner.recorder.len();
        let mut state = self.sim.state();
        let id = self.sim.start_locked(&mut state, self.id, &spec, None);
        Call {
            sim: self.sim.clone(),
            id,
            frames_from: from,
            audio_from: from,
        }
    }

    /// Starts a resumable text session on this connection.
    pub fn start_text(&self) -> Call {
        self.start(SessionSpec::text())
    }

    /// Starts a session named `session_id` instead of the next `vs_sim-N` (an id of a length or form Sent
    /// should never use, on purpose).
    pub fn start_with_id(&self, spec: SessionSpec, session_id: &str) -> Call {
        let from = self.sim.inner.recorder.len();
        let mut state = self.sim.state();
        let id = self
            .sim
            .start_locked(&mut state, self.id, &spec, Some(session_id));
        Call {
            sim: self.sim.clone(),
            id,
            frames_from: from,
            audio_from: from,
        }
    }

    /// Every session Sent started on this connection (those of a [`ConnPlan`]'s `prestart` too), in order.
    pub fn started(&self) -> Vec<Call> {
        // Sent records a connection's first frames under its lock: once it is free they are all there.
        drop(self.sim.state());
        let conn = self.id;
        let mut ids: Vec<String> = Vec::new();
        for record in self.sim.inner.recorder.since(0, |r| {
            r.conn == conn && r.is_frame(Dir::ToAgent, "session.start")
        }) {
            if let Some(id) = record.session.clone().filter(|id| !ids.contains(id)) {
                ids.push(id);
            }
        }
        ids.iter().map(|id| self.sim.call(id)).collect()
    }

    /// Sent stops reading this connection: nothing the agent sends is read (or recorded) until
    /// [`ConnHandle::resume_reading`], so the agent's writes back up in the socket. Sent still writes, pings
    /// included, and does not drop the agent for pongs it has not read.
    pub fn pause_reading(&self) {
        if let Some(conn) = self.sim.state().conns.get(&self.id) {
            conn.paused.send_replace(true);
        }
    }

    /// Sent reads the connection again, from where it stopped.
    pub fn resume_reading(&self) {
        if let Some(conn) = self.sim.state().conns.get_mut(&self.id) {
            conn.last_pong = Instant::now();
            conn.paused.send_replace(false);
        }
    }

    /// From now on a stream number is free again on this connection once its session has ended, so the
    /// next audio session may get it (by default an ended session's number stays taken).
    pub fn reuse_ended_streams(&self) {
        if let Some(conn) = self.sim.state().conns.get_mut(&self.id) {
            conn.reuse_streams = true;
        }
    }

    /// Sends one text message of exactly `bytes` bytes (at least 40): a connection frame of a type the
    /// protocol does not define, padded, so that its size is all that can be wrong with it.
    pub fn send_raw_sized(&self, bytes: usize) {
        let head = r#"{"type":"connection.note","pad":""#;
        let pad = bytes.saturating_sub(head.len() + 2);
        let text = format!("{head}{}\"}}", "x".repeat(pad));
        self.send_raw(&text);
    }

    /// Starts a resumable audio session at `sample_rate` Hz on this connection.
    pub fn start_audio(&self, sample_rate: u32) -> Call {
        self.start(SessionSpec::audio(sample_rate))
    }

    /// `connection.draining`: no new sessions here; the agent should move its sessions.
    pub fn drain(&self) {
        let mut state = self.sim.state();
        self.sim.send_conn_frame(
            &mut state,
            self.id,
            Frame::ConnectionDraining(ConnectionDraining {}),
        );
        if let Some(conn) = state.conns.get_mut(&self.id) {
            conn.draining = true;
        }
        self.sim.close_if_drained(&mut state, self.id);
    }

    /// Drops the socket with no close frame.
    pub fn drop_abruptly(&self) {
        if let Some(conn) = self.sim.state().conns.get(&self.id) {
            let _ = conn.out.send(Out::Kill);
        }
        // Sent knows at once that the connection is gone: its sessions are detached from now on.
        self.sim.closed(self.id, "dropped by Sent", false);
    }

    /// Closes with a close frame (1001: Sent going away).
    pub fn close(&self) {
        if let Some(conn) = self.sim.state().conns.get(&self.id) {
            let _ = conn.out.send(Out::Close(1001));
        }
        self.sim.closed(self.id, "closed by Sent with 1001", false);
    }

    /// Sent reads this connection slowly from now on: it waits `delay` after each message it reads (zero:
    /// it reads as fast as it can again). The agent's writes back up, but everything is read in the end;
    /// Sent does not drop the agent for pongs still waiting in the socket.
    pub fn read_slowly(&self, delay: Duration) {
        if let Some(conn) = self.sim.state().conns.get_mut(&self.id) {
            conn.read_delay = delay;
            conn.last_pong = Instant::now();
        }
    }

    /// Sent goes silent on this connection: no pings, no frames, and it keeps the socket open.
    pub fn mute(&self) {
        if let Some(conn) = self.sim.state().conns.get_mut(&self.id) {
            conn.muted = true;
        }
    }

    /// Sends text as is on the connection (an invalid frame on purpose, or one of an unknown type).
    pub fn send_raw(&self, text: &str) {
        let mut state = self.sim.state();
        let record = record_of_text(text);
        self.sim
            .push_out(&mut state, self.id, None, Out::Text(text.into()), record);
    }

    /// Whether the connection is still open: neither side has closed or dropped it.
    pub fn is_open(&self) -> bool {
        self.sim.state().conns.get(&self.id).is_some_and(|c| c.open)
    }

    /// Sends a ping and waits for its pong: everything the agent wrote before reading the ping has arrived.
    /// Returns the sequence number of the pong's record.
    pub async fn fence(&self) -> Result<usize> {
        let from = self.sim.inner.recorder.len();
        let ts = {
            let mut state = self.sim.state();
            let ts = now_ms() + 1_000_000_000 + from as i64;
            if let Some(conn) = state.conns.get_mut(&self.id) {
                conn.pings.insert(ts);
            }
            self.sim
                .send_conn_frame(&mut state, self.id, Frame::Ping(Ping { ts }));
            ts
        };
        let conn = self.id;
        let pong = self
            .sim
            .inner
            .recorder
            .wait_for(
                from,
                DEADLINE,
                &format!("the pong to ping {ts} on connection {conn}"),
                |r| r.conn == conn && r.session.is_none(),
                |r| {
                    r.conn == conn
                        && r.is_frame(Dir::FromAgent, "pong")
                        && r.json().is_some_and(|j| j["ts"] == ts)
                },
            )
            .await?;
        Ok(pong.seq)
    }

    /// Waits until the connection closes, and returns how.
    pub async fn closed(&self, within: Duration) -> Result<String> {
        let conn = self.id;
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                0,
                within,
                &format!("connection {conn} to close"),
                |r| r.conn == conn && r.session.is_none(),
                |r| r.conn == conn && matches!(r.what, What::Closed { .. }),
            )
            .await?;
        match &record.what {
            What::Closed { how } => Ok(how.clone()),
            _ => Ok(String::new()),
        }
    }
}

/// One session, as a scenario drives it from Sent's side and checks what the agent sends for it.
pub struct Call {
    sim: Sim,
    /// The session's id, as in its `session.start`.
    pub id: String,
    frames_from: usize,
    audio_from: usize,
}

impl Call {
    fn with_state<T>(&self, f: impl FnOnce(&Sim, &mut State) -> T) -> T {
        let mut state = self.sim.state();
        f(&self.sim, &mut state)
    }

    /// `user.said`.
    pub fn say(&self, text: &str) {
        self.user_said(text, false);
    }

    /// `user.said` with `correction: true`.
    pub fn correct(&self, text: &str) {
        self.user_said(text, true);
    }

    fn user_said(&self, text: &str, correction: bool) {
        let frame = Frame::UserSaid(UserSaid {
            session_id: self.id.clone(),
            text: text.into(),
            correction,
        });
        self.with_state(|sim, state| sim.send_session_frame(state, &self.id, frame));
    }

    /// A session frame of a type the protocol does not define (yet): counted by both sides.
    pub fn send_unknown(&self, frame_type: &str) {
        let mut fields = Map::new();
        fields.insert("type".into(), Value::String(frame_type.into()));
        fields.insert("session_id".into(), Value::String(self.id.clone()));
        fields.insert(
            "note".into(),
            Value::String("added in a later version".into()),
        );
        let frame = Frame::Unknown(sentdm_voice_agents::frames::UnknownFrame {
            frame_type: frame_type.into(),
            session_id: Some(self.id.clone()),
            fields,
        });
        self.with_state(|sim, state| sim.send_session_frame(state, &self.id, frame));
    }

    /// Caller audio on the session's stream.
    pub fn send_audio(&self, samples: &[u8]) {
        self.with_state(|sim, state| {
            let Some(sess) = state.sessions.get(&self.id) else {
                return;
            };
            let (Some(conn), Some(stream), None) = (sess.conn, sess.stream, sess.resuming) else {
                return;
            };
            let what = What::Audio {
                stream,
                samples: samples.to_vec(),
            };
            let out = Out::Binary(wire::audio_message(stream, samples));
            sim.push_out(state, conn, Some(&self.id), out, what);
        });
    }

    /// Sends the session's `session.start` again, unchanged, on the connection the session is on (a
    /// duplicate: Sent's mistake). What Sent knows of the session does not change.
    pub fn start_again(&self) {
        self.with_state(|sim, state| {
            let Some(sess) = state.sessions.get(&self.id) else {
                return;
            };
            let (Some(conn), text) = (sess.conn, sess.start.clone()) else {
                return;
            };
            let record = record_of_text(&text);
            sim.push_out(state, conn, Some(&self.id), Out::Text(text), record);
        });
    }

    /// `session.end` with `reason`. A detached session keeps it for the replay of a later resume.
    pub fn end(&self, reason: &str) {
        self.with_state(|sim, state| sim.end_locked(state, &self.id, reason));
    }

    /// How Sent answers the tool `name` from now on.
    pub fn plan_tool(&self, name: &str, plan: ToolPlan) {
        self.with_state(|_, state| {
            if let Some(sess) = state.sessions.get_mut(&self.id) {
                sess.tools.insert(name.into(), plan);
            }
        });
    }

    /// Answers a held tool call: `None` for success, or an error code.
    pub fn answer(&self, call_ref: &str, name: &str, error: Option<&str>) {
        self.with_state(|sim, state| {
            sim.answer_locked(state, &self.id, call_ref, name, error.map(str::to_string))
        });
    }

    /// Answers the session's unanswered `session.resume` now, on the connection it came on (one a
    /// [`ConnPlan::hold_resumes`] holds): `session.resumed` and the replay. Returns false when no resume
    /// of the session waits for an answer.
    pub fn answer_resume(&self) -> bool {
        self.with_state(|sim, state| {
            let Some((conn, read)) = state
                .sessions
                .get(&self.id)
                .and_then(|s| Some((s.resuming?, s.resume_read)))
            else {
                return false;
            };
            sim.resumed_locked(state, conn, &self.id, read);
            true
        })
    }

    /// Sent will refuse the next resume of this session as if its window had passed.
    pub fn expire_resume(&self) {
        self.with_state(|_, state| {
            if let Some(sess) = state.sessions.get_mut(&self.id) {
                sess.expired = true;
            }
        });
    }

    /// Sent will answer the next resume claiming it read `received` of the agent's frames instead of the
    /// true count: fewer, as if the rest were lost in the dying socket; or more (up to `i64::MAX`), Sent's
    /// mistake, which leaves its own count as it is.
    pub fn pretend_received(&self, received: u64) {
        self.with_state(|_, state| {
            if let Some(sess) = state.sessions.get_mut(&self.id) {
                sess.pretend_received = Some(received);
            }
        });
    }

    /// From now on the agent's audio for the session is only counted, not recorded (a benchmark's flood
    /// would otherwise fill the recorder).
    pub fn count_audio_only(&self) {
        self.with_state(|_, state| {
            if let Some(sess) = state.sessions.get_mut(&self.id) {
                sess.unrecorded_audio.get_or_insert(0);
            }
        });
    }

    /// The agent's audio messages for the session counted since [`Call::count_audio_only`].
    pub fn audio_counted(&self) -> u64 {
        self.with_state(|_, state| {
            state
                .sessions
                .get(&self.id)
                .and_then(|s| s.unrecorded_audio)
                .unwrap_or(0)
        })
    }

    /// What Sent knows of the session now.
    pub fn state(&self) -> Option<CallState> {
        let state = self.sim.state();
        let window = Duration::from_millis(self.sim.inner.config.window_ms);
        state.sessions.get(&self.id).map(|s| CallState {
            conn: s.conn,
            stream: s.stream,
            sent: s.sent,
            received: s.received,
            resuming: s.resuming.is_some(),
            ended: s.ended.clone(),
            // Detached past its window with no resume under way: Sent has sent the call to its fallback.
            lost: s.lost || (s.ended.is_none() && s.resuming.is_none() && s.window_passed(window)),
        })
    }

    // ----- what the agent sends for the session -----

    fn is_agent_frame(&self, record: &crate::record::Record) -> bool {
        record.dir == Dir::FromAgent
            && record.session.as_deref() == Some(self.id.as_str())
            && !matches!(record.what, What::Audio { .. })
            && record.frame_type() != Some("session.resume")
    }

    /// The next frame the agent sends for the session (a resume aside); it must satisfy `wanted`, or the
    /// scenario fails with what arrived.
    pub async fn expect_frame(
        &mut self,
        what: &str,
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                self.frames_from,
                DEADLINE,
                what,
                |r| self.is_agent_frame(r),
                |r| self.is_agent_frame(r),
            )
            .await
            .with_context(|| format!("session {}", self.id))?;
        self.frames_from = record.seq + 1;
        let json = match &record.what {
            What::Frame { json, .. } => json.clone(),
            What::Raw { text } => bail!(
                "session {}: expected {what}, got invalid text {text}",
                self.id
            ),
            other => bail!("session {}: expected {what}, got {other:?}", self.id),
        };
        if !wanted(&json) {
            bail!("session {}: expected {what}, got {record}", self.id);
        }
        Ok(json)
    }

    /// The next frame is `agent.say` with this text (and `last` defaulting to true).
    pub async fn expect_say(&mut self, text: &str) -> Result<Value> {
        self.expect_say_with(text, true).await
    }

    /// The next frame is `agent.say` with this text and this `last` (absent counts as true).
    pub async fn expect_say_with(&mut self, text: &str, last: bool) -> Result<Value> {
        let what = format!("agent.say {text:?} with last {last}");
        self.expect_frame(&what, |j| {
            j["type"] == "agent.say"
                && j["text"] == text
                && j.get("last").and_then(Value::as_bool).unwrap_or(true) == last
        })
        .await
    }

    /// The next frame is `agent.clear`.
    pub async fn expect_clear(&mut self) -> Result<Value> {
        self.expect_frame("agent.clear", |j| j["type"] == "agent.clear")
            .await
    }

    /// The next frame is a `tool.call` of `name`.
    pub async fn expect_tool(&mut self, name: &str) -> Result<Value> {
        self.expect_frame(&format!("tool.call {name}"), |j| {
            j["type"] == "tool.call" && j["name"] == name
        })
        .await
    }

    /// The agent's next audio for the session carries exactly `samples`, on the session's stream.
    pub async fn expect_audio(&mut self, samples: &[u8]) -> Result<()> {
        let id = self.id.clone();
        let is_audio = |r: &crate::record::Record| {
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(id.as_str())
                && matches!(r.what, What::Audio { .. })
        };
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                self.audio_from,
                DEADLINE,
                &format!("{} bytes of echoed audio", samples.len()),
                is_audio,
                is_audio,
            )
            .await
            .with_context(|| format!("session {id}"))?;
        self.audio_from = record.seq + 1;
        let What::Audio {
            stream,
            samples: got,
        } = &record.what
        else {
            bail!("not audio");
        };
        if got != samples {
            bail!("session {id}: expected its samples echoed, got different samples ({record})");
        }
        let current = self.state().and_then(|s| s.stream);
        if current != Some(*stream) {
            bail!("session {id}: audio on stream {stream}, but its stream is {current:?}");
        }
        Ok(())
    }

    /// The agent sends nothing more for the session (frames or audio) for `quiet`.
    pub async fn expect_nothing(&mut self, quiet: Duration) -> Result<()> {
        let (frames_from, audio_from) = (self.frames_from, self.audio_from);
        let from = frames_from.min(audio_from);
        let id = self.id.clone();
        let mine = |r: &crate::record::Record| {
            let audio = matches!(r.what, What::Audio { .. });
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(id.as_str())
                && r.frame_type() != Some("session.resume")
                && r.seq >= if audio { audio_from } else { frames_from }
        };
        match self
            .sim
            .inner
            .recorder
            .wait_for(from, quiet, "silence", |_| false, mine)
            .await
        {
            Err(_) => Ok(()),
            Ok(_) => Err(anyhow!(
                "session {id}: expected nothing more, but {}",
                describe(&self.sim.inner.recorder.since(from, mine))
            )),
        }
    }

    /// Waits for the agent's `session.resume` for this session and returns it with the connection it came
    /// on.
    pub async fn expect_resume(&mut self, within: Duration) -> Result<(u32, Value)> {
        let id = self.id.clone();
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                self.frames_from,
                within,
                &format!("session.resume for {id}"),
                |r| r.session.as_deref() == Some(id.as_str()) || r.session.is_none(),
                |r| {
                    r.session.as_deref() == Some(id.as_str())
                        && r.is_frame(Dir::FromAgent, "session.resume")
                },
            )
            .await?;
        Ok((record.conn, record.json().cloned().unwrap_or_default()))
    }

    /// Waits for Sent's answer to a resume of this session (`session.resumed` or an `error`), and returns it.
    pub async fn expect_resume_answer(&self, within: Duration) -> Result<(u32, Value)> {
        let id = self.id.clone();
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                self.frames_from,
                within,
                &format!("Sent's answer to a resume of {id}"),
                |r| r.session.as_deref() == Some(id.as_str()),
                |r| {
                    r.session.as_deref() == Some(id.as_str())
                        && r.dir == Dir::ToAgent
                        && (r.frame_type() == Some("session.resumed")
                            || (r.frame_type() == Some("error")
                                && r.json()
                                    .is_some_and(|j| j["frame_type"] == "session.resume")))
                },
            )
            .await?;
        Ok((record.conn, record.json().cloned().unwrap_or_default()))
    }

    /// Waits for Sent's `session.resumed` for this session, and returns it with its connection.
    pub async fn expect_resumed(&self, within: Duration) -> Result<(u32, Value)> {
        let id = self.id.clone();
        let record = self
            .sim
            .inner
            .recorder
            .wait_for(
                self.frames_from,
                within,
                &format!("session.resumed for {id}"),
                |r| r.session.as_deref() == Some(id.as_str()),
                |r| {
                    r.session.as_deref() == Some(id.as_str())
                        && r.is_frame(Dir::ToAgent, "session.resumed")
                },
            )
            .await?;
        Ok((record.conn, record.json().cloned().unwrap_or_default()))
    }

    /// Every counted frame the agent sent for the session that Sent accepted, in order.
    pub fn accepted_frames(&self) -> Vec<Value> {
        let id = self.id.clone();
        self.sim
            .inner
            .recorder
            .since(0, |r| {
                r.dir == Dir::FromAgent
                    && r.session.as_deref() == Some(id.as_str())
                    && matches!(r.what, What::Frame { counted: true, .. })
            })
            .iter()
            .filter_map(|r| r.json().cloned())
            .collect()
    }
}
