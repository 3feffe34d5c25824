//! Sent on loopback: the sockets, the clock and the handshake around the sans-IO model of Sent
//! ([`sentsim_model::Sent`], which holds every rule of Sent's side). Scenarios drive it through [`Sim`],
//! [`ConnHandle`] and [`Call`].
//!
//! One lock guards the model and every message it puts out is queued for its socket while that lock is
//! held, so what the recorder shows is the order on the wire.

use crate::record::{describe, Dir, Recorder, Violation, What};
use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use sentdm_voice_agents::frames::{CONNECT_PATH, SUBPROTOCOL};
pub use sentsim_model::{CallState, Kind, SessionSpec, ToolPlan, CONFORMANCE_AGENT};
use sentsim_model::{ConnSettings, Event, Message as Out, Sent};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

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

// ----- the state -----

/// What goes to a connection's writer: the model's messages, or several fed back to back and flushed once
/// (a close or a kill among them ends the batch).
enum Write {
    One(Out),
    Batch(Vec<Out>),
}

/// A connection's socket side: what the model does not hold.
struct Socket {
    out: mpsc::UnboundedSender<Write>,
    /// Sent does not read the socket while this is true (the agent's writes back up).
    paused: tokio::sync::watch::Sender<bool>,
    /// Sent waits this long after each message it reads (zero: it reads as fast as it can).
    read_delay: Duration,
    /// While set, what Sent sends here is gathered for one write instead of going out.
    batch: Option<Vec<Out>>,
}

struct State {
    sent: Sent,
    next_conn: u32,
    attempts: usize,
    /// Every handshake is refused with this status, until told otherwise.
    refuse_all: Option<u16>,
    plans: VecDeque<ConnPlan>,
    sockets: BTreeMap<u32, Socket>,
}

impl State {
    /// Hands what the model put out to the recorder and the sockets.
    fn flush(&mut self, recorder: &Recorder) {
        while let Some(event) = self.sent.poll_event() {
            match event {
                Event::Record {
                    conn,
                    dir,
                    session,
                    what,
                } => {
                    recorder.push(conn, dir, session.as_deref(), what);
                }
                Event::Violation {
                    conn,
                    session,
                    message,
                } => recorder.violation(conn, session.as_deref(), message),
            }
        }
        while let Some(transmit) = self.sent.poll_transmit() {
            let Some(socket) = self.sockets.get_mut(&transmit.conn) else {
                continue;
            };
            match &mut socket.batch {
                Some(batch) => batch.push(transmit.message),
                None => {
                    let _ = socket.out.send(Write::One(transmit.message));
                }
            }
        }
    }
}

struct Inner {
    config: SimConfig,
    addr: SocketAddr,
    recorder: Recorder,
    state: Mutex<State>,
    /// Wakes the timer task: the model may have a new timeout.
    timers: Notify,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The simulated Sent. Clone it freely: every clone is the same simulator.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
}

impl Sim {
    /// Starts the simulator on `addr` (use port 0 for any free port on loopback).
    pub async fn start(config: SimConfig, addr: &str) -> Result<Sim> {
        let listener = listen(&config, addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let addr = listener.local_addr()?;
        let model = sentsim_model::Config {
            protocol_version: config.protocol_version.clone(),
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            max_sessions: config.max_sessions,
            window_ms: config.window_ms,
            pong_intervals: config.pong_intervals,
            tools: ToolPlan::Ok,
            token_salt: now_ms() as u64 ^ (addr.port() as u64) << 48,
        };
        let sim = Sim {
            inner: Arc::new(Inner {
                config,
                addr,
                recorder: Recorder::default(),
                state: Mutex::new(State {
                    sent: Sent::new(model),
                    next_conn: 1,
                    attempts: 0,
                    refuse_all: None,
                    plans: VecDeque::new(),
                    sockets: BTreeMap::new(),
                }),
                timers: Notify::new(),
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
        let timers = sim.clone();
        let task = tokio::spawn(async move { timers.run_timers().await });
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
        let state = self.state();
        for socket in state.sockets.values() {
            let _ = socket.out.send(Write::One(Out::Kill));
        }
    }

    fn tasks(&self) -> MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the model at the present instant, then hands what it put out to the recorder and the
    /// sockets, under the one lock.
    fn with<T>(&self, f: impl FnOnce(&mut Sent, Instant) -> T) -> T {
        let mut state = self.state();
        let result = f(&mut state.sent, Instant::now());
        state.flush(&self.inner.recorder);
        drop(state);
        self.inner.timers.notify_one();
        result
    }

    /// Reads the model.
    fn read<T>(&self, f: impl FnOnce(&Sent) -> T) -> T {
        f(&self.state().sent)
    }

    /// The model's timers (a resume answered after a delay), on the clock.
    async fn run_timers(&self) {
        loop {
            let next = self.read(Sent::poll_timeout);
            match next {
                Some(at) => {
                    let at = tokio::time::Instant::from_std(at);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.inner.timers.notified() => continue,
                    }
                }
                None => {
                    self.inner.timers.notified().await;
                    continue;
                }
            }
            let mut state = self.state();
            state.sent.handle_timeout(Instant::now());
            state.flush(&self.inner.recorder);
        }
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
        let newest = move |sent: &Sent| {
            sent.conns()
                .rev()
                .find(|(_, c)| {
                    c.open
                        && c.ready
                        && !c.draining
                        && !c.muted
                        && agent.as_ref().is_none_or(|a| *a == c.agent)
                })
                .map(|(id, _)| id)
        };
        let sim = self.clone();
        let check = newest.clone();
        // A pong on the newest usable connection: the one a scenario then drives.
        let usable = move |conn: u32| sim.read(&check) == Some(conn);
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
        let newest = self.read(newest);
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
        let ids: Vec<u32> = self.read(|sent| {
            sent.conns()
                .filter(|(_, c)| c.open && agent.is_none_or(|a| a == c.agent))
                .map(|(id, _)| id)
                .collect()
        });
        ids.into_iter().map(|id| self.conn(id)).collect()
    }

    /// The connections of `agent` a new session can start on: open, ready, not draining or muted, with room
    /// for one more session.
    pub fn usable_connections(&self, agent: &str) -> Vec<ConnHandle> {
        let ids: Vec<u32> = self.read(|sent| {
            sent.conns()
                .filter(|(_, c)| c.usable() && c.agent == agent)
                .map(|(id, _)| id)
                .collect()
        });
        ids.into_iter().map(|id| self.conn(id)).collect()
    }

    /// Ends every live session with `caller_hung_up`, forgets detached ones and drops unused connection
    /// plans: a clean slate for the next scenario on the same agent.
    pub fn end_all(&self) {
        self.with(|sent, _| sent.end_all());
        // A plan a scenario made but its agent never used must not fall on the next scenario.
        self.state().plans.clear();
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
            state.sockets.insert(
                id,
                Socket {
                    out,
                    paused,
                    read_delay: Duration::ZERO,
                    batch: None,
                },
            );
            let settings = ConnSettings {
                max_sessions: plan.max_sessions,
                resume_delay: plan.resume_delay,
                resume_without_audio: plan.resume_without_audio,
                hold_resumes: plan.hold_resumes,
            };
            state.sent.handle_open(Instant::now(), id, &agent, settings);
            state.flush(&self.inner.recorder);
            id
        };
        let (mut sink, mut source) = socket.split();
        // Dropped when the writer stops (a kill or a close): the reader stops with it.
        let (writer_alive, mut writer_gone) = tokio::sync::oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            let _alive = writer_alive;
            while let Some(write) = outgoing.recv().await {
                let (items, flush_each) = match write {
                    Write::Batch(items) => (items, false),
                    Write::One(out) => (vec![out], true),
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
                if let Some(socket) = state.sockets.get_mut(&id) {
                    socket.batch = Some(Vec::new());
                }
            }
            let now = Instant::now();
            state.sent.ready(now, id);
            for spec in &plan.prestart {
                state.sent.start(id, spec, None);
            }
            state.flush(&self.inner.recorder);
            // A close right after: in the same write when the plan asks for one write.
            let (last, how) = match plan.close_after_ready {
                None => (None, None),
                Some(CloseAfterReady::Abrupt) => (Some(Out::Kill), Some("dropped by Sent".into())),
                Some(CloseAfterReady::Close(code)) => (
                    Some(Out::Close(code)),
                    Some(format!("closed by Sent with {code}")),
                ),
            };
            if let Some(socket) = state.sockets.get_mut(&id) {
                match socket.batch.take() {
                    Some(mut batch) => {
                        batch.extend(last);
                        let _ = socket.out.send(Write::Batch(batch));
                    }
                    None => {
                        if let Some(last) = last {
                            let _ = socket.out.send(Write::One(last));
                        }
                    }
                }
            }
            if let Some(how) = how {
                // Sent knows at once that the connection is gone (under the same lock as its
                // connection.ready): its sessions are detached from now on.
                state.sent.handle_closed(now, id, &how, false);
                state.flush(&self.inner.recorder);
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
                Ok(Message::Text(text)) => self.with(|sent, now| sent.handle_text(now, id, &text)),
                Ok(Message::Binary(data)) => self.with(|sent, _| sent.handle_binary(id, &data)),
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
                .sockets
                .get(&id)
                .map_or(Duration::ZERO, |s| s.read_delay);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        };
        pinger.abort();
        let clean_close_by_agent = how == "closed by the agent with 1000";
        self.with(|sent, now| sent.handle_closed(now, id, &how, clean_close_by_agent));
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
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            ticks.tick().await;
            let mut state = self.state();
            // Sent reads nothing (or slowly): the pongs wait in the socket, through no fault of the agent's.
            let reading_behind = state
                .sockets
                .get(&id)
                .is_some_and(|s| *s.paused.borrow() || !s.read_delay.is_zero());
            let open = state.sent.conn(id).is_some_and(|c| c.open);
            let going_on = state
                .sent
                .heartbeat(Instant::now(), id, now_ms(), reading_behind);
            state.flush(&self.inner.recorder);
            if !going_on {
                if open {
                    tracing::info!(conn = id, "no pong: dropping the agent");
                }
                return;
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

// ----- handles for scenarios -----

/// One connection the agent opened, as a scenario drives it.
#[derive(Clone)]
pub struct ConnHandle {
    sim: Sim,
    /// The connection's number, as in [`crate::Record::conn`].
    pub id: u32,
}

impl ConnHandle {
    fn call(&self, id: String, from: usize) -> Call {
        Call {
            sim: self.sim.clone(),
            id,
            frames_from: from,
            audio_from: from,
        }
    }

    /// Starts a session on this connection.
    pub fn start(&self, spec: SessionSpec) -> Call {
        let from = self.sim.inner.recorder.len();
        let id = self.sim.with(|sent, _| sent.start(self.id, &spec, None));
        self.call(id, from)
    }

    /// Starts a resumable text session on this connection.
    pub fn start_text(&self) -> Call {
        self.start(SessionSpec::text())
    }

    /// Starts a session named `session_id` instead of the next `vs_sim-N` (an id of a length or form Sent
    /// should never use, on purpose).
    pub fn start_with_id(&self, spec: SessionSpec, session_id: &str) -> Call {
        let from = self.sim.inner.recorder.len();
        let id = self
            .sim
            .with(|sent, _| sent.start(self.id, &spec, Some(session_id)));
        self.call(id, from)
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
        if let Some(socket) = self.sim.state().sockets.get(&self.id) {
            socket.paused.send_replace(true);
        }
    }

    /// Sent reads the connection again, from where it stopped.
    pub fn resume_reading(&self) {
        let mut state = self.sim.state();
        state.sent.excuse_pongs(Instant::now(), self.id);
        if let Some(socket) = state.sockets.get_mut(&self.id) {
            socket.paused.send_replace(false);
        }
    }

    /// From now on a stream number is free again on this connection once its session has ended, so the
    /// next audio session may get it (by default an ended session's number stays taken).
    pub fn reuse_ended_streams(&self) {
        self.sim.with(|sent, _| sent.reuse_ended_streams(self.id));
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
        self.sim.with(|sent, _| sent.drain(self.id));
    }

    /// Drops the socket with no close frame.
    pub fn drop_abruptly(&self) {
        self.sim.with(|sent, now| sent.drop_abruptly(now, self.id));
    }

    /// Closes with a close frame (1001: Sent going away).
    pub fn close(&self) {
        self.sim.with(|sent, now| sent.close(now, self.id, 1001));
    }

    /// Sent reads this connection slowly from now on: it waits `delay` after each message it reads (zero:
    /// it reads as fast as it can again). The agent's writes back up, but everything is read in the end;
    /// Sent does not drop the agent for pongs still waiting in the socket.
    pub fn read_slowly(&self, delay: Duration) {
        let mut state = self.sim.state();
        state.sent.excuse_pongs(Instant::now(), self.id);
        if let Some(socket) = state.sockets.get_mut(&self.id) {
            socket.read_delay = delay;
        }
    }

    /// Sent goes silent on this connection: no pings, no frames, and it keeps the socket open.
    pub fn mute(&self) {
        self.sim.with(|sent, _| sent.mute(self.id));
    }

    /// Sends text as is on the connection (an invalid frame on purpose, or one of an unknown type).
    pub fn send_raw(&self, text: &str) {
        self.sim.with(|sent, _| sent.send_raw(self.id, None, text));
    }

    /// Whether the connection is still open: neither side has closed or dropped it.
    pub fn is_open(&self) -> bool {
        self.sim
            .read(|sent| sent.conn(self.id).is_some_and(|c| c.open))
    }

    /// Sends a ping and waits for its pong: everything the agent wrote before reading the ping has arrived.
    /// Returns the sequence number of the pong's record.
    pub async fn fence(&self) -> Result<usize> {
        let from = self.sim.inner.recorder.len();
        let ts = now_ms() + 1_000_000_000 + from as i64;
        self.sim.with(|sent, _| sent.ping(self.id, ts));
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
    /// `user.said`.
    pub fn say(&self, text: &str) {
        self.sim
            .with(|sent, _| sent.user_said(&self.id, text, false));
    }

    /// `user.said` with `correction: true`.
    pub fn correct(&self, text: &str) {
        self.sim
            .with(|sent, _| sent.user_said(&self.id, text, true));
    }

    /// A session frame of a type the protocol does not define (yet): counted by both sides.
    pub fn send_unknown(&self, frame_type: &str) {
        let note = "added in a later version";
        self.sim
            .with(|sent, _| sent.send_unknown(&self.id, frame_type, note));
    }

    /// A session frame of a type the protocol does not define, carrying `fields`.
    pub fn send_frame(&self, frame_type: &str, fields: serde_json::Map<String, Value>) {
        self.sim
            .with(|sent, _| sent.send_unknown_with(&self.id, frame_type, fields));
    }

    /// Caller audio on the session's stream.
    pub fn send_audio(&self, samples: &[u8]) {
        self.sim.with(|sent, _| sent.send_audio(&self.id, samples));
    }

    /// Sends the session's `session.start` again, unchanged, on the connection the session is on (a
    /// duplicate: Sent's mistake). What Sent knows of the session does not change.
    pub fn start_again(&self) {
        self.sim.with(|sent, _| sent.start_again(&self.id));
    }

    /// `session.end` with `reason`. A detached session keeps it for the replay of a later resume.
    pub fn end(&self, reason: &str) {
        self.sim.with(|sent, _| sent.end(&self.id, reason));
    }

    /// How Sent answers the tool `name` from now on.
    pub fn plan_tool(&self, name: &str, plan: ToolPlan) {
        self.sim
            .with(|sent, _| sent.plan_tool(&self.id, name, plan));
    }

    /// Answers a held tool call: `None` for success, or an error code.
    pub fn answer(&self, call_ref: &str, name: &str, error: Option<&str>) {
        self.sim
            .with(|sent, _| sent.answer(&self.id, call_ref, name, error));
    }

    /// Answers the session's unanswered `session.resume` now, on the connection it came on (one a
    /// [`ConnPlan::hold_resumes`] holds): `session.resumed` and the replay. Returns false when no resume
    /// of the session waits for an answer.
    pub fn answer_resume(&self) -> bool {
        self.sim.with(|sent, _| sent.answer_resume(&self.id))
    }

    /// Sent will refuse the next resume of this session as if its window had passed.
    pub fn expire_resume(&self) {
        self.sim.with(|sent, _| sent.expire_resume(&self.id));
    }

    /// Sent will answer the next resume claiming it read `received` of the agent's frames instead of the
    /// true count: fewer, as if the rest were lost in the dying socket; or more (up to `i64::MAX`), Sent's
    /// mistake, which leaves its own count as it is.
    pub fn pretend_received(&self, received: u64) {
        self.sim
            .with(|sent, _| sent.pretend_received(&self.id, received));
    }

    /// From now on the agent's audio for the session is only counted, not recorded (a benchmark's flood
    /// would otherwise fill the recorder).
    pub fn count_audio_only(&self) {
        self.sim.with(|sent, _| sent.count_audio_only(&self.id));
    }

    /// The agent's audio messages for the session counted since [`Call::count_audio_only`].
    pub fn audio_counted(&self) -> u64 {
        self.sim.read(|sent| sent.audio_counted(&self.id))
    }

    /// What Sent knows of the session now.
    pub fn state(&self) -> Option<CallState> {
        self.sim
            .read(|sent| sent.call_state(Instant::now(), &self.id))
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
