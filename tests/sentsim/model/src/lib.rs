//! Sent's side of the Sent Voice Agents protocol (`sent.voice.v1`), sans-IO: connections with
//! `connection.ready` and heartbeats, sessions with Sent-side counting, retention, resume and replay, tool
//! results, draining, drops and closes, and the checks Sent makes of what an agent sends.
//!
//! This is the one model of Sent. The simulator (`sentsim`) puts sockets and a clock around it; the
//! protocol core's property tests and its fuzz harness drive it with fake time against the router. In
//! quinn-proto's manner, inputs are `handle_*` (and Sent's own doings, such as [`Sent::start`]), each taking
//! `now` where time matters; outputs are polled: [`Sent::poll_transmit`] for what goes on a connection,
//! [`Sent::poll_event`] for what Sent saw (records and violations), [`Sent::poll_timeout`] for when
//! [`Sent::handle_timeout`] is next due.

mod records;
pub mod wire;

pub use records::{Dir, What};

use sentdm_voice_agents::frames::{
    ConnectionDraining, ConnectionReady, ErrorFrame, ErrorInfo, Frame, Party, Ping, Resume,
    SessionEnd, SessionResumed, SessionResumedAudio, SessionStart, SessionStartAudio, ToolResult,
    UnknownFrame, UserSaid, RETAINED_FRAMES,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use wire::{AgentFrame, Refusal};

/// A connection's number: the caller picks it when the connection opens (the simulator numbers them from 1
/// in the order handshakes are accepted).
pub type ConnId = u32;

/// The agent the official conformance program connects as.
pub const CONFORMANCE_AGENT: &str = "agent_conformance";

/// How Sent behaves, for every connection and session.
#[derive(Debug, Clone)]
pub struct Config {
    /// `connection.ready.protocol_version`.
    pub protocol_version: String,
    /// `connection.ready.heartbeat_interval_ms`: how often Sent pings.
    pub heartbeat_interval_ms: u64,
    /// `connection.ready.max_sessions`, unless a connection's [`ConnSettings`] say otherwise.
    pub max_sessions: usize,
    /// `resume.window_ms` of every session.
    pub window_ms: u64,
    /// Heartbeat intervals without a pong before Sent drops the connection (the protocol does not say how
    /// many Sent allows; three, as the agent's own rule for a silent Sent).
    pub pong_intervals: u32,
    /// How Sent answers a tool no [`Sent::plan_tool`] names.
    pub tools: ToolPlan,
    /// Mixed into every resume token, so that two Sents never issue the same one.
    pub token_salt: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            protocol_version: "0.2.0".into(),
            heartbeat_interval_ms: 15_000,
            max_sessions: 10,
            window_ms: 15_000,
            pong_intervals: 3,
            tools: ToolPlan::Ok,
            token_salt: 0,
        }
    }
}

/// What one connection gets, instead of the defaults.
#[derive(Debug, Clone, Default)]
pub struct ConnSettings {
    /// `max_sessions` for this connection.
    pub max_sessions: Option<usize>,
    /// Wait this long before answering a `session.resume` on this connection.
    pub resume_delay: Duration,
    /// `session.resumed` on this connection carries no `audio`, even for a live audio session (Sent's
    /// mistake).
    pub resume_without_audio: bool,
    /// Sent answers no `session.resume` on this connection until told to ([`Sent::answer_resume`]).
    pub hold_resumes: bool,
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
    /// The caller (`from`); a number of Sent's own when `None`.
    pub from: Option<Party>,
    /// Who was called (`to`); the agent when `None`.
    pub to: Option<Party>,
}

impl SessionSpec {
    /// A resumable text session with no `context`.
    pub fn text() -> SessionSpec {
        SessionSpec {
            kind: Kind::Text,
            resumable: true,
            context: None,
            from: None,
            to: None,
        }
    }

    /// A resumable audio session at `sample_rate` Hz with no `context`.
    pub fn audio(sample_rate: u32) -> SessionSpec {
        SessionSpec {
            kind: Kind::Audio { sample_rate },
            resumable: true,
            context: None,
            from: None,
            to: None,
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
    /// No answer until one is given with [`Sent::answer`].
    Hold,
    /// Sent refuses the `tool.call` itself: an `error` frame with this code, the session's id and
    /// `frame_type: "tool.call"`. The refusal has no effect on the call and no `tool.result` follows, but
    /// Sent read the frame on the session's own connection, so it counts (as every frame read there does).
    Refuse(String),
}

/// How Sent answers the next `session.resume`, whatever the connection's settings say
/// ([`Sent::plan_resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumePlan {
    /// As the connection's settings say.
    Answer,
    /// `session.resumed` without a stream, even for a live audio session.
    NoStream,
    /// Refused with `connection_full`, whatever the connection holds.
    Full,
    /// Refused with `resume_failed`: the call goes to its fallback.
    Failed,
    /// Never answered (until [`Sent::answer_resume`]).
    Hold,
    /// Answered with a stream number another session has on that connection (Sent's mistake); as
    /// [`ResumePlan::Answer`] when no other session has one there.
    CollidingStream,
}

/// A message Sent puts on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message: a frame, or text sent as is.
    Text(String),
    /// A binary audio message.
    Binary(Vec<u8>),
    /// A close frame with this code, then the socket closes.
    Close(u16),
    /// The socket drops with no close frame, as a crashed peer or a cut cable.
    Kill,
}

/// A message for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The connection it goes on.
    pub conn: ConnId,
    /// What goes.
    pub message: Message,
}

/// Something Sent saw or did, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A frame, audio message, open or close, on connection `conn`, of `session` (none: the connection's).
    Record {
        /// The connection.
        conn: ConnId,
        /// Which way it went.
        dir: Dir,
        /// The session it belongs to.
        session: Option<String>,
        /// What happened.
        what: What,
    },
    /// Something the agent did that the protocol forbids.
    Violation {
        /// The connection the agent broke the rule on.
        conn: ConnId,
        /// The session concerned, when the rule is about one.
        session: Option<String>,
        /// Which rule, and how.
        message: String,
    },
}

/// What Sent knows of one connection.
#[derive(Debug, Clone)]
pub struct Conn {
    /// The agent the connection authenticated as.
    pub agent: String,
    /// Neither side has closed or dropped it.
    pub open: bool,
    /// `connection.ready` went out.
    pub ready: bool,
    /// `connection.draining` went out.
    pub draining: bool,
    /// Sent sends nothing on it, pings included.
    pub muted: bool,
    /// `connection.ready.max_sessions`.
    pub max_sessions: usize,
    /// The sessions on it.
    pub sessions: BTreeSet<String>,
    /// Stream numbers taken on it, and by which session.
    pub streams: HashMap<u16, String>,
    /// Stream numbers freed (their session moved away, or ended where numbers are reused), and whose
    /// they were: audio the agent wrote before it knew may still arrive on them.
    former: HashMap<u16, String>,
    settings: ConnSettings,
    pings: HashSet<i64>,
    last_pong: Instant,
    /// A stream number is free again once its session has ended (by default it stays taken).
    reuse_streams: bool,
}

impl Conn {
    /// Whether a new session can start here: open, ready, not draining or muted, with room for one more.
    pub fn usable(&self) -> bool {
        self.open && self.ready && !self.draining && !self.muted && !self.full()
    }

    /// Whether it carries `max_sessions` sessions.
    pub fn full(&self) -> bool {
        self.sessions.len() >= self.max_sessions
    }

    fn free_stream(&self) -> u16 {
        // Each connection numbers its streams from 1, so a session that moves may meet its old number there.
        (1..=u16::MAX)
            .find(|n| !self.streams.contains_key(n))
            .unwrap_or(u16::MAX)
    }
}

/// What Sent knows of one session.
#[derive(Debug, Clone)]
pub struct Session {
    /// Text or audio.
    pub kind: Kind,
    /// The connection it is on; `None` while detached.
    pub conn: Option<ConnId>,
    /// Its stream number on that connection.
    pub stream: Option<u16>,
    /// Every (connection, stream) it ever had.
    pub streams: Vec<(ConnId, u16)>,
    /// The token a resume must present.
    pub token: Option<String>,
    /// When its connection went.
    pub detached_at: Option<Instant>,
    /// Sent's counted frames sent to the agent.
    pub sent: usize,
    /// The agent's counted frames Sent read.
    pub received: usize,
    /// A `session.resume` arrived on this connection and is not answered yet.
    pub resuming: Option<ConnId>,
    /// The `session.end` reason, once it has ended.
    pub ended: Option<String>,
    /// Why Sent gave the call up (its fallback has it): a refused resume, or the agent's clean close.
    pub lost: Option<&'static str>,
    /// Tool calls Sent read and has not answered: (call_ref, name).
    pub pending_tools: VecDeque<(String, String)>,
    expired: bool,
    /// How many counted frames Sent no longer keeps, and the kept ones.
    before: usize,
    kept: VecDeque<String>,
    pretend_received: Option<u64>,
    start: String,
    resume_read: usize,
    /// Connections it was on before its resumes: frames the agent sent there before it moved may still
    /// arrive (no order holds across sockets); they are refused, and the agent's replay brings them again.
    moved_from: BTreeSet<ConnId>,
    tools: HashMap<String, ToolPlan>,
    refuse_next_tool: Option<String>,
    call_refs: HashSet<String>,
    unrecorded_audio: Option<u64>,
}

impl Session {
    /// Neither ended nor given up.
    pub fn live(&self) -> bool {
        self.ended.is_none() && self.lost.is_none()
    }

    /// On a connection with no resume under way: frames and audio reach the agent.
    pub fn attached(&self) -> bool {
        self.conn.is_some() && self.resuming.is_none()
    }

    fn window_passed(&self, now: Instant, window: Duration) -> bool {
        self.detached_at
            .is_some_and(|at| now.saturating_duration_since(at) > window)
    }
}

/// What Sent knows of a session, for scenarios to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallState {
    /// The connection the session is on; `None` while it is detached.
    pub conn: Option<ConnId>,
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
    /// (bad token, window passed, frames no longer kept), the agent closed its connection cleanly, or it
    /// has been detached past its window.
    pub lost: bool,
}

/// Sent.
#[derive(Debug)]
pub struct Sent {
    config: Config,
    conns: BTreeMap<ConnId, Conn>,
    sessions: BTreeMap<String, Session>,
    next_session: u64,
    next_token: u64,
    resume_plans: VecDeque<ResumePlan>,
    /// Resumes answered later: (when, connection, session, received).
    delayed: Vec<(Instant, ConnId, String, usize)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

impl Sent {
    /// Sent with no connection and no session.
    pub fn new(config: Config) -> Sent {
        Sent {
            config,
            conns: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            next_token: 1,
            resume_plans: VecDeque::new(),
            delayed: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// How Sent behaves.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The next message for a connection.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next thing Sent saw or did.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Sent::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.delayed.iter().map(|(at, ..)| *at).min()
    }

    /// Answers the resumes whose delay has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let (due, later) = std::mem::take(&mut self.delayed)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        self.delayed = later;
        for (_, conn, session_id, read) in due {
            let still = self
                .sessions
                .get(&session_id)
                .is_some_and(|s| s.resuming == Some(conn));
            if still {
                self.resumed(conn, &session_id, read, false);
            }
        }
    }

    /// One connection.
    pub fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns.get(&id)
    }

    /// Every connection, oldest first.
    pub fn conns(&self) -> impl DoubleEndedIterator<Item = (ConnId, &Conn)> {
        self.conns.iter().map(|(id, c)| (*id, c))
    }

    /// One session.
    pub fn session(&self, id: &str) -> Option<&Session> {
        self.sessions.get(id)
    }

    /// Every session Sent still knows.
    pub fn sessions(&self) -> impl Iterator<Item = (&str, &Session)> {
        self.sessions.iter().map(|(id, s)| (id.as_str(), s))
    }

    /// What Sent knows of a session now.
    pub fn call_state(&self, now: Instant, id: &str) -> Option<CallState> {
        let window = self.window();
        self.sessions.get(id).map(|s| CallState {
            conn: s.conn,
            stream: s.stream,
            sent: s.sent,
            received: s.received,
            resuming: s.resuming.is_some(),
            ended: s.ended.clone(),
            // Detached past its window with no resume under way: Sent has sent the call to its fallback.
            lost: s.lost.is_some()
                || (s.ended.is_none() && s.resuming.is_none() && s.window_passed(now, window)),
        })
    }

    fn window(&self) -> Duration {
        Duration::from_millis(self.config.window_ms)
    }

    // ----- connections -----

    /// The agent's handshake for `agent` was accepted: connection `id` is open (not ready yet).
    pub fn handle_open(&mut self, now: Instant, id: ConnId, agent: &str, settings: ConnSettings) {
        self.conns.insert(
            id,
            Conn {
                agent: agent.into(),
                open: true,
                ready: false,
                draining: false,
                muted: false,
                max_sessions: settings.max_sessions.unwrap_or(self.config.max_sessions),
                sessions: BTreeSet::new(),
                streams: HashMap::new(),
                former: HashMap::new(),
                settings,
                pings: HashSet::new(),
                last_pong: now,
                reuse_streams: false,
            },
        );
        self.record(id, Dir::ToAgent, None, What::Opened);
    }

    /// `connection.ready`.
    pub fn ready(&mut self, now: Instant, id: ConnId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.ready = true;
        conn.last_pong = now;
        let frame = Frame::ConnectionReady(ConnectionReady {
            protocol_version: self.config.protocol_version.clone(),
            heartbeat_interval_ms: self.config.heartbeat_interval_ms as i64,
            max_sessions: conn.max_sessions as i64,
        });
        self.send_on(id, None, &frame);
    }

    /// A heartbeat on connection `id`: a ping with `ts`, unless the agent left too many unanswered (then
    /// Sent closes with 1008 and returns false; false too once the connection is gone). While Sent reads
    /// slowly or not at all (`reading_behind`), pongs waiting in the socket are no fault of the agent's.
    pub fn heartbeat(&mut self, now: Instant, id: ConnId, ts: i64, reading_behind: bool) -> bool {
        let allowed =
            Duration::from_millis(self.config.heartbeat_interval_ms) * self.config.pong_intervals;
        let Some(conn) = self.conns.get_mut(&id).filter(|c| c.open) else {
            return false;
        };
        if conn.muted {
            return true;
        }
        if reading_behind {
            conn.last_pong = now;
        }
        if now.saturating_duration_since(conn.last_pong) > allowed {
            self.transmits.push_back(Transmit {
                conn: id,
                message: Message::Close(1008),
            });
            return false;
        }
        self.ping(id, ts);
        true
    }

    /// A ping with `ts` on connection `id`, whose pong Sent then expects.
    pub fn ping(&mut self, id: ConnId, ts: i64) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.pings.insert(ts);
        }
        self.send_on(id, None, &Frame::Ping(Ping { ts }));
    }

    /// Pongs missing until now are no fault of the agent's (Sent was not reading).
    pub fn excuse_pongs(&mut self, now: Instant, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.last_pong = now;
        }
    }

    /// `connection.draining`: no new sessions here; the agent should move its sessions. A draining
    /// connection left with no session is closed with 1000.
    pub fn drain(&mut self, id: ConnId) {
        self.send_on(id, None, &Frame::ConnectionDraining(ConnectionDraining {}));
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.draining = true;
        }
        self.close_if_drained(id);
    }

    /// Sent drops the socket with no close frame, and knows at once that the connection is gone.
    pub fn drop_abruptly(&mut self, now: Instant, id: ConnId) {
        self.transmits.push_back(Transmit {
            conn: id,
            message: Message::Kill,
        });
        self.handle_closed(now, id, "dropped by Sent", false);
    }

    /// Sent closes with a close frame of `code`, and knows at once that the connection is gone.
    pub fn close(&mut self, now: Instant, id: ConnId, code: u16) {
        self.transmits.push_back(Transmit {
            conn: id,
            message: Message::Close(code),
        });
        self.handle_closed(now, id, &format!("closed by Sent with {code}"), false);
    }

    /// Sent goes silent on the connection: no pings, no frames, and it keeps the socket open.
    pub fn mute(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.muted = true;
        }
    }

    /// From now on a stream number is free again on the connection once its session has ended.
    pub fn reuse_ended_streams(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.reuse_streams = true;
        }
    }

    /// Sends text as is on the connection (an invalid frame on purpose, or one of an unknown type).
    pub fn send_raw(&mut self, id: ConnId, session: Option<&str>, text: &str) {
        let what = records::of_text(text);
        self.push_out(id, session, Message::Text(text.into()), what);
    }

    /// The connection closed, as `how` says; a clean close by the agent (1000) sends its calls to their
    /// fallback at once, as nothing is left to resume.
    pub fn handle_closed(
        &mut self,
        now: Instant,
        id: ConnId,
        how: &str,
        clean_close_by_agent: bool,
    ) {
        let Some(conn) = self.conns.get_mut(&id).filter(|c| c.open) else {
            return;
        };
        conn.open = false;
        let sessions = std::mem::take(&mut conn.sessions);
        conn.streams.clear();
        self.record(id, Dir::FromAgent, None, What::Closed { how: how.into() });
        for session_id in sessions {
            let Some(sess) = self.sessions.get_mut(&session_id) else {
                continue;
            };
            sess.conn = None;
            sess.stream = None;
            sess.detached_at = Some(now);
            if clean_close_by_agent && sess.lost.is_none() {
                sess.lost = Some("the agent closed its connection cleanly");
            }
        }
        for sess in self.sessions.values_mut() {
            if sess.resuming == Some(id) {
                sess.resuming = None;
            }
        }
    }

    // ----- reading what the agent sends -----

    /// A text message from the agent on connection `id`.
    pub fn handle_text(&mut self, now: Instant, id: ConnId, text: &str) {
        // Once Sent has dropped a connection it reads nothing more from it.
        if !self.conns.get(&id).is_some_and(|c| c.open) {
            return;
        }
        let frame = match wire::decode_from_agent(text) {
            Ok(frame) => frame,
            Err(refusal) => {
                let session = records::session_of(text);
                self.record(
                    id,
                    Dir::FromAgent,
                    session.as_deref(),
                    What::Raw { text: text.into() },
                );
                self.violation(
                    id,
                    session.as_deref(),
                    format!("{}: {}", refusal.code, refusal.message),
                );
                let frame_type = records::type_of(text);
                self.refuse(id, &refusal, session.as_deref(), frame_type.as_deref());
                return;
            }
        };
        match &frame.frame {
            Frame::Pong(pong) => {
                self.record(id, Dir::FromAgent, None, records::of_frame(&frame));
                let ts = pong.ts;
                let known = self.conns.get_mut(&id).is_some_and(|conn| {
                    let known = conn.pings.remove(&ts);
                    if known {
                        conn.last_pong = now;
                    }
                    known
                });
                if !known {
                    self.violation(id, None, format!("a pong with ts {ts} no ping had"));
                }
            }
            Frame::SessionResume(_) => self.read_resume(now, id, frame),
            _ => self.read_session_frame(id, frame),
        }
    }

    fn read_session_frame(&mut self, id: ConnId, frame: AgentFrame) {
        let session_id = frame.session_id().unwrap_or_default().to_string();
        let frame_type = frame.frame_type().to_string();
        let in_flight = self.sessions.get(&session_id).is_some_and(|s| {
            s.live()
                && ((s.conn != Some(id) && s.moved_from.contains(&id))
                    || (s.resuming.is_some() && s.conn == Some(id)))
        });
        let refusal = match self.sessions.get(&session_id) {
            None => Some(("frame_not_allowed", "no such session".to_string(), true)),
            // On the connection the session is still on, the frame may have left before the resume did
            // (no order holds across sockets): refused, the replay brings it. On any other, the agent did
            // not wait for `session.resumed`.
            Some(sess) if sess.resuming.is_some() => Some((
                "frame_not_allowed",
                "sent while the session's resume was unanswered".into(),
                sess.conn != Some(id),
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
            self.record(id, Dir::FromAgent, owner, What::Raw { text });
            if fault {
                self.violation(id, Some(&session_id), format!("{frame_type}: {message}"));
            }
            let refusal = Refusal { code, message };
            self.refuse(id, &refusal, Some(&session_id), Some(&frame_type));
            return;
        }
        self.record(
            id,
            Dir::FromAgent,
            Some(&session_id),
            records::of_frame(&frame),
        );
        let default_tools = self.config.tools.clone();
        let Some(sess) = self.sessions.get_mut(&session_id) else {
            return;
        };
        if wire::counted(&frame_type) {
            sess.received += 1;
        }
        let Frame::ToolCall(call) = &frame.frame else {
            return;
        };
        // A tool.call Sent refuses, on the session's own connection: Sent read it, so it counts (as every
        // frame read on the session's connection does); it is answered with an error.
        sess.call_refs.insert(call.call_ref.clone());
        let plan = match sess.refuse_next_tool.take() {
            Some(code) => ToolPlan::Refuse(code),
            None => sess.tools.get(&call.name).cloned().unwrap_or(default_tools),
        };
        let (call_ref, name) = (call.call_ref.clone(), call.name.clone());
        match plan {
            ToolPlan::Refuse(code) => {
                let frame = Frame::ErrorFrame(ErrorFrame {
                    error: ErrorInfo {
                        message: "Sent's script refuses this tool call".into(),
                        code,
                    },
                    session_id: Some(session_id.clone()),
                    frame_type: Some(frame_type),
                });
                self.send_on(id, Some(&session_id), &frame);
            }
            ToolPlan::Hold => sess.pending_tools.push_back((call_ref, name)),
            ToolPlan::Ok => self.answer(&session_id, &call_ref, &name, None),
            ToolPlan::Fail(code) => self.answer(&session_id, &call_ref, &name, Some(&code)),
        }
    }

    fn read_resume(&mut self, now: Instant, id: ConnId, frame: AgentFrame) {
        let Frame::SessionResume(resume) = &frame.frame else {
            return;
        };
        let session_id = resume.session_id.clone();
        self.record(
            id,
            Dir::FromAgent,
            Some(&session_id),
            records::of_frame(&frame),
        );
        let failed = Refusal {
            code: "resume_failed",
            message: "the token is unknown, used or expired".into(),
        };
        let window = self.window();
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let at_capacity = conn.full();
        let settings = conn.settings.clone();
        let plan = self.resume_plans.pop_front().unwrap_or(ResumePlan::Answer);
        let usable = self.sessions.get(&session_id).is_some_and(|sess| {
            sess.token.as_deref() == Some(resume.token.as_str()) && sess.lost.is_none()
        });
        if !usable {
            self.refuse(id, &failed, Some(&session_id), Some("session.resume"));
            return;
        }
        let Some(sess) = self.sessions.get_mut(&session_id) else {
            return;
        };
        if sess.expired || sess.window_passed(now, window) || plan == ResumePlan::Failed {
            // The token was good but its window has passed: the call has gone to its fallback.
            sess.lost = Some("Sent refused the resume");
            sess.token = None;
            self.refuse(id, &failed, Some(&session_id), Some("session.resume"));
            return;
        }
        if at_capacity || plan == ResumePlan::Full {
            let full = Refusal {
                code: "connection_full",
                message: "the connection already carries max_sessions sessions".into(),
            };
            self.refuse(id, &full, Some(&session_id), Some("session.resume"));
            return;
        }
        let read = usize::try_from(resume.received.max(0)).unwrap_or(usize::MAX);
        if read < sess.before {
            // The agent needs frames Sent no longer keeps.
            sess.lost = Some("Sent no longer keeps the frames the agent did not read");
            sess.token = None;
            self.refuse(id, &failed, Some(&session_id), Some("session.resume"));
            return;
        }
        let sent = sess.sent;
        sess.resuming = Some(id);
        sess.resume_read = read.min(sent);
        if read > sent {
            self.violation(
                id,
                Some(&session_id),
                format!("session.resume says {read} frames were read, but Sent sent {sent}"),
            );
        }
        let read = read.min(sent);
        if settings.hold_resumes || plan == ResumePlan::Hold {
            return;
        }
        if !settings.resume_delay.is_zero() {
            self.delayed
                .push((now + settings.resume_delay, id, session_id, read));
            return;
        }
        let no_stream = settings.resume_without_audio || plan == ResumePlan::NoStream;
        if plan == ResumePlan::CollidingStream {
            self.resumed_on_taken_stream(id, &session_id, read);
        } else {
            self.resumed(id, &session_id, read, no_stream);
        }
    }

    fn resumed_on_taken_stream(&mut self, id: ConnId, session_id: &str, read: usize) {
        let taken = self.conns.get(&id).and_then(|c| {
            c.streams
                .iter()
                .filter(|(_, owner)| *owner != session_id && c.sessions.contains(*owner))
                .map(|(stream, _)| *stream)
                .min()
        });
        self.resume_on(id, session_id, read, Placement::Taken(taken));
    }

    /// Answers a session's unanswered `session.resume` now, on the connection it came on: `session.resumed`
    /// and the replay. Returns false when no resume of the session waits for an answer.
    pub fn answer_resume(&mut self, session_id: &str) -> bool {
        let Some((conn, read)) = self
            .sessions
            .get(session_id)
            .and_then(|s| Some((s.resuming?, s.resume_read)))
        else {
            return false;
        };
        self.resumed(conn, session_id, read, false);
        true
    }

    fn resumed(&mut self, id: ConnId, session_id: &str, read: usize, no_stream: bool) {
        let no_stream = no_stream
            || self
                .conns
                .get(&id)
                .is_some_and(|c| c.settings.resume_without_audio);
        let placement = if no_stream {
            Placement::None
        } else {
            Placement::Free
        };
        self.resume_on(id, session_id, read, placement);
    }

    /// Moves the session onto connection `id`, answers `session.resumed`, and replays what the agent did
    /// not read.
    fn resume_on(&mut self, id: ConnId, session_id: &str, read: usize, placement: Placement) {
        let token = self.token();
        let window_ms = self.config.window_ms as i64;
        let Some(sess) = self.sessions.get_mut(session_id) else {
            return;
        };
        sess.resuming = None;
        let old = sess.conn.take();
        let old_stream = sess.stream.take();
        let ended = sess.ended.is_some();
        let kind = sess.kind;
        if let Some(old) = old {
            sess.moved_from.insert(old);
            if let Some(conn) = self.conns.get_mut(&old) {
                conn.sessions.remove(session_id);
                if let Some(stream) = old_stream {
                    conn.streams.remove(&stream);
                    conn.former.insert(stream, session_id.to_string());
                }
            }
            self.close_if_drained(old);
        }
        let stream = match (kind, ended, placement) {
            (Kind::Audio { .. }, false, Placement::Taken(Some(stream))) => Some(stream),
            (Kind::Audio { .. }, false, Placement::Free | Placement::Taken(None)) => {
                self.conns.get_mut(&id).map(|conn| {
                    let stream = conn.free_stream();
                    conn.streams.insert(stream, session_id.to_string());
                    stream
                })
            }
            _ => None,
        };
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.sessions.insert(session_id.to_string());
        }
        let Some(sess) = self.sessions.get_mut(session_id) else {
            return;
        };
        sess.conn = Some(id);
        sess.stream = stream;
        sess.streams.extend(stream.map(|s| (id, s)));
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
            resume: (!ended).then_some(Resume { token, window_ms }),
            audio: stream.map(|stream| SessionResumedAudio {
                stream: stream as i64,
            }),
        });
        let replay: Vec<String> = sess
            .kept
            .iter()
            .skip(read.saturating_sub(sess.before))
            .cloned()
            .collect();
        self.send_on(id, Some(session_id), &frame);
        for text in replay {
            let what = records::of_text(&text);
            self.push_out(id, Some(session_id), Message::Text(text), what);
        }
        if ended {
            self.forget(session_id);
        }
    }

    /// A binary message from the agent on connection `id`.
    pub fn handle_binary(&mut self, id: ConnId, data: &[u8]) {
        if !self.conns.get(&id).is_some_and(|c| c.open) {
            return;
        }
        let (stream, samples) = match wire::split_audio(data) {
            Ok(audio) => audio,
            Err(refusal) => return self.violation(id, None, refusal.message),
        };
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let session = conn.streams.get(&stream).cloned();
        let former = conn.former.get(&stream).cloned();
        if let Some(count) = session
            .as_ref()
            .and_then(|s| self.sessions.get_mut(s))
            .and_then(|s| s.unrecorded_audio.as_mut())
        {
            *count += 1;
            return;
        }
        let what = What::Audio {
            stream,
            samples: samples.to_vec(),
        };
        self.record(id, Dir::FromAgent, session.as_deref(), what);
        // Audio after the end is the scenario's to judge (it fences what was in flight); so is audio of a
        // session written before it moved or ended, on the number it had (no order holds across sockets).
        if session.is_none() && former.is_none() {
            self.violation(
                id,
                None,
                format!("audio on stream {stream}, which no session has on this connection"),
            );
        }
    }

    // ----- sessions -----

    /// Starts a session on connection `id`, named `session_id` (the next `vs_sim-N` when `None`); returns
    /// its id.
    pub fn start(&mut self, id: ConnId, spec: &SessionSpec, session_id: Option<&str>) -> String {
        self.start_on_stream(id, spec, session_id, None)
    }

    /// [`Sent::start`], with the audio on `stream` whoever has it there (Sent's mistake when another
    /// session does), or on a free one.
    pub fn start_on_stream(
        &mut self,
        id: ConnId,
        spec: &SessionSpec,
        session_id: Option<&str>,
        stream: Option<u16>,
    ) -> String {
        let number = self.next_session;
        self.next_session += 1;
        let session_id = session_id.map_or_else(|| format!("vs_sim-{number}"), str::to_string);
        let token = spec.resumable.then(|| self.token());
        let stream = match spec.kind {
            Kind::Audio { .. } => self.conns.get_mut(&id).map(|conn| {
                let stream = stream.unwrap_or_else(|| conn.free_stream());
                conn.streams.entry(stream).or_insert(session_id.clone());
                stream
            }),
            Kind::Text => None,
        };
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.sessions.insert(session_id.clone());
        }
        let agent = self
            .conns
            .get(&id)
            .map_or_else(|| CONFORMANCE_AGENT.to_string(), |c| c.agent.clone());
        let frame = Frame::SessionStart(SessionStart {
            session_id: session_id.clone(),
            call_id: format!("call_sim-{number}"),
            agent_id: agent.clone(),
            direction: "inbound".into(),
            from: spec.from.clone().unwrap_or_else(|| Party {
                kind: "number".into(),
                value: Some("+14155550100".into()),
            }),
            to: spec.to.clone().unwrap_or(Party {
                kind: "agent".into(),
                value: Some(agent),
            }),
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
                window_ms: self.config.window_ms as i64,
            }),
            started_at: "2026-11-30T10:00:00Z".into(),
        });
        let start = wire::encode(frame.clone());
        self.sessions.insert(
            session_id.clone(),
            Session {
                kind: spec.kind,
                conn: Some(id),
                stream,
                streams: stream.map(|s| (id, s)).into_iter().collect(),
                token,
                detached_at: None,
                sent: 0,
                received: 0,
                resuming: None,
                ended: None,
                lost: None,
                pending_tools: VecDeque::new(),
                expired: false,
                before: 0,
                kept: VecDeque::new(),
                pretend_received: None,
                start,
                resume_read: 0,
                moved_from: BTreeSet::new(),
                tools: HashMap::new(),
                refuse_next_tool: None,
                call_refs: HashSet::new(),
                unrecorded_audio: None,
            },
        );
        self.send_session_frame(&session_id, frame);
        session_id
    }

    /// `user.said` (with `correction: true` when `correction`).
    pub fn user_said(&mut self, session_id: &str, text: &str, correction: bool) {
        let frame = Frame::UserSaid(UserSaid {
            session_id: session_id.into(),
            text: text.into(),
            correction,
        });
        self.send_session_frame(session_id, frame);
    }

    /// A session frame of a type the protocol does not define (yet), with a `note`: counted by both sides.
    pub fn send_unknown(&mut self, session_id: &str, frame_type: &str, note: &str) {
        let mut fields = Map::new();
        fields.insert("note".into(), Value::String(note.into()));
        self.send_unknown_with(session_id, frame_type, fields);
    }

    /// A session frame of a type the protocol does not define, with `fields` beside its `type` and
    /// `session_id`.
    pub fn send_unknown_with(
        &mut self,
        session_id: &str,
        frame_type: &str,
        mut fields: Map<String, Value>,
    ) {
        fields.insert("type".into(), Value::String(frame_type.into()));
        fields.insert("session_id".into(), Value::String(session_id.into()));
        let frame = Frame::Unknown(UnknownFrame {
            frame_type: frame_type.into(),
            session_id: Some(session_id.into()),
            fields,
        });
        self.send_session_frame(session_id, frame);
    }

    /// Caller audio on the session's stream, when it has one and no resume is under way.
    pub fn send_audio(&mut self, session_id: &str, samples: &[u8]) {
        let Some(sess) = self.sessions.get(session_id) else {
            return;
        };
        let (Some(conn), Some(stream), None) = (sess.conn, sess.stream, sess.resuming) else {
            return;
        };
        let what = What::Audio {
            stream,
            samples: samples.to_vec(),
        };
        let message = Message::Binary(wire::audio_message(stream, samples));
        self.push_out(conn, Some(session_id), message, what);
    }

    /// Sends the session's `session.start` again, unchanged, on the connection it is on (a duplicate:
    /// Sent's mistake). What Sent knows of the session does not change.
    pub fn start_again(&mut self, session_id: &str) {
        let Some(sess) = self.sessions.get(session_id) else {
            return;
        };
        let (Some(conn), text) = (sess.conn, sess.start.clone()) else {
            return;
        };
        let what = records::of_text(&text);
        self.push_out(conn, Some(session_id), Message::Text(text), what);
    }

    /// `session.end` with `reason`. A detached session keeps it for the replay of a later resume.
    pub fn end(&mut self, session_id: &str, reason: &str) {
        let Some(sess) = self.sessions.get_mut(session_id).filter(|s| s.live()) else {
            return;
        };
        sess.ended = Some(reason.into());
        let attached = sess.attached();
        let frame = Frame::SessionEnd(SessionEnd {
            session_id: session_id.into(),
            reason: reason.into(),
            duration_ms: 1000,
        });
        self.send_session_frame(session_id, frame);
        // A detached session waits, ended, for a resume that collects its replay.
        if attached {
            self.forget(session_id);
        }
    }

    /// Ends every live attached session with `caller_hung_up` and forgets every session: a clean slate.
    pub fn end_all(&mut self) {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for id in ids {
            if self
                .sessions
                .get(&id)
                .is_some_and(|s| s.live() && s.attached())
            {
                self.end(&id, "caller_hung_up");
            }
            self.sessions.remove(&id);
        }
        for conn in self.conns.values_mut() {
            conn.sessions.clear();
        }
    }

    /// How Sent answers the tool `name` in the session from now on.
    pub fn plan_tool(&mut self, session_id: &str, name: &str, plan: ToolPlan) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.tools.insert(name.into(), plan);
        }
    }

    /// Sent refuses the session's next `tool.call`, whatever its name, with `code`.
    pub fn refuse_next_tool(&mut self, session_id: &str, code: &str) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.refuse_next_tool = Some(code.into());
        }
    }

    /// Answers a tool call: `None` for success, or an error code. A successful `hangup` or `transfer`
    /// ends the session.
    pub fn answer(&mut self, session_id: &str, call_ref: &str, name: &str, error: Option<&str>) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.pending_tools.retain(|(r, _)| r != call_ref);
        }
        let ok = error.is_none();
        let frame = Frame::ToolResult(ToolResult {
            session_id: session_id.into(),
            call_ref: call_ref.into(),
            ok,
            error: error.map(|code| ErrorInfo {
                message: format!("Sent's script fails {name} with {code}"),
                code: code.into(),
            }),
        });
        self.send_session_frame(session_id, frame);
        let ends = match name {
            "hangup" if ok => Some("agent_hung_up"),
            "transfer" if ok => Some("transferred"),
            _ => None,
        };
        if let Some(reason) = ends {
            self.end(session_id, reason);
        }
    }

    /// How Sent answers the next `session.resume` (of any session), before the connection's settings.
    pub fn plan_resume(&mut self, plan: ResumePlan) {
        self.resume_plans.push_back(plan);
    }

    /// Sent will refuse the next resume of this session as if its window had passed.
    pub fn expire_resume(&mut self, session_id: &str) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.expired = true;
        }
    }

    /// Sent will answer the next resume claiming it read `received` of the agent's frames instead of the
    /// true count.
    pub fn pretend_received(&mut self, session_id: &str, received: u64) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.pretend_received = Some(received);
        }
    }

    /// From now on the agent's audio for the session is only counted, not recorded.
    pub fn count_audio_only(&mut self, session_id: &str) {
        if let Some(sess) = self.sessions.get_mut(session_id) {
            sess.unrecorded_audio.get_or_insert(0);
        }
    }

    /// The agent's audio messages for the session counted since [`Sent::count_audio_only`].
    pub fn audio_counted(&self, session_id: &str) -> u64 {
        self.sessions
            .get(session_id)
            .and_then(|s| s.unrecorded_audio)
            .unwrap_or(0)
    }

    // ----- what Sent sends -----

    fn token(&mut self) -> String {
        self.next_token += 1;
        format!(
            "vsr_{:016x}{:016x}",
            self.config.token_salt, self.next_token
        )
    }

    fn refuse(
        &mut self,
        id: ConnId,
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
        self.send_on(id, session, &frame);
    }

    fn send_on(&mut self, id: ConnId, session: Option<&str>, frame: &Frame) {
        let text = wire::encode(frame.clone());
        let what = records::of_text(&text);
        self.push_out(id, session, Message::Text(text), what);
    }

    fn push_out(&mut self, id: ConnId, session: Option<&str>, message: Message, what: What) {
        if !self.conns.get(&id).is_some_and(|c| c.open && !c.muted) {
            return;
        }
        self.record(id, Dir::ToAgent, session, what);
        self.transmits.push_back(Transmit { conn: id, message });
    }

    /// Sends a counted or uncounted frame of a session: counted ones are kept for a replay, and go on the
    /// wire only while the session is attached.
    fn send_session_frame(&mut self, session_id: &str, frame: Frame) {
        let text = wire::encode(frame.clone());
        let Some(sess) = self.sessions.get_mut(session_id) else {
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
            let what = records::of_text(&text);
            self.push_out(id, Some(session_id), Message::Text(text), what);
        }
    }

    /// The session leaves its connection for good; a draining connection left empty closes.
    fn forget(&mut self, session_id: &str) {
        let Some(sess) = self.sessions.get_mut(session_id) else {
            return;
        };
        let conn = sess.conn.take();
        let stream = sess.stream;
        sess.token = None;
        // The stream number stays taken on the connection, so audio the agent sends after the end is still
        // told apart from another session's; unless the connection reuses stream numbers, as Sent may.
        if let Some(id) = conn {
            if let Some(c) = self.conns.get_mut(&id) {
                c.sessions.remove(session_id);
                if let Some(stream) = stream.filter(|_| c.reuse_streams) {
                    if c.streams.get(&stream).map(String::as_str) == Some(session_id) {
                        c.streams.remove(&stream);
                        c.former.insert(stream, session_id.to_string());
                    }
                }
            }
            self.close_if_drained(id);
        }
    }

    fn close_if_drained(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get(&id) {
            if conn.draining && conn.open && conn.sessions.is_empty() {
                self.transmits.push_back(Transmit {
                    conn: id,
                    message: Message::Close(1000),
                });
            }
        }
    }

    fn record(&mut self, conn: ConnId, dir: Dir, session: Option<&str>, what: What) {
        self.events.push_back(Event::Record {
            conn,
            dir,
            session: session.map(str::to_string),
            what,
        });
    }

    fn violation(&mut self, conn: ConnId, session: Option<&str>, message: impl Into<String>) {
        self.events.push_back(Event::Violation {
            conn,
            session: session.map(str::to_string),
            message: message.into(),
        });
    }
}

/// Where a resumed audio session's stream goes.
#[derive(Debug, Clone, Copy)]
enum Placement {
    /// A free number on the connection.
    Free,
    /// No stream (Sent's mistake for a live audio session).
    None,
    /// This number, another session's (Sent's mistake); a free one when `None`.
    Taken(Option<u16>),
}

#[cfg(test)]
mod tests;
