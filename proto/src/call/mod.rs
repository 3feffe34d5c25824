//! One call as a sans-IO state machine: every rule of the protocol that concerns a single session lives
//! here and nowhere else. A [`Call`] takes inputs (a frame or audio from Sent, a guest's request, its
//! connection lost or refusing a resume, a move to another connection, the clock) and pushes [`Output`]s
//! (frames and audio to write on a named connection, answers to tool calls, events for the guest). It
//! never touches a socket, a lock or a task; [`crate::agent`] moves inputs in and outputs out.
//!
//! The rules, each tagged with the scenario (or test) that checks it, so that one grep finds rule,
//! scenario and code:
//!
//! * counting: Sent's counted frames read (`received`), ours sent, saturating, never wrapping;
//! * retention: our last [`RETAINED_FRAMES`] counted frames, for a replay;
//! * the resume hold: between leaving a connection and `session.resumed`, frames are kept, not sent, and
//!   audio is dropped; the replay sends what Sent did not read, once, in order, or a hangup for a gap;
//! * the stream number: only the one Sent gave on the connection the call is on now;
//! * tool calls: each answered exactly once (Sent's result, Sent's refusal, `ended` or `timed-out`);
//! * the end and the loss: once, heard by the guest once, after which nothing of the call is written;
//! * `window_ms`: a detached call is lost when its window has passed;
//! * bounds: the guest's backlog of Sent's frames and caller audio, held frames, audio per message.

use crate::stats::Stats;
use crate::wire::{frames, Frame, MAX_AUDIO_MS_PER_MESSAGE, RETAINED_FRAMES};
use bytes::{Bytes, BytesMut};
use sentdm_voice_agents::frames::{
    ErrorFrame, SessionResume, SessionResumed, SessionStart, ToolCall,
};
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[cfg(test)]
pub(crate) mod fixtures;
mod handover;
mod policy;
#[cfg(test)]
mod tests;

/// A connection to Sent, as the agent's router numbers them.
pub type ConnId = u64;

pub use handover::{Handover, Unadoptable, Unmovable};
pub use policy::{FailurePolicy, Party, PolicyError};

/// One call of an agent: unique for the life of the agent's router, never reused (Sent's session ids are
/// not ours to trust for that).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey(pub u64);

/// The least a `session.resume` waits for Sent's answer before the call is given up as lost (it waits the
/// call's resume window when that is longer: Sent holds the call no longer).
pub const RESUME_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Tool calls of the guest's that may wait for Sent's answer at once (the failure policy's own are not
/// counted: they always go out).
pub const MAX_WAITING_TOOLS: usize = 16;

/// The longest tool name a guest may use (Sent's tools are short snake_case names); longer is
/// `refused::invalid`.
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// The most JSON a guest's tool arguments may hold, checked before they are parsed (parsed JSON takes
/// many times its text on the host); more is `refused::over-limit`. Sent's tools take a few hundred bytes.
pub const MAX_TOOL_ARGUMENTS_BYTES: usize = 16 << 10;

/// What the smallest caller-audio message counts against the call's audio backlog, in bytes (a message
/// is one event, whatever its length): a flood of one-sample messages is bounded in number as well.
pub const MIN_AUDIO_EVENT_BYTES: usize = 64;

/// Tool calls that timed out whose late answer still reaches the guest, at most (the oldest forgotten
/// first): one late answer each, and a repeated one reaches nobody.
pub const MAX_LATE_ANSWERS: usize = 16;

/// What the call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// Text both ways: Sent does speech recognition and synthesis.
    Text,
    /// Raw 16-bit mono PCM both ways at this rate (Hz).
    Audio {
        /// Samples per second, from 1 to 48000 (16000 when `session.start` gives none).
        sample_rate: u32,
    },
}

impl Media {
    /// What `session.start` says the call carries (an audio call's rate is 16000 Hz when Sent gives none,
    /// as the official SDK assumes). Its `session_type` decides: a text call's stray `audio` is not audio.
    pub fn of(start: &SessionStart) -> Media {
        match &start.audio {
            Some(audio) if start.session_type == "audio" => Media::Audio {
                sample_rate: audio
                    .sample_rate
                    .map_or(16000, |r| r.clamp(1, 48_000) as u32),
            },
            _ => Media::Text,
        }
    }

    /// An audio call's samples per second; `None` for a text call.
    pub fn sample_rate(&self) -> Option<u32> {
        match self {
            Media::Text => None,
            Media::Audio { sample_rate } => Some(*sample_rate),
        }
    }

    /// Bytes in `ms` milliseconds of audio, two per 16-bit sample (none for a text call).
    pub fn bytes_per(&self, ms: u32) -> usize {
        match self {
            Media::Text => 0,
            Media::Audio { sample_rate } => (*sample_rate as usize * ms as usize / 1000) * 2,
        }
    }
}

/// The bounds one call runs under.
#[derive(Debug, Clone)]
pub struct CallLimits {
    /// How long a tool call waits for Sent's answer.
    pub tool_timeout: Duration,
    /// Caller audio queued for a busy guest, in milliseconds; past it the oldest is dropped and counted.
    pub audio_backlog_ms: u32,
    /// Sent's frames queued for a busy guest, by count and in bytes of text; past either the call gets its
    /// failure policy.
    pub frame_backlog: usize,
    /// The same backlog in bytes: a `user.said`'s text, an unknown frame's JSON.
    pub frame_backlog_bytes: usize,
    /// The agent's audio queued for Sent, per call, in milliseconds (enforced by the connection's writer).
    pub audio_out_ms: u32,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            tool_timeout: Duration::from_secs(30),
            audio_backlog_ms: 1000,
            frame_backlog: 256,
            frame_backlog_bytes: 1 << 20,
            audio_out_ms: 1000,
        }
    }
}

/// Why the host did not do what the guest asked (the WIT's `refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The call has ended or was lost.
    Ended,
    /// The frame would break the protocol.
    Invalid,
    /// `say` on an audio call.
    WrongMedia,
    /// A bound of the host: too many tool calls waiting, too many frames not yet written.
    OverLimit,
    /// Sent did not answer a tool call in time.
    TimedOut,
}

/// How many traps within how long make the host give up on the agent for a call: the failure policy then
/// (counted by the call's task, which sees the traps).
#[derive(Debug, Clone)]
pub struct TrapWindow {
    max: usize,
    window: Duration,
    at: VecDeque<Instant>,
}

impl TrapWindow {
    /// At most `max` traps within `window`.
    pub fn new(max: usize, window: Duration) -> TrapWindow {
        TrapWindow {
            max,
            window,
            at: VecDeque::new(),
        }
    }

    /// A trap at `now`: whether that makes `max` within the window (the agent cannot serve the call).
    pub fn trapped(&mut self, now: Instant) -> bool {
        self.at.push_back(now);
        while self
            .at
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.at.pop_front();
        }
        self.at.len() >= self.max
    }
}

/// Why a guest's frame does not go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotNow {
    /// Refused, as the guest hears it.
    Refused(Refused),
    /// The call has as many frames unwritten as may be, and Sent is reading its connection: try again
    /// once its writer has written more, or at this moment at the latest (when Sent, if it has written
    /// nothing more, counts as no longer reading).
    Wait(Instant),
}

/// Sent's answer to one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolAnswer {
    /// The `call_ref` of the tool call answered (`t1`, `t2`, …).
    pub call_ref: String,
    /// Whether Sent says the tool succeeded.
    pub ok: bool,
    /// (code, message) when `ok` is false.
    pub error: Option<(String, String)>,
}

impl ToolAnswer {
    /// What the answer counts against the guest's backlog of Sent's frames, in bytes.
    fn bytes(&self) -> usize {
        let error = self
            .error
            .as_ref()
            .map_or(0, |(code, message)| code.len() + message.len());
        self.call_ref.len() + error
    }
}

/// The stream number a `session.start` gives its call on the connection (none for a text call, or one
/// that does not fit the binary header's 16 bits).
pub fn stream_of(start: &SessionStart) -> Option<u16> {
    match Media::of(start) {
        Media::Audio { .. } => start
            .audio
            .as_ref()
            .and_then(|a| u16::try_from(a.stream).ok()),
        Media::Text => None,
    }
}

/// What a caller-audio event counts against the call's audio backlog, in bytes.
fn audio_cost(samples: &[u8]) -> usize {
    samples.len().max(MIN_AUDIO_EVENT_BYTES)
}

/// One event for the guest, in the order Sent's frames arrived.
#[derive(Debug, Clone, PartialEq)]
pub enum GuestEvent {
    /// The call has started: always the first event (but for a call that moved here already started).
    Start,
    /// The call moved here from another host, already started: a fresh instance takes over from that
    /// host's (the first event of a call handed over, [`Handover`]).
    Moved,
    /// One complete utterance of the caller (text calls).
    UserSaid {
        /// What the caller said.
        text: String,
        /// Whether it replaces the previous utterance.
        correction: bool,
    },
    /// Caller audio: 16-bit little-endian samples.
    Audio(Bytes),
    /// Sent's answer to one of the guest's tool calls, a late one (after `timed-out`) included.
    ToolResult(ToolAnswer),
    /// A session frame of a type the host does not know: its type and the whole frame as JSON.
    Unknown {
        /// The frame's `type`.
        frame_type: String,
        /// The whole frame, as JSON.
        json: String,
    },
    /// Sent's `session.end`: the call is over.
    End {
        /// Sent's reason, e.g. `caller_hung_up`.
        reason: String,
        /// How long the call lasted, in milliseconds (a negative value from Sent reads as 0).
        duration_ms: u64,
    },
    /// The call was lost: no resume brought it back, or the host stopped.
    Lost,
}

impl GuestEvent {
    fn is_terminal(&self) -> bool {
        matches!(self, GuestEvent::End { .. } | GuestEvent::Lost)
    }
}

/// What a call asks its I/O to do (the router adds its own: [`crate::router::Output`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Write a frame's text on `conn`, tagged with the call so it can be retracted while still queued.
    Frame {
        /// The connection to write on.
        conn: ConnId,
        /// The call the frame belongs to.
        key: CallKey,
        /// The frame, encoded.
        text: String,
        /// Whether it is one of the call's counted frames (a `session.resume` is not): the writer reports
        /// how many of those it has written ([`crate::Router::handle_written`]).
        counted: bool,
    },
    /// Write a binary audio message on `conn`. At most `backlog` bytes of this call's audio may wait
    /// there: past it the oldest is dropped and counted.
    Audio {
        /// The connection to write on.
        conn: ConnId,
        /// The call the audio belongs to.
        key: CallKey,
        /// The stream number (two bytes, big-endian), then the samples.
        message: Bytes,
        /// How many bytes of this call's audio may wait on the connection.
        backlog: usize,
    },
    /// Drop whatever of the call is still queued on `conn`: it has ended, or left the connection.
    Retract {
        /// The connection the call's messages wait on.
        conn: ConnId,
        /// The call whose messages are dropped.
        key: CallKey,
    },
    /// Answer the guest's tool call `call_ref`; exactly once per call.
    Answer {
        /// The call whose guest made the tool call.
        key: CallKey,
        /// The tool call answered (`t<n>`).
        call_ref: String,
        /// Sent's answer, or why there is none (`ended`, `timed-out`).
        answer: Result<ToolAnswer, Refused>,
    },
    /// The guest has an event waiting ([`crate::Router::poll_event`]).
    Wake {
        /// The call whose guest has an event waiting.
        key: CallKey,
    },
}

/// What handling an input leaves behind: the outputs to carry out, in order, and what was counted. The
/// router owns one and lends it to the call it runs.
#[derive(Debug, Default)]
pub struct Effects {
    /// What to do, in order.
    pub out: VecDeque<Output>,
    /// What the router and its calls have counted so far.
    pub stats: Stats,
}

/// Where a call is, for the router's index of sessions and streams per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Frames flow on `conn`; audio on `stream` (audio calls that have one there).
    Live {
        /// The connection the call is on.
        conn: ConnId,
        /// Its audio stream number there, if it has one.
        stream: Option<u16>,
    },
    /// A `session.resume` is out on `conn`.
    Moving {
        /// The connection the `session.resume` went out on.
        conn: ConnId,
        /// The connection Sent still carries the call on, if it moves off one that is alive (a drained
        /// one): that one must not be closed under it.
        attached: Option<ConnId>,
    },
    /// No connection of ours: waiting to be carried to one.
    Detached {
        /// The connection Sent still carries the call on, as for `Moving`.
        attached: Option<ConnId>,
    },
    /// Ended or lost.
    Done,
}

impl Place {
    /// Whether the call's resume is out on `conn`.
    pub fn moving_to(&self, conn: ConnId) -> bool {
        matches!(self, Place::Moving { conn: to, .. } if *to == conn)
    }

    /// The connection the call is live on, or whose answer it waits for.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Place::Live { conn, .. } | Place::Moving { conn, .. } => Some(*conn),
            _ => None,
        }
    }

    /// The connection Sent still carries the call on while it moves off it.
    pub fn attached(&self) -> Option<ConnId> {
        match self {
            Place::Moving { attached, .. } | Place::Detached { attached } => *attached,
            _ => None,
        }
    }
}

/// The state of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// On `conn`: frames flow both ways.
    Live {
        conn: ConnId,
        stream: Option<u16>,
    },
    /// A `session.resume` went out on `to`: frames are held and audio dropped until `session.resumed` (or a
    /// refusal) arrives there, by `answer_by`.
    Moving {
        to: ConnId,
        answer_by: Instant,
    },
    /// Off every connection of ours (its own was lost, or a resume was refused with `connection_full`):
    /// frames are held, audio dropped, until the router carries it to a connection.
    Detached,
    Ended,
    Lost,
    /// Handed over to another host ([`Call::hand_over`]): nothing of it is read or written here.
    Left,
}

/// One of the call's own counted frames, kept for a replay.
#[derive(Debug, Clone)]
struct Kept {
    text: String,
    /// `n` of a tool call's `call_ref` (`t<n>`).
    tool: Option<u64>,
}

/// Who waits for a tool call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Guest,
    /// The failure policy's transfer: a hangup follows if it fails.
    PolicyTransfer,
    /// The failure policy's hangup, or the hangup a replay gap calls for.
    HostHangup,
}

#[derive(Debug, Clone)]
struct Waiting {
    n: u64,
    owner: Owner,
    deadline: Instant,
}

/// What the call's guest takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guest {
    /// Every event, in order.
    Serving,
    /// Only the terminal event, so that its task knows when to stop (the agent gave up on the call).
    Terminal,
    /// Nothing: its task has stopped, or took the terminal event.
    Gone,
}

/// One call's protocol state.
pub struct Call {
    key: CallKey,
    id: String,
    media: Media,
    state: State,
    /// The latest resume token: a secret, never logged.
    token: Option<String>,
    window: Duration,
    /// While it moves or is detached: the live connection Sent still carries it on (it left a drained one
    /// that is still open), and when Sent stops holding it for a resume (set once no connection carries
    /// it; a refused resume does not move it).
    attached: Option<ConnId>,
    window_ends: Option<Instant>,
    /// Sent's counted frames read.
    received: u64,
    /// Our counted frames no longer kept, the kept ones, how many of all were handed to a connection (the
    /// rest are held for the next resume), and how many are known written (the writer's report, over
    /// `written_base`: what the call's connection had written before it got there, or Sent had read).
    before: u64,
    kept: VecDeque<Kept>,
    handed: u64,
    written: u64,
    written_base: u64,
    /// The last `call_ref` number issued (`t1`, `t2`, …), and the calls waiting for an answer.
    tools_issued: u64,
    waiting: Vec<Waiting>,
    /// The guest's tool calls that timed out, unanswered yet: a late answer reaches the guest once. Each
    /// with whether Sent may still read it as new, and so refuse it: it was unwritten when it timed out, or
    /// a resume has sent it again since.
    timed_out: VecDeque<(u64, bool)>,
    events: VecDeque<GuestEvent>,
    audio_queued: usize,
    frames_queued: (usize, usize),
    guest: Guest,
    /// The failure policy ran.
    gave_up: bool,
    policy: FailurePolicy,
    limits: CallLimits,
}

impl Call {
    /// A call for Sent's `session.start`, live on `conn`, with the `Start` event queued for its guest.
    pub fn new(
        key: CallKey,
        start: &SessionStart,
        conn: ConnId,
        limits: CallLimits,
        policy: FailurePolicy,
        fx: &mut Effects,
    ) -> Call {
        let media = Media::of(start);
        let stream = stream_of(start);
        fx.stats.sessions_started += 1;
        Call {
            key,
            id: start.session_id.clone(),
            media,
            state: State::Live { conn, stream },
            token: start.resume.as_ref().map(|r| r.token.clone()),
            window: window_of(start.resume.as_ref().map(|r| r.window_ms)),
            attached: None,
            window_ends: None,
            received: 0,
            before: 0,
            kept: VecDeque::new(),
            handed: 0,
            written: 0,
            written_base: 0,
            tools_issued: 0,
            timed_out: VecDeque::new(),
            waiting: Vec::new(),
            events: VecDeque::from([GuestEvent::Start]),
            audio_queued: 0,
            frames_queued: (0, 0),
            guest: Guest::Serving,
            gave_up: false,
            policy,
            limits,
        }
    }

    /// The call's key in its router.
    pub fn key(&self) -> CallKey {
        self.key
    }

    /// Sent's id of the session (`vs_…`).
    pub fn session_id(&self) -> &str {
        &self.id
    }

    /// What the call carries, as `session.start` said.
    pub fn media(&self) -> Media {
        self.media
    }

    /// Where the call is.
    pub fn place(&self) -> Place {
        match self.state {
            State::Live { conn, stream } => Place::Live { conn, stream },
            State::Moving { to, .. } => Place::Moving {
                conn: to,
                attached: self.attached,
            },
            State::Detached => Place::Detached {
                attached: self.attached,
            },
            State::Ended | State::Lost | State::Left => Place::Done,
        }
    }

    /// Whether the call has ended or was lost.
    pub fn finished(&self) -> bool {
        matches!(self.state, State::Ended | State::Lost | State::Left)
    }

    /// Whether the call was lost (not ended by Sent).
    pub fn lost(&self) -> bool {
        self.state == State::Lost
    }

    /// Whether the router may forget the call: it is finished and its guest knows (or is gone).
    pub fn forgettable(&self) -> bool {
        self.finished() && self.guest == Guest::Gone
    }

    /// Whether the call can move to another connection now: it has a token and is not moving already.
    pub fn movable(&self) -> bool {
        self.token.is_some() && matches!(self.state, State::Live { .. } | State::Detached)
    }

    /// The tool calls issued so far (the last `call_ref` is `t<this>`).
    pub fn tools_issued(&self) -> u64 {
        self.tools_issued
    }

    /// Sent's counted frames read, and ours sent, for tests and the log.
    pub fn counts(&self) -> (u64, u64) {
        (self.received, self.sent())
    }

    fn sent(&self) -> u64 {
        self.before + self.kept.len() as u64
    }

    // ----- Sent's side -----

    /// A frame of Sent's for this call, arriving on the connection it is live on (the router checks that).
    pub fn read(&mut self, frame: Frame, now: Instant, fx: &mut Effects) {
        if self.finished() {
            return;
        }
        // [scenario: unknown_frames_counted] Every session frame counts but the uncounted types.
        if crate::wire::counted(frame.frame_type()) {
            self.received = self.received.saturating_add(1);
            fx.stats.frames_in += 1;
        }
        match frame {
            Frame::UserSaid(said) => {
                let bytes = said.text.len();
                self.deliver(
                    GuestEvent::UserSaid {
                        text: said.text,
                        correction: said.correction,
                    },
                    bytes,
                    now,
                    fx,
                );
            }
            Frame::ToolResult(result) => {
                let answer = ToolAnswer {
                    call_ref: result.call_ref,
                    ok: result.ok,
                    error: result.error.map(|e| (e.code, e.message)),
                };
                self.tool_answered(answer, now, fx);
            }
            Frame::SessionEnd(end) => {
                fx.stats.sessions_ended += 1;
                let event = GuestEvent::End {
                    reason: end.reason,
                    duration_ms: end.duration_ms.max(0) as u64,
                };
                self.finish(State::Ended, event, fx);
            }
            Frame::Unknown(unknown) => {
                let json = Value::Object(unknown.fields).to_string();
                let bytes = json.len();
                self.deliver(
                    GuestEvent::Unknown {
                        frame_type: unknown.frame_type,
                        json,
                    },
                    bytes,
                    now,
                    fx,
                );
            }
            // The router handles the rest (start, resumed, error); the intake drops the agent's own types.
            _ => {}
        }
    }

    /// Caller audio for this call (samples, header stripped), arriving on the connection it is live on.
    pub fn audio(&mut self, samples: Bytes, fx: &mut Effects) {
        if self.finished() || self.guest != Guest::Serving || self.media == Media::Text {
            return;
        }
        fx.stats.audio_in += 1;
        // Caller audio waiting for a busy guest is bounded by duration: the oldest goes first, counted.
        // Counted frames are never dropped this way. (No scenario: the unit test
        // `caller_audio_backlog_bounded`.)
        let cost = audio_cost(&samples);
        let cap = self.media.bytes_per(self.limits.audio_backlog_ms).max(cost);
        while self.audio_queued + cost > cap {
            let Some(at) = self
                .events
                .iter()
                .position(|e| matches!(e, GuestEvent::Audio(_)))
            else {
                break;
            };
            if let Some(GuestEvent::Audio(dropped)) = self.events.remove(at) {
                self.audio_queued -= audio_cost(&dropped);
                fx.stats.audio_dropped += 1;
            }
        }
        self.audio_queued += cost;
        self.events.push_back(GuestEvent::Audio(samples));
        fx.out.push_back(Output::Wake { key: self.key });
    }

    /// Sent's `session.resumed` on the connection the call is moving to: the next token and stream, then
    /// what Sent did not read is sent again.
    pub fn resumed(
        &mut self,
        conn: ConnId,
        frame: &SessionResumed,
        stream_free: impl Fn(u16) -> bool,
        now: Instant,
        fx: &mut Effects,
    ) {
        if !matches!(self.state, State::Moving { to, .. } if to == conn) {
            return;
        }
        // [scenario: ended_while_detached] Without a next token the call ended while detached: Sent's
        // replay ends with session.end.
        self.token = frame.resume.as_ref().map(|r| r.token.clone());
        if let Some(resume) = &frame.resume {
            self.window = window_of(Some(resume.window_ms));
        }
        // [scenario: resumed_without_stream_sends_no_audio] Only the stream Sent gave on this connection;
        // without one (or one another call holds here) the call's audio is dropped both ways.
        let stream = match self.media {
            Media::Audio { .. } => frame
                .audio
                .as_ref()
                .and_then(|a| u16::try_from(a.stream).ok())
                .filter(|s| *s != 0 && stream_free(*s)),
            Media::Text => None,
        };
        self.state = State::Live { conn, stream };
        self.attached = None;
        self.window_ends = None;
        fx.stats.resumes += 1;
        self.replay(conn, frame.received, now, fx);
    }

    /// [scenario: speech_during_a_resume_is_held, reply_across_a_drop_arrives_once, replay_gap_hangs_up,
    /// huge_received_does_not_wrap] Sends again, in order and once, what Sent did not read; a hangup when
    /// Sent needs frames no longer kept. A `received` past what was sent is Sent's mistake: nothing is sent
    /// again for it.
    fn replay(&mut self, conn: ConnId, received: i64, now: Instant, fx: &mut Effects) {
        let sent = self.sent();
        let read = (received.max(0) as u64).min(sent);
        if read < self.before {
            // Rebased on what Sent has: the hangup is its next frame.
            self.before = read;
            self.kept.clear();
            self.handed = read;
            self.written = read;
            self.written_base = read;
            self.unread_timed_out();
            tracing::warn!(
                session = self.id,
                "Sent needs frames no longer kept: hanging up"
            );
            self.issue_tool("hangup", None, Owner::HostHangup, now, fx);
            return;
        }
        let acknowledged = (read - self.before) as usize;
        self.kept.drain(..acknowledged);
        self.before = read;
        for kept in &self.kept {
            fx.out.push_back(Output::Frame {
                conn,
                key: self.key,
                text: kept.text.clone(),
                counted: true,
            });
            fx.stats.frames_out += 1;
        }
        self.handed = self.sent();
        // Sent has what it read; this connection's writer counts from there.
        self.written = read;
        self.written_base = read;
        self.unread_timed_out();
    }

    /// After a resume, which timed-out tool calls Sent may still refuse: those it is sent again. One it
    /// acknowledged reading was refused then or not at all (a refusal lost with the old connection is not
    /// sent again).
    fn unread_timed_out(&mut self) {
        let kept = &self.kept;
        for (n, unread) in self.timed_out.iter_mut() {
            *unread = kept.iter().any(|k| k.tool == Some(*n));
        }
    }

    /// Sent's `error` naming this call, on `conn`. Returns whether it refused the call's resume with
    /// `connection_full` (the router then looks for another connection).
    pub fn refused(
        &mut self,
        conn: ConnId,
        error: &ErrorFrame,
        now: Instant,
        fx: &mut Effects,
    ) -> bool {
        let code = error.error.code.as_str();
        let about_resume = error.frame_type.as_deref() == Some("session.resume")
            || matches!(code, "resume_failed" | "connection_full");
        match self.state {
            State::Moving { to, .. } if to == conn && about_resume => {
                if code == "connection_full" {
                    // [scenario: connection_full_resumes_elsewhere] The token is still good elsewhere; until
                    // then the call is held and sends nothing on the full connection. Sent keeps it where it
                    // was: on the connection it left, or held for its window, which runs on as it ran.
                    self.state = State::Detached;
                    true
                } else {
                    // [scenario: resume_failed_loses_session]
                    self.lose(fx);
                    false
                }
            }
            State::Live { conn: on, .. }
                if on == conn && error.frame_type.as_deref() == Some("tool.call") =>
            {
                // [scenario: refused_tool_call_answered] Sent refused a tool call: its newest waiting call
                // (a handler waits on one at a time) gets Sent's code at once. Sent read the frame on the
                // call's own connection, so it counts on both sides, as every frame read there does.
                // Sent refuses a tool call as it reads it. A guest's tool call that timed out still
                // unwritten went out before any the guest waits on now: the refusal is the oldest such
                // call's (a late answer, delivered as one). One written before it timed out was read and
                // held, not refused. (Unit tests `refusal_of_a_timed_out_tool_is_its_own`,
                // `refusal_after_a_held_tool_timed_out_is_the_new_ones`; the property run found it.)
                let answer = |n: u64| ToolAnswer {
                    call_ref: call_ref(n),
                    ok: false,
                    error: Some((code.to_string(), error.error.message.clone())),
                };
                let late = self
                    .timed_out
                    .iter()
                    .find(|(n, unwritten)| *unwritten && self.is_handed(*n));
                if let Some(&(late, _)) = late {
                    self.answer_late(late, answer(late), now, fx);
                } else if let Some(at) = self.waiting.iter().rposition(|w| self.is_handed(w.n)) {
                    let waiting = self.waiting.remove(at);
                    self.answer(waiting.owner, answer(waiting.n), true, now, fx);
                }
                false
            }
            _ => false,
        }
    }

    fn is_handed(&self, n: u64) -> bool {
        self.tool_frame_below(n, self.handed)
    }

    fn is_written(&self, n: u64) -> bool {
        self.tool_frame_below(n, self.written)
    }

    /// Whether tool call `n`'s frame is among the first `count` counted frames.
    fn tool_frame_below(&self, n: u64, count: u64) -> bool {
        match self.kept.iter().position(|k| k.tool == Some(n)) {
            Some(at) => self.before + (at as u64) < count,
            // Out of the kept frames: long since handed and written.
            None => true,
        }
    }

    // ----- the router's side -----

    /// The call moves to `conn`: until `session.resumed` arrives there, frames are held and audio dropped.
    /// What is still queued on its old connection is retracted (a replay brings it again), so what was not
    /// known written counts as held; Sent carries the call on that connection until it reads the resume
    /// ([scenario: full_resume_keeps_the_drained_call]: no window runs meanwhile, and the router keeps that
    /// connection open).
    /// Returns false when it cannot move (no token, or it is moving already).
    pub fn move_to(&mut self, conn: ConnId, now: Instant, fx: &mut Effects) -> bool {
        let Some(token) = self.token.clone() else {
            return false;
        };
        match self.state {
            State::Live { conn: old, .. } => {
                fx.out.push_back(Output::Retract {
                    conn: old,
                    key: self.key,
                });
                self.attached = Some(old);
                self.handed = self.written;
            }
            State::Detached => {}
            _ => return false,
        }
        let resume = Frame::SessionResume(SessionResume {
            session_id: self.id.clone(),
            token,
            received: i64::try_from(self.received).unwrap_or(i64::MAX),
        });
        let Ok(text) = frames::encode_to_string(&resume) else {
            return false;
        };
        fx.out.push_back(Output::Frame {
            conn,
            key: self.key,
            text,
            counted: false,
        });
        // [scenario: late_resumed_is_not_left_silent] Sent holds a call for a resume for its window: an answer
        // later than that (or than the host's floor) is Sent's mistake, and is hung up when it comes.
        self.state = State::Moving {
            to: conn,
            answer_by: now + self.window.max(RESUME_ANSWER_TIMEOUT),
        };
        true
    }

    /// The connection `conn` is gone. A call live on it with a token waits, detached, for another one
    /// until its window has passed (what its connection had not written is held again); without a token
    /// it is lost. A call whose resume was out on it is lost (its resume was never answered). A call
    /// moving off it (Sent carried it there) now has its window running. [scenario:
    /// lost_connection_resumes, frames_lost_unwritten_stay_replayable]
    pub fn connection_lost(&mut self, conn: ConnId, now: Instant, fx: &mut Effects) {
        match self.state {
            State::Live { conn: on, .. } if on == conn => {
                if self.token.is_some() {
                    self.state = State::Detached;
                    self.handed = self.written;
                    self.window_ends = Some(now + self.window);
                } else {
                    self.lose(fx);
                }
            }
            State::Moving { to, .. } if to == conn => self.lose(fx),
            _ if self.attached == Some(conn) => {
                self.attached = None;
                self.window_ends = Some(now + self.window);
            }
            _ => {}
        }
    }

    /// The host is stopping: the call is lost (its connection closes with 1000; Sent sends it to its
    /// fallback).
    pub fn stop(&mut self, fx: &mut Effects) {
        self.lose(fx);
    }

    /// The earliest moment something is due: a resume's answer, the resume window, a tool's answer.
    pub fn deadline(&self) -> Option<Instant> {
        let (answer, window) = match self.state {
            State::Moving { answer_by, .. } => (Some(answer_by), self.window_ends),
            State::Detached => (None, self.window_ends),
            _ => (None, None),
        };
        let tools = self.waiting.iter().map(|w| w.deadline).min();
        [answer, window, tools].into_iter().flatten().min()
    }

    /// What is due at `now`.
    pub fn timeout(&mut self, now: Instant, fx: &mut Effects) {
        match self.state {
            // [scenario: unreachable_sent_loses_call_after_window] Sent keeps a call for a resume only for
            // its window: past it the call is lost here too.
            State::Detached | State::Moving { .. }
                if self.window_ends.is_some_and(|end| end <= now) =>
            {
                tracing::info!(session = self.id, "the resume window has passed");
                self.lose(fx);
            }
            State::Moving { answer_by, .. } if answer_by <= now => {
                tracing::warn!(session = self.id, "Sent did not answer the resume");
                self.lose(fx);
            }
            _ => {}
        }
        // [scenario: timed_out_tools_leave_nothing_behind] A tool Sent does not answer in time is answered
        // `timed-out`, and leaves no entry behind.
        while let Some(at) = self.waiting.iter().position(|w| w.deadline <= now) {
            let waiting = self.waiting.remove(at);
            if waiting.owner == Owner::Guest {
                if self.timed_out.len() == MAX_LATE_ANSWERS {
                    self.timed_out.pop_front();
                }
                let unwritten = !self.is_written(waiting.n);
                self.timed_out.push_back((waiting.n, unwritten));
            }
            self.answer_refused(waiting.owner, waiting.n, Refused::TimedOut, now, fx);
        }
    }

    /// Sent's answer to a guest's tool call that timed out: it reaches the guest's handler, once (the call
    /// is forgotten), and no waiting tool.
    fn answer_late(&mut self, n: u64, answer: ToolAnswer, now: Instant, fx: &mut Effects) {
        self.timed_out.retain(|(t, _)| *t != n);
        let bytes = answer.bytes();
        self.deliver(GuestEvent::ToolResult(answer), bytes, now, fx);
    }

    // ----- the guest's side -----

    /// The guest's next event, in arrival order.
    pub fn next_event(&mut self) -> Option<GuestEvent> {
        let event = self.events.pop_front()?;
        match &event {
            GuestEvent::Audio(samples) => self.audio_queued -= audio_cost(samples),
            GuestEvent::UserSaid { .. }
            | GuestEvent::Unknown { .. }
            | GuestEvent::ToolResult(_) => self.unqueue_frame(event_bytes(&event)),
            GuestEvent::End { .. } | GuestEvent::Lost => self.guest = Guest::Gone,
            GuestEvent::Start | GuestEvent::Moved => {}
        }
        Some(event)
    }

    fn unqueue_frame(&mut self, bytes: usize) {
        self.frames_queued.0 -= 1;
        self.frames_queued.1 -= bytes;
    }

    /// A counted frame of the guest's (`agent.say`, `agent.clear`), already encoded and checked by the
    /// codec. `reading_until` is how long Sent counts as reading the call's connection (see
    /// [`Call::room_for_a_frame`]).
    pub fn send(
        &mut self,
        frame: &Frame,
        text: String,
        reading_until: Option<Instant>,
        fx: &mut Effects,
    ) -> Result<(), NotNow> {
        // [scenario: given_up_guest_stays_silent] A guest given up on acts no more: the failure policy
        // has the call.
        if self.finished() || self.gave_up {
            return Err(NotNow::Refused(Refused::Ended));
        }
        if matches!(frame, Frame::AgentSay(_)) && self.media != Media::Text {
            return Err(NotNow::Refused(Refused::WrongMedia));
        }
        self.room_for_a_frame(reading_until)?;
        self.keep_and_hand(text, None, fx);
        Ok(())
    }

    /// [scenario: unread_frames_refused_over_limit, slow_reader_hears_all_speech] Every counted frame
    /// not known written must still be kept for a replay: at most [`RETAINED_FRAMES`] are, queued for the
    /// connection or held while the call moves. Past that, a live call whose connection Sent is reading
    /// (its writer made progress lately: until `reading_until`) waits for room; otherwise the guest is
    /// refused `over-limit`, and nothing is counted.
    fn room_for_a_frame(&self, reading_until: Option<Instant>) -> Result<(), NotNow> {
        if self.sent() - self.written < RETAINED_FRAMES as u64 {
            return Ok(());
        }
        match reading_until {
            Some(until) if matches!(self.state, State::Live { .. }) => Err(NotNow::Wait(until)),
            _ => Err(NotNow::Refused(Refused::OverLimit)),
        }
    }

    /// The writer of the call's connection `conn` has written `frames` of the call's counted frames there
    /// (the shell's report).
    pub fn written(&mut self, conn: ConnId, frames: u64) {
        if matches!(self.state, State::Live { conn: on, .. } if on == conn) {
            let written = self.written_base.saturating_add(frames).min(self.handed);
            self.written = self.written.max(written);
        }
    }

    /// Counts and keeps one of our frames, and writes it if the call is on a connection.
    fn keep_and_hand(&mut self, text: String, tool: Option<u64>, fx: &mut Effects) {
        let live = match self.state {
            State::Live { conn, .. } => Some(conn),
            _ => None,
        };
        if let Some(conn) = live {
            fx.out.push_back(Output::Frame {
                conn,
                key: self.key,
                text: text.clone(),
                counted: true,
            });
            fx.stats.frames_out += 1;
        }
        self.kept.push_back(Kept { text, tool });
        if self.kept.len() > RETAINED_FRAMES {
            self.kept.pop_front();
            self.before += 1;
        }
        if live.is_some() {
            self.handed = self.sent();
        }
    }

    /// The guest's tool call, its arguments as the guest wrote them (JSON text, bounded before it is
    /// parsed): its `call_ref`, to wait on for an [`Output::Answer`].
    pub fn tool(
        &mut self,
        name: String,
        arguments: Option<&str>,
        reading_until: Option<Instant>,
        now: Instant,
        fx: &mut Effects,
    ) -> Result<String, NotNow> {
        use NotNow::Refused as No;
        if self.finished() || self.gave_up {
            return Err(No(Refused::Ended));
        }
        if name.len() > MAX_TOOL_NAME_BYTES {
            return Err(No(Refused::Invalid));
        }
        if arguments.is_some_and(|a| a.len() > MAX_TOOL_ARGUMENTS_BYTES) {
            return Err(No(Refused::OverLimit));
        }
        let arguments = match arguments.map(serde_json::from_str::<Map<String, Value>>) {
            None => None,
            Some(Ok(map)) => Some(map),
            Some(Err(_)) => return Err(No(Refused::Invalid)),
        };
        let guests = self
            .waiting
            .iter()
            .filter(|w| w.owner == Owner::Guest)
            .count();
        if guests >= MAX_WAITING_TOOLS {
            return Err(No(Refused::OverLimit));
        }
        self.room_for_a_frame(reading_until)?;
        let frame = Frame::ToolCall(ToolCall {
            session_id: self.id.clone(),
            call_ref: call_ref(self.tools_issued + 1),
            name,
            arguments,
        });
        let text = frames::encode_to_string(&frame).map_err(|_| No(Refused::Invalid))?;
        self.tools_issued += 1;
        let n = self.tools_issued;
        self.waiting.push(Waiting {
            n,
            owner: Owner::Guest,
            deadline: now + self.limits.tool_timeout,
        });
        self.keep_and_hand(text, Some(n), fx);
        Ok(call_ref(n))
    }

    /// The guest's audio: cut into messages of at most 200 ms, written on the call's stream; dropped (and
    /// counted) after the end, while the call moves, without a stream, and on a text call. Each message is
    /// built once, straight from the samples (16-bit little-endian on the wire).
    pub fn send_audio(&mut self, samples: &[i16], fx: &mut Effects) {
        // [scenario: audio_after_end_not_delivered, speech_during_a_resume_is_held] No audio after the end, none while
        // moving: the old stream may be another caller's on the new connection.
        // A guest given up on plays nothing more.
        let live = match self.state {
            State::Live {
                conn,
                stream: Some(stream),
            } if !self.gave_up => Some((conn, stream)),
            _ => None,
        };
        let Some((conn, stream)) = live else {
            if self.media != Media::Text && !samples.is_empty() {
                fx.stats.audio_out_dropped += 1;
            }
            return;
        };
        let per_message = self.media.bytes_per(MAX_AUDIO_MS_PER_MESSAGE).max(2);
        let backlog = self
            .media
            .bytes_per(self.limits.audio_out_ms)
            .max(per_message);
        // [scenario: oversized_audio_is_cut] Audio past what may wait for the writer would only be
        // dropped there: it is dropped here, oldest first, without being copied.
        let skip = samples.len().saturating_sub(backlog / 2);
        if skip > 0 {
            fx.stats.audio_out_dropped += 1;
        }
        for chunk in samples[skip..].chunks(per_message / 2) {
            let mut message = BytesMut::zeroed(2 + 2 * chunk.len());
            message[..2].copy_from_slice(&stream.to_be_bytes());
            for (to, sample) in message[2..].chunks_exact_mut(2).zip(chunk) {
                to.copy_from_slice(&sample.to_le_bytes());
            }
            fx.out.push_back(Output::Audio {
                conn,
                key: self.key,
                message: message.freeze(),
                backlog,
            });
            fx.stats.audio_out += 1;
        }
    }

    /// The agent cannot serve the call: the guest gets no more events (but the last), and the failure
    /// policy runs once: a transfer, followed by a hangup if it fails; or a hangup.
    pub fn give_up(&mut self, now: Instant, fx: &mut Effects) {
        self.stop_events_but_the_end();
        if self.gave_up || self.finished() {
            return;
        }
        self.gave_up = true;
        fx.stats.policies_applied += 1;
        // The guest's tool calls still waiting end here, so that the policy's own tool call is the only
        // one of the call's that waits (an `error` refusing a `tool.call` names no call, so it can only be
        // that one's).
        self.end_guest_tools(fx);
        match self.policy.clone() {
            FailurePolicy::HangUp => self.issue_tool("hangup", None, Owner::HostHangup, now, fx),
            FailurePolicy::Transfer { to } => {
                let arguments = to.arguments();
                self.issue_tool("transfer", Some(arguments), Owner::PolicyTransfer, now, fx);
            }
        }
    }

    /// The guest's waiting tool calls are answered `ended`; the host's own wait on.
    fn end_guest_tools(&mut self, fx: &mut Effects) {
        for waiting in std::mem::take(&mut self.waiting) {
            if waiting.owner == Owner::Guest {
                fx.out.push_back(Output::Answer {
                    key: self.key,
                    call_ref: call_ref(waiting.n),
                    answer: Err(Refused::Ended),
                });
            } else {
                self.waiting.push(waiting);
            }
        }
    }

    /// The guest takes no more events; only the terminal one, when it comes.
    pub fn stop_events_but_the_end(&mut self) {
        if self.guest == Guest::Serving {
            self.guest = Guest::Terminal;
        }
        let terminal = self.events.iter().find(|e| e.is_terminal()).cloned();
        self.events.clear();
        self.events.extend(terminal);
        self.audio_queued = 0;
        self.frames_queued = (0, 0);
    }

    /// The guest's task has stopped for good: nothing more is queued for it.
    pub fn guest_gone(&mut self) {
        self.guest = Guest::Gone;
        self.events.clear();
        self.audio_queued = 0;
        self.frames_queued = (0, 0);
    }

    // ----- inside -----

    /// A host-issued tool call (the failure policy, a replay gap): not under the guest's cap, always sent.
    fn issue_tool(
        &mut self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        owner: Owner,
        now: Instant,
        fx: &mut Effects,
    ) {
        if self.finished() {
            return;
        }
        let n = self.tools_issued + 1;
        let frame = Frame::ToolCall(ToolCall {
            session_id: self.id.clone(),
            call_ref: call_ref(n),
            name: name.to_string(),
            arguments,
        });
        let Ok(text) = frames::encode_to_string(&frame) else {
            tracing::error!(
                session = self.id,
                tool = name,
                "cannot encode the host's tool call"
            );
            // [scenario: unsendable_policy_transfer_hangs_up] A transfer the codec will not carry (the
            // config and the API refuse such parties; this is the last line) ends in a hangup, never in
            // silence.
            if owner == Owner::PolicyTransfer {
                self.issue_tool("hangup", None, Owner::HostHangup, now, fx);
            }
            return;
        };
        self.tools_issued = n;
        self.waiting.push(Waiting {
            n,
            owner,
            deadline: now + self.limits.tool_timeout,
        });
        self.keep_and_hand(text, Some(n), fx);
    }

    /// Sent's `tool.result`.
    fn tool_answered(&mut self, answer: ToolAnswer, now: Instant, fx: &mut Effects) {
        let n = parse_call_ref(&answer.call_ref);
        let waiting = n.and_then(|n| self.waiting.iter().position(|w| w.n == n));
        if let Some(at) = waiting {
            let waiting = self.waiting.remove(at);
            self.answer(waiting.owner, answer, false, now, fx);
            return;
        }
        match n {
            // [scenario: repeated_tool_result_reaches_nobody] A late answer (the call timed out) still
            // reaches the guest's handler, once; an answer again to a call answered reaches nobody.
            Some(n) if self.timed_out.iter().any(|(t, _)| *t == n) => {
                self.answer_late(n, answer, now, fx);
            }
            Some(n) if n <= self.tools_issued => {
                tracing::debug!(session = self.id, "a tool.result again: ignored");
            }
            // [scenario: unknown_tool_result_ignored] An answer to a call never issued reaches nobody.
            _ => tracing::debug!(session = self.id, "a tool.result for no call: ignored"),
        }
    }

    /// Delivers Sent's answer to whoever waits for it; the guest also hears it as an event.
    fn answer(
        &mut self,
        owner: Owner,
        answer: ToolAnswer,
        refused_by_sent: bool,
        now: Instant,
        fx: &mut Effects,
    ) {
        match owner {
            Owner::Guest => {
                fx.out.push_back(Output::Answer {
                    key: self.key,
                    call_ref: answer.call_ref.clone(),
                    answer: Ok(answer.clone()),
                });
                let bytes = answer.bytes();
                self.deliver(GuestEvent::ToolResult(answer), bytes, now, fx);
            }
            // [scenario: failed_policy_transfer_hangs_up] A failed transfer of the failure policy is
            // followed by a hangup.
            Owner::PolicyTransfer if !answer.ok => {
                tracing::warn!(
                    session = self.id,
                    code = answer.error.as_ref().map(|e| e.0.as_str()),
                    refused_by_sent,
                    "the failure policy's transfer failed: hanging up"
                );
                self.issue_tool("hangup", None, Owner::HostHangup, now, fx);
            }
            Owner::PolicyTransfer => {}
            Owner::HostHangup if !answer.ok => {
                tracing::error!(
                    session = self.id,
                    code = answer.error.as_ref().map(|e| e.0.as_str()),
                    "Sent refused the host's hangup"
                );
            }
            Owner::HostHangup => {}
        }
    }

    /// A tool call ends without Sent's answer (`ended`, `timed-out`).
    fn answer_refused(
        &mut self,
        owner: Owner,
        n: u64,
        refused: Refused,
        now: Instant,
        fx: &mut Effects,
    ) {
        match owner {
            Owner::Guest => fx.out.push_back(Output::Answer {
                key: self.key,
                call_ref: call_ref(n),
                answer: Err(refused),
            }),
            Owner::PolicyTransfer if refused == Refused::TimedOut => {
                tracing::warn!(
                    session = self.id,
                    "the failure policy's transfer went unanswered: hanging up"
                );
                self.issue_tool("hangup", None, Owner::HostHangup, now, fx);
            }
            Owner::PolicyTransfer | Owner::HostHangup => {}
        }
    }

    /// Queues one of Sent's frames for the guest. [scenario: flooded_call_gets_failure_policy] Past the
    /// backlog the guest cannot keep up: the frame is dropped (counted) and the call gets its failure
    /// policy.
    fn deliver(&mut self, event: GuestEvent, bytes: usize, now: Instant, fx: &mut Effects) {
        if self.guest != Guest::Serving {
            return;
        }
        let (count, size) = self.frames_queued;
        if count >= self.limits.frame_backlog || size + bytes > self.limits.frame_backlog_bytes {
            fx.stats.frames_dropped += 1;
            tracing::warn!(
                session = self.id,
                queued = count,
                "the agent cannot keep up with Sent's frames: applying its failure policy"
            );
            self.give_up(now, fx);
            return;
        }
        self.frames_queued = (count + 1, size + bytes);
        self.events.push_back(event);
        fx.out.push_back(Output::Wake { key: self.key });
    }

    fn lose(&mut self, fx: &mut Effects) {
        if self.finished() {
            return;
        }
        fx.stats.sessions_lost += 1;
        tracing::info!(session = self.id, "session lost");
        self.finish(State::Lost, GuestEvent::Lost, fx);
    }

    /// [scenario: resume_failed_loses_session, audio_after_end_not_delivered] The end or the loss, once:
    /// every waiting tool call is answered `ended`, queued caller audio and everything still queued for
    /// Sent is dropped, and the guest hears of it last.
    fn finish(&mut self, state: State, event: GuestEvent, fx: &mut Effects) {
        if let State::Live { conn, .. } | State::Moving { to: conn, .. } = self.state {
            fx.out.push_back(Output::Retract {
                conn,
                key: self.key,
            });
        }
        self.state = state;
        self.end_guest_tools(fx);
        self.waiting.clear();
        let before = self.events.len();
        self.events.retain(|e| !matches!(e, GuestEvent::Audio(_)));
        for _ in self.events.len()..before {
            fx.stats.audio_dropped += 1;
        }
        self.audio_queued = 0;
        match self.guest {
            Guest::Serving => self.events.push_back(event),
            Guest::Terminal => {
                self.events.clear();
                self.events.push_back(event);
            }
            Guest::Gone => return,
        }
        fx.out.push_back(Output::Wake { key: self.key });
    }
}

/// What one of Sent's frames waiting for the guest counts against its backlog, in bytes.
fn event_bytes(event: &GuestEvent) -> usize {
    match event {
        GuestEvent::UserSaid { text, .. } => text.len(),
        GuestEvent::Unknown { json, .. } => json.len(),
        GuestEvent::ToolResult(answer) => answer.bytes(),
        _ => 0,
    }
}

/// How long Sent keeps a call for a resume: the frame's `window_ms` (15 s when it gives none).
fn window_of(window_ms: Option<i64>) -> Duration {
    Duration::from_millis(window_ms.map_or(15_000, |ms| ms.clamp(1, 24 * 3600 * 1000) as u64))
}

/// The `call_ref` the host issues for its `n`th tool call.
pub(crate) fn call_ref(n: u64) -> String {
    format!("t{n}")
}

/// The number of a `call_ref` the host issued: exactly `t<n>`, as written (`t01` is not `t1`).
fn parse_call_ref(text: &str) -> Option<u64> {
    let n: u64 = text.strip_prefix('t')?.parse().ok().filter(|n| *n > 0)?;
    (call_ref(n) == text).then_some(n)
}
