//! One call: the protocol state of a session (counting both ways, the 32 kept frames, the resume hold and
//! the replay, waiting tool calls, the end and the loss) and the task that feeds its events to the guest,
//! one at a time, in the order Sent's frames arrived.
//!
//! The link routes Sent's frames here ([`Session::read`], [`Session::audio`]); the guest's imports come in
//! through [`Calls`]. Neither path takes another lock while holding the session's: a send only queues on
//! the connection's channel, so there is no lock order to get wrong.

use crate::admission::Permit;
use crate::connection::{Outgoing, Sender};
use crate::link::Deployment;
use crate::protocol::{counted, frames, Frame, RETAINED_FRAMES};
use crate::sandbox::wit::{
    Call, Direction, Level, Media, Party, Refused, SessionEnd, ToolError, ToolResult, UnknownFrame,
    UserSaid,
};
use crate::sandbox::{Calls, Event, Instance, Limits, Outcome, TrapKind};
use crate::stats::{LiveSession, Stats};
use sentdm_voice_agents::frames::{
    AgentClear, AgentSay, SessionResume, SessionResumed, SessionStart, ToolCall,
};
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// What the host does with a call whose agent keeps trapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailurePolicy {
    /// End the call with the hangup tool.
    HangUp,
    /// Transfer the call to this party (kind, value), e.g. a person's number.
    Transfer { kind: String, value: String },
}

/// The rules one agent's calls run under.
#[derive(Debug, Clone)]
pub struct CallRules {
    pub limits: Limits,
    /// How many traps within [`CallRules::trap_window`] make the host give up on the agent for the call.
    pub max_traps: usize,
    pub trap_window: Duration,
    pub policy: FailurePolicy,
    /// How long `tool` waits for Sent's answer.
    pub tool_timeout: Duration,
    /// Caller audio queued for the guest beyond this many messages drops the oldest.
    pub audio_queue: usize,
    /// Saved state per call, keys and values together, in bytes.
    pub state_bytes: usize,
}

impl Default for CallRules {
    fn default() -> Self {
        CallRules {
            limits: Limits::default(),
            max_traps: 3,
            trap_window: Duration::from_secs(60),
            policy: FailurePolicy::HangUp,
            tool_timeout: Duration::from_secs(30),
            audio_queue: 50,
            state_bytes: 64 << 10,
        }
    }
}

/// The protocol state of a session, under its lock.
struct Core {
    conn: Option<Sender>,
    stream: Option<u16>,
    token: Option<String>,
    /// Moved to another connection and waiting for `session.resumed`: counted frames are kept, not sent;
    /// audio is dropped.
    resuming: bool,
    /// Sent's counted frames read.
    received: i64,
    /// The session's own counted frames: how many are no longer kept, and the kept ones.
    before: i64,
    kept: VecDeque<Frame>,
    calls: u64,
    waiting: HashMap<String, oneshot::Sender<ToolResult>>,
    ended: bool,
    lost: bool,
}

/// Items for the session's task, in arrival order; caller audio is bounded.
enum Item {
    Event(Event),
    Lost,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    audio: usize,
}

/// One call.
pub struct Session {
    pub id: String,
    call: Call,
    core: Mutex<Core>,
    queue: Mutex<Queue>,
    ready: Notify,
    saved: Mutex<HashMap<String, Vec<u8>>>,
    rules: CallRules,
    stats: Arc<Stats>,
}

impl Session {
    /// A session for `session.start`, on the connection `conn`.
    pub fn new(
        start: &SessionStart,
        conn: Sender,
        rules: CallRules,
        stats: Arc<Stats>,
    ) -> Arc<Session> {
        let media = match &start.audio {
            Some(audio) => Media::Audio(audio.sample_rate.unwrap_or(16000) as u32),
            None => Media::Text,
        };
        let party = |p: &frames::Party| Party {
            kind: p.kind.clone(),
            value: p.value.clone(),
        };
        let call = Call {
            session_id: start.session_id.clone(),
            call_id: start.call_id.clone(),
            agent_id: start.agent_id.clone(),
            direction: if start.direction == "outbound" {
                Direction::Outbound
            } else {
                Direction::Inbound
            },
            from: party(&start.from),
            to: party(&start.to),
            media,
            language: start.language.clone(),
            context: start
                .context
                .as_ref()
                .map(|c| Value::Object(c.clone()).to_string()),
            started_at: start.started_at.clone(),
            max_duration_ms: start.max_duration_ms.map(|ms| ms.max(0) as u64),
        };
        let mut queue = Queue::default();
        queue.items.push_back(Item::Event(Event::SessionStart));
        stats.sessions_started.inc();
        Arc::new(Session {
            id: start.session_id.clone(),
            call,
            core: Mutex::new(Core {
                conn: Some(conn),
                stream: start.audio.as_ref().map(|a| a.stream as u16),
                token: start.resume.as_ref().map(|r| r.token.clone()),
                resuming: false,
                received: 0,
                before: 0,
                kept: VecDeque::new(),
                calls: 0,
                waiting: HashMap::new(),
                ended: false,
                lost: false,
            }),
            queue: Mutex::new(queue),
            ready: Notify::new(),
            saved: Mutex::new(HashMap::new()),
            rules,
            stats,
        })
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, item: Item) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Item::Event(Event::Audio(_)) = item {
            if queue.audio >= self.rules.audio_queue {
                // The guest is behind: drop the oldest audio, never a counted frame.
                if let Some(at) = queue
                    .items
                    .iter()
                    .position(|i| matches!(i, Item::Event(Event::Audio(_))))
                {
                    queue.items.remove(at);
                    queue.audio -= 1;
                    self.stats.audio_dropped.inc();
                }
            }
            queue.audio += 1;
        }
        queue.items.push_back(item);
        drop(queue);
        self.ready.notify_one();
    }

    async fn next(&self) -> Item {
        loop {
            {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(item) = queue.items.pop_front() {
                    if let Item::Event(Event::Audio(_)) = item {
                        queue.audio -= 1;
                    }
                    return item;
                }
            }
            self.ready.notified().await;
        }
    }

    // ----- what the link tells the session -----

    /// The session's stream on its current connection.
    pub fn stream(&self) -> Option<u16> {
        self.core().stream
    }

    /// Whether the session can move to another connection: it has a token and is not moving already.
    pub fn movable(&self) -> bool {
        let core = self.core();
        core.token.is_some() && !core.resuming && !core.ended && !core.lost
    }

    pub fn resuming(&self) -> bool {
        self.core().resuming
    }

    pub fn finished(&self) -> bool {
        let core = self.core();
        core.ended || core.lost
    }

    /// A frame of Sent's for this session, in order: counted, answered to a waiting tool, then queued for
    /// the guest. `session.end` ends the session before anything later is read, so audio the guest sends
    /// from then on is dropped.
    pub fn read(&self, frame: Frame) {
        {
            let mut core = self.core();
            if core.ended || core.lost {
                return;
            }
            if counted(frame.frame_type()) {
                core.received += 1;
            }
            match &frame {
                Frame::ToolResult(result) => {
                    if let Some(waiter) = core.waiting.remove(&result.call_ref) {
                        let _ = waiter.send(tool_result(result));
                    }
                }
                Frame::SessionEnd(_) => {
                    core.ended = true;
                    // Dropping the senders fails every waiting tool call with `ended`.
                    core.waiting.clear();
                }
                _ => {}
            }
        }
        self.stats.frames_in.inc();
        let event = match frame {
            Frame::UserSaid(said) => Event::UserSaid(UserSaid {
                text: said.text,
                correction: said.correction,
            }),
            Frame::ToolResult(result) => Event::ToolResult(tool_result(&result)),
            Frame::SessionEnd(end) => {
                self.stats.sessions_ended.inc();
                Event::SessionEnd(SessionEnd {
                    reason: end.reason,
                    duration_ms: end.duration_ms.max(0) as u64,
                })
            }
            Frame::Unknown(unknown) => Event::Frame(UnknownFrame {
                frame_type: unknown.frame_type,
                json: Value::Object(unknown.fields).to_string(),
            }),
            _ => return,
        };
        self.push(Item::Event(event));
    }

    /// Caller audio (the samples, header stripped).
    pub fn audio(&self, samples: &[u8]) {
        if self.finished() {
            return;
        }
        self.stats.audio_in.inc();
        let samples = samples
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        self.push(Item::Event(Event::Audio(samples)));
    }

    /// The session moves to `conn`: until `session.resumed` arrives there, frames are held and audio
    /// dropped. Returns the `session.resume` to send, or `None` when it cannot move.
    pub fn move_to(&self, conn: Sender) -> Option<String> {
        let mut core = self.core();
        if core.ended || core.lost {
            return None;
        }
        let token = core.token.clone()?;
        core.conn = Some(conn);
        core.resuming = true;
        let resume = Frame::SessionResume(SessionResume {
            session_id: self.id.clone(),
            token,
            received: core.received,
        });
        frames::encode_to_string(&resume).ok()
    }

    /// The session has no connection (its resume was refused with `connection_full`): it stays held until
    /// it is resumed elsewhere, and never sends on the full connection.
    pub fn detach(&self) {
        let mut core = self.core();
        core.conn = None;
        core.resuming = true;
    }

    /// Sent's `session.resumed`: take the next token and stream, then send again what Sent did not read
    /// (or a hangup when Sent needs frames no longer kept). Under the session's lock, so nothing the guest
    /// sends can slip in between.
    pub fn resumed(&self, frame: &SessionResumed) {
        let mut core = self.core();
        core.token = frame.resume.as_ref().map(|r| r.token.clone());
        if let Some(audio) = &frame.audio {
            core.stream = Some(audio.stream as u16);
        }
        core.resuming = false;
        self.stats.resumes.inc();
        // Without a next token the session ended while detached; Sent's replay ends with session.end.
        if frame.resume.is_none() {
            return;
        }
        let again: Vec<Frame> = if frame.received < core.before {
            core.calls += 1;
            vec![Frame::ToolCall(ToolCall {
                session_id: self.id.clone(),
                call_ref: format!("t{}", core.calls),
                name: "hangup".into(),
                arguments: None,
            })]
        } else {
            // A received past what was sent is Sent's mistake: nothing to send again for it.
            let read = ((frame.received - core.before) as usize).min(core.kept.len());
            core.kept.iter().skip(read).cloned().collect()
        };
        core.before = frame.received;
        core.kept.clear();
        for frame in again {
            if let Ok(text) = frames::encode_to_string(&frame) {
                keep(&mut core, frame);
                if let Some(conn) = &core.conn {
                    conn.send(Outgoing::Text(text));
                }
            }
        }
    }

    /// The session cannot be resumed: waiting tool calls fail, later actions are refused, and the guest
    /// hears `on-session-lost` (no `on-session-end` follows).
    pub fn lose(&self) {
        {
            let mut core = self.core();
            if core.ended || core.lost {
                return;
            }
            core.lost = true;
            core.resuming = false;
            core.conn = None;
            core.waiting.clear();
        }
        self.stats.sessions_lost.inc();
        self.push(Item::Lost);
    }

    // ----- sending -----

    fn send(&self, frame: Frame) -> Result<(), Refused> {
        let text = frames::encode_to_string(&frame).map_err(|_| Refused::Invalid)?;
        let mut core = self.core();
        if core.ended || core.lost {
            return Err(Refused::Ended);
        }
        keep(&mut core, frame);
        if !core.resuming {
            if let Some(conn) = &core.conn {
                conn.send(Outgoing::Text(text));
                self.stats.frames_out.inc();
            }
        }
        Ok(())
    }

    fn text_only(&self) -> Result<(), Refused> {
        match self.call.media {
            Media::Text => Ok(()),
            Media::Audio(_) => Err(Refused::WrongMedia),
        }
    }
}

/// Keeps a counted frame for a replay, under the session's lock.
fn keep(core: &mut Core, frame: Frame) {
    if !counted(frame.frame_type()) {
        return;
    }
    core.kept.push_back(frame);
    if core.kept.len() > RETAINED_FRAMES {
        core.kept.pop_front();
        core.before += 1;
    }
}

fn tool_result(result: &frames::ToolResult) -> ToolResult {
    ToolResult {
        call_ref: result.call_ref.clone(),
        ok: result.ok,
        error: result.error.as_ref().map(|e| ToolError {
            code: e.code.clone(),
            message: e.message.clone(),
        }),
    }
}

impl Calls for Session {
    fn info(&self) -> Call {
        self.call.clone()
    }

    fn say(
        &self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Result<(), Refused> {
        self.text_only()?;
        self.send(Frame::AgentSay(AgentSay {
            session_id: self.id.clone(),
            text,
            interruptible,
            last,
        }))
    }

    fn clear(&self) -> Result<(), Refused> {
        self.send(Frame::AgentClear(AgentClear {
            session_id: self.id.clone(),
        }))
    }

    fn send_audio(&self, samples: Vec<i16>) {
        let core = self.core();
        // Dropped after the end, while moving (the stream may be another caller's there), and on text calls.
        let (Some(stream), Some(conn), false, false, false) = (
            core.stream,
            &core.conn,
            core.resuming,
            core.ended,
            core.lost,
        ) else {
            return;
        };
        let mut message = Vec::with_capacity(2 + samples.len() * 2);
        message.extend_from_slice(&stream.to_be_bytes());
        for sample in samples {
            message.extend_from_slice(&sample.to_le_bytes());
        }
        conn.send(Outgoing::Audio(message.into()));
        self.stats.audio_out.inc();
    }

    fn tool(
        &self,
        name: String,
        arguments: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<ToolResult, Refused>> + Send>> {
        let arguments = match arguments
            .as_deref()
            .map(serde_json::from_str::<Map<String, Value>>)
        {
            None => None,
            Some(Ok(map)) => Some(map),
            Some(Err(_)) => return Box::pin(async { Err(Refused::Invalid) }),
        };
        let (answer, waiting) = oneshot::channel();
        let call_ref = {
            let mut core = self.core();
            if core.ended || core.lost {
                return Box::pin(async { Err(Refused::Ended) });
            }
            if core.waiting.len() >= 16 {
                return Box::pin(async { Err(Refused::OverLimit) });
            }
            core.calls += 1;
            format!("t{}", core.calls)
        };
        let frame = Frame::ToolCall(ToolCall {
            session_id: self.id.clone(),
            call_ref: call_ref.clone(),
            name,
            arguments,
        });
        if frames::encode_to_string(&frame).is_err() {
            return Box::pin(async { Err(Refused::Invalid) });
        }
        self.core().waiting.insert(call_ref.clone(), answer);
        if let Err(refused) = self.send(frame) {
            self.core().waiting.remove(&call_ref);
            return Box::pin(async move { Err(refused) });
        }
        let timeout = self.rules.tool_timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, waiting).await {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(_)) => Err(Refused::Ended),
                Err(_) => Err(Refused::TimedOut),
            }
        })
    }

    fn save(&self, key: String, value: Vec<u8>) -> Result<(), Refused> {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        let used: usize = saved
            .iter()
            .filter(|(k, _)| **k != key)
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if used + key.len() + value.len() > self.rules.state_bytes {
            return Err(Refused::OverLimit);
        }
        saved.insert(key, value);
        Ok(())
    }

    fn load(&self, key: &str) -> Option<Vec<u8>> {
        self.saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    fn log_dropped(&self) {
        self.stats.log_dropped.inc();
    }

    fn log(&self, level: Level, message: &str) {
        let session = self.id.as_str();
        match level {
            Level::Trace => tracing::trace!(session, guest = message),
            Level::Debug => tracing::debug!(session, guest = message),
            Level::Info => tracing::info!(session, guest = message),
            Level::Warn => tracing::warn!(session, guest = message),
            Level::Error => tracing::error!(session, guest = message),
        }
    }
}

// ----- the session's task -----

/// Runs the call's guest until the call ends or is lost. `permit` holds the call's room under its caps.
pub async fn run(session: Arc<Session>, deployment: Arc<Deployment>, permit: Permit) {
    session.stats.live_start(
        &session.id,
        LiveSession {
            call: session.call.clone(),
            version: deployment.version,
        },
    );
    // Off the live list and out of its caps however the task ends (even dropped by a runtime shutdown).
    let _serving = Serving {
        session: &session,
        _permit: permit,
    };
    serve(&session, &deployment).await;
}

/// A call being served: listed live, holding its room under its caps, until dropped.
struct Serving<'a> {
    session: &'a Session,
    _permit: Permit,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.session.stats.live_end(&self.session.id);
    }
}

/// A call over a session cap: it gets the failure policy at once, without a guest.
pub async fn refuse(session: Arc<Session>) {
    tracing::warn!(
        session = session.id,
        "over the session cap: applying the failure policy"
    );
    session.stats.sessions_refused.inc();
    give_up(&session).await;
    drain_until_done(&session).await;
}

async fn serve(session: &Arc<Session>, deployment: &Deployment) {
    let calls: Arc<dyn Calls> = session.clone();
    let mut instance = match Instance::new(&deployment.code, calls, session.rules.limits.clone())
        .await
    {
        Ok(instance) => instance,
        Err(error) => {
            tracing::error!(session = session.id, error = %format!("{error:#}"), "the agent could not be instantiated");
            give_up(session).await;
            drain_until_done(session).await;
            return;
        }
    };
    let mut traps: VecDeque<Instant> = VecDeque::new();
    let mut abandoned = false;
    loop {
        let (event, last) = match session.next().await {
            Item::Lost => (Event::SessionLost, true),
            Item::Event(event) => {
                let last = matches!(event, Event::SessionEnd(_));
                (event, last)
            }
        };
        if !abandoned {
            let mut next = Some(event);
            while let Some(event) = next.take() {
                let started = Instant::now();
                let outcome = instance.call(&event).await;
                let took = started.elapsed();
                session.stats.handled(&event, took);
                tracing::trace!(
                    session = session.id,
                    handler = event.name(),
                    took_us = took.as_micros() as u64,
                    "handler"
                );
                match outcome {
                    Outcome::Ok => {}
                    Outcome::Failed(message) => {
                        session.stats.handler_errors.inc();
                        tracing::warn!(
                            session = session.id,
                            handler = event.name(),
                            message,
                            "the handler failed"
                        );
                    }
                    Outcome::Trapped { kind, detail } => {
                        session.stats.trap(kind);
                        tracing::warn!(
                            session = session.id,
                            handler = event.name(),
                            kind = kind.as_str(),
                            detail,
                            "the agent trapped: a fresh instance takes over"
                        );
                        traps.push_back(Instant::now());
                        while traps
                            .front()
                            .is_some_and(|t| t.elapsed() > session.rules.trap_window)
                        {
                            traps.pop_front();
                        }
                        if traps.len() >= session.rules.max_traps {
                            abandoned = true;
                            give_up(session).await;
                        } else if !last {
                            session.stats.restarts.inc();
                            next = Some(Event::Restart(restart_reason(kind)));
                        }
                    }
                }
            }
        }
        if last {
            return;
        }
    }
}

fn restart_reason(kind: TrapKind) -> String {
    kind.as_str().to_string()
}

/// The agent keeps failing on this call: apply its failure policy.
async fn give_up(session: &Arc<Session>) {
    let (name, arguments) = match &session.rules.policy {
        FailurePolicy::HangUp => ("hangup".to_string(), None),
        FailurePolicy::Transfer { kind, value } => (
            "transfer".to_string(),
            Some(serde_json::json!({"to": {"kind": kind, "value": value}}).to_string()),
        ),
    };
    tracing::warn!(
        session = session.id,
        policy = name,
        "the agent keeps trapping: applying its failure policy"
    );
    session.stats.policies_applied.inc();
    let _ = session.tool(name, arguments).await;
}

/// Consumes the session's events without a guest until it ends.
async fn drain_until_done(session: &Arc<Session>) {
    loop {
        match session.next().await {
            Item::Lost | Item::Event(Event::SessionEnd(_)) => return,
            Item::Event(_) => {}
        }
    }
}
