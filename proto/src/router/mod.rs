//! All connections of one agent and the calls on them, as a sans-IO state machine: which connections to
//! dial (and when, with backoff), the one index of sessions and streams per connection, routing Sent's
//! frames and audio to calls, draining, `connection_full`, carrying calls to another connection, retiring
//! connections nobody needs. It owns every [`Call`]; [`super`] wraps it in a lock and moves inputs in
//! (each connection's events in its order, the guests' requests, the clock) and [`Output`]s out.

use crate::backoff;
use crate::call::{
    self, Call, CallKey, CallLimits, ConnId, Effects, FailurePolicy, GuestEvent, Handover, NotNow,
    Place, Refused, Unadoptable, Unmovable,
};
use crate::stats::Stats;
use crate::wire::{self, loggable, Frame};
use bytes::Bytes;
use sentdm_voice_agents::frames::{
    ConnectionReady, ErrorFrame, SessionResumed, SessionStart, ToolCall,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

/// Connections beyond the ones asked for that `connection_full` may add, at most.
pub const EXTRA_CONNECTIONS: usize = 8;

/// Calls one router holds at once, at most, whatever Sent's `max_sessions` (calls given up on count until
/// Sent ends them): a `session.start` past it is hung up at once and never served.
pub const MAX_CALLS: usize = 65_536;

/// Session ids of finished calls remembered, at most, and for how long: a `session.start` for one of them
/// is a duplicate, not a new call (Sent never reuses a session id).
pub const RECENT_SESSIONS: usize = 4096;
/// How long a finished call's session id is remembered, at most (see [`RECENT_SESSIONS`]).
pub const RECENT_FOR: Duration = Duration::from_secs(600);

/// How long an extra connection (or a drained one Sent keeps open) may sit empty before it is closed.
pub const IDLE_RETIRE: Duration = Duration::from_secs(10);

/// How long a connection stays open, empty or not, after a call on it was handed over to another host:
/// Sent carries the call on it until the other host's resume (or this host's own, if none took it)
/// reaches it, and a close with 1000 meanwhile would send the call to its fallback.
pub const HANDED_OVER_HOLD: Duration = Duration::from_secs(30);

/// How long a connection that refused a resume with `connection_full` takes no resume, unless one of its
/// calls leaves sooner (Sent's count of its sessions may be one the router cannot see).
pub const FULL_FOR: Duration = Duration::from_secs(5);

/// Heartbeat intervals of silence after which a connection is dead: nothing heard from Sent, or nothing
/// of what is queued taken by it (`protocol.md` §2.4).
pub const SILENT_INTERVALS: u32 = 3;

/// The longest silence waited for, whatever `heartbeat_interval_ms` says.
const MAX_SILENCE: Duration = Duration::from_secs(24 * 60 * 60);

/// What the shell reports of one connection: when its reader last heard Sent (now, while it is handing
/// what it read to the router: Sent is not silent, the agent is busy), and when its writer last had
/// nothing waiting or wrote something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// The reader's last message from Sent.
    pub heard: Instant,
    /// The writer's last progress: everything queued written, or some of it.
    pub written: Instant,
}

/// What the router asks its I/O to do: its calls' outputs, and its own for the connections.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// What one of its calls asks for: frames and audio to write, retractions, answers, wake-ups.
    Call(call::Output),
    /// The pong for a ping on `conn`: written before any data queued there.
    Pong {
        /// The connection the ping came on.
        conn: ConnId,
        /// The pong frame, encoded.
        text: String,
    },
    /// Open connection `conn` after `delay`.
    Dial {
        /// The id the new connection gets.
        conn: ConnId,
        /// The backoff before dialling (zero: at once).
        delay: Duration,
    },
    /// Close `conn`, for this reason.
    Close {
        /// The connection to close.
        conn: ConnId,
        /// Why, which says how.
        why: Closing,
    },
    /// A new call to serve: its task should start.
    Spawn {
        /// The new call.
        key: CallKey,
        /// Sent's `session.start` for it.
        start: Box<SessionStart>,
    },
}

/// Why the router closes a connection, which says how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Nobody needs it, or the agent stops: a clean close with 1000 (Sent sends what it carries to the
    /// fallback at once).
    Unneeded,
    /// [scenario: silent_sent_reconnects] Sent sent nothing for three heartbeat intervals: it is dead; a
    /// close with 1001 (its calls stay resumable).
    Silent,
    /// Sent took nothing of what was written for three heartbeat intervals: it is dead, and the socket
    /// takes no close frame either; dropped at once.
    Stalled,
}

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Connections to hold at once (more while draining or after `connection_full`).
    pub connections: usize,
    /// What new calls run under, and what happens to a call the agent cannot serve.
    pub limits: CallLimits,
    /// What happens to a new call the agent cannot serve.
    pub policy: FailurePolicy,
}

struct Dialing {
    attempt: u32,
    /// Dialled for calls with nowhere to go (after `connection_full`), beyond the connections asked for.
    extra: bool,
}

struct Conn {
    max_sessions: usize,
    /// One heartbeat interval (at least a second), from `connection.ready`.
    interval: Duration,
    /// What the connection was last seen to do ([`Activity`]): from its events and the shell's reports.
    heard: Instant,
    written: Instant,
    draining: bool,
    /// Sent refused a resume here with `connection_full` while it carried this many calls, at this
    /// moment: no resume goes here until one of them leaves, or [`FULL_FOR`] has passed.
    full: Option<(usize, Instant)>,
    /// Closed by the router, waiting for its end.
    closing: bool,
    extra: bool,
    /// A ping arrived since `connection.ready`: Sent is reachable, the backoff starts over.
    pinged: bool,
    attempt: u32,
    /// Calls live on the connection or moving to it; the streams of the live ones.
    calls: BTreeSet<CallKey>,
    streams: HashMap<u16, CallKey>,
    /// Calls moving off this (drained, still open) connection: Sent carries them here until it reads
    /// their resume elsewhere, so it must not be closed under them.
    attached: BTreeSet<CallKey>,
    empty_since: Option<Instant>,
    /// Not retired before this: a call on it was handed over to another host ([`HANDED_OVER_HOLD`]).
    held_until: Option<Instant>,
}

impl Conn {
    /// Whether a call may be carried here.
    fn takes_calls(&self, now: Instant) -> bool {
        let full = self
            .full
            .is_some_and(|(calls, at)| self.calls.len() >= calls && now < at + FULL_FOR);
        !self.draining && !full && !self.closing && self.calls.len() < self.max_sessions
    }

    /// How long Sent may be silent, or take nothing, before the connection is dead.
    fn silence(&self) -> Duration {
        self.interval
            .saturating_mul(SILENT_INTERVALS)
            .min(MAX_SILENCE)
    }

    /// When the connection is dead unless more is heard, or written, by then.
    fn dead_at(&self) -> Instant {
        self.heard.min(self.written) + self.silence()
    }

    /// Whether nothing holds it open: no call on it, none moving off it.
    fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.attached.is_empty()
    }
}

/// The agent's connections and calls.
pub struct Router {
    config: RouterConfig,
    max_connections: usize,
    conns: BTreeMap<ConnId, Conn>,
    dialing: BTreeMap<ConnId, Dialing>,
    calls: BTreeMap<CallKey, Call>,
    /// Session id → call: the one place a session id is looked up.
    sessions: HashMap<String, CallKey>,
    /// Session ids of calls forgotten lately, oldest first, and how many tool calls each had issued (a
    /// late `session.resumed` for one is hung up with the next).
    recent: VecDeque<(Instant, String)>,
    recent_ids: HashMap<String, u64>,
    /// When each call next has something due, for [`Router::deadline`].
    deadlines: BTreeSet<(Instant, CallKey)>,
    next_conn: ConnId,
    next_key: u64,
    /// The outputs waiting to be polled.
    out: VecDeque<Output>,
    /// What the call being run leaves (its outputs go on to `out` at once), and the counts.
    fx: Effects,
    /// The latest moment an input carried: the router reads no clock of its own.
    now: Instant,
    rng: fastrand::Rng,
    stopped: bool,
}

impl Router {
    /// A router that has dialled nothing yet; `seed` drives the backoff's jitter.
    pub fn new(config: RouterConfig, seed: u64, now: Instant) -> Router {
        let connections = config.connections.max(1);
        Router {
            max_connections: connections + EXTRA_CONNECTIONS,
            config: RouterConfig {
                connections,
                ..config
            },
            conns: BTreeMap::new(),
            dialing: BTreeMap::new(),
            calls: BTreeMap::new(),
            sessions: HashMap::new(),
            recent: VecDeque::new(),
            recent_ids: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_conn: 1,
            next_key: 1,
            out: VecDeque::new(),
            fx: Effects::default(),
            now,
            rng: fastrand::Rng::with_seed(seed),
            stopped: false,
        }
    }

    /// Dials the connections asked for.
    pub fn start(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while self.held() < self.config.connections {
            self.dial(0, false, true);
        }
    }

    /// What new calls run under from now on (live calls keep theirs).
    pub fn set_rules(&mut self, limits: CallLimits, policy: FailurePolicy) {
        self.config.limits = limits;
        self.config.policy = policy;
    }

    /// What the router and its calls have counted.
    pub fn stats(&self) -> Stats {
        Stats {
            connections_open: self.conns.len() as u64,
            ..self.fx.stats
        }
    }

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The earliest moment something is due: [`Router::handle_timeout`] then, after the shell has reported
    /// each connection's [`Activity`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        let calls = self.deadlines.first().map(|(at, _)| *at);
        let open = self.conns.values().filter(|c| !c.closing);
        // A connection asked for stays, empty or not; only the others are retired.
        let idle = open
            .clone()
            .filter(|c| c.extra || c.draining)
            .filter_map(|c| {
                let idle = c.empty_since? + IDLE_RETIRE;
                Some(c.held_until.map_or(idle, |held| idle.max(held)))
            })
            .min();
        let dead = open.clone().map(Conn::dead_at).min();
        // A full connection takes resumes again after a while: the homeless look again then.
        let unfull = open
            .filter_map(|c| c.full)
            .map(|(_, at)| at + FULL_FOR)
            .filter(|_| self.homeless())
            .min();
        [calls, idle, dead, unfull].into_iter().flatten().min()
    }

    /// Connections open and ready, draining ones included.
    #[cfg(test)]
    pub fn ready_connections(&self) -> usize {
        self.conns.values().filter(|c| !c.closing).count()
    }

    /// Calls the router holds (live, moving, detached, or finished and not yet heard by their guest).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// The connection a call is live on.
    pub fn conn_of(&self, key: CallKey) -> Option<ConnId> {
        match self.calls.get(&key)?.place() {
            Place::Live { conn, .. } => Some(conn),
            _ => None,
        }
    }

    /// Where a call is; `None` once the router has forgotten it.
    pub fn place_of(&self, key: CallKey) -> Option<Place> {
        self.calls.get(&key).map(Call::place)
    }

    /// The call of a session, for tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn call(&self, session_id: &str) -> Option<&Call> {
        self.calls.get(self.sessions.get(session_id)?)
    }

    // ----- the connections' events -----

    /// Connection `conn` is open and Sent sent `connection.ready` on it.
    pub fn handle_opened(&mut self, now: Instant, conn: ConnId, ready: &ConnectionReady) {
        self.now = self.now.max(now);
        let Some(dialing) = self.dialing.remove(&conn) else {
            // Not asked for (any more): closed at once.
            self.close(conn, Closing::Unneeded);
            return;
        };
        if self.stopped {
            self.close(conn, Closing::Unneeded);
            return;
        }
        self.fx.stats.connections_opened += 1;
        let interval = u64::try_from(ready.heartbeat_interval_ms)
            .unwrap_or(1000)
            .max(1000);
        self.conns.insert(
            conn,
            Conn {
                max_sessions: usize::try_from(ready.max_sessions)
                    .unwrap_or(1)
                    .clamp(1, 100_000),
                interval: Duration::from_millis(interval),
                heard: now,
                written: now,
                draining: false,
                full: None,
                closing: false,
                extra: dialing.extra,
                pinged: false,
                attempt: dialing.attempt,
                calls: BTreeSet::new(),
                streams: HashMap::new(),
                attached: BTreeSet::new(),
                empty_since: Some(now),
                held_until: None,
            },
        );
        self.place(now);
    }

    /// Dialling `conn` failed, for a reason worth retrying.
    pub fn handle_dial_failed(&mut self, now: Instant, conn: ConnId) {
        self.now = self.now.max(now);
        let Some(dialing) = self.dialing.remove(&conn) else {
            return;
        };
        if self.stopped {
            return;
        }
        if self.held() < self.config.connections {
            self.dial(dialing.attempt + 1, false, false);
        } else if dialing.extra && self.homeless() {
            self.dial(dialing.attempt + 1, true, false);
        }
        self.place(now);
    }

    /// A `ping` on `conn`: the pong is owed at once, and the connection has proved itself good.
    /// [scenario: ready_ping_pong]
    pub fn handle_ping(&mut self, now: Instant, conn: ConnId, ts: i64) {
        self.now = self.now.max(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.heard = c.heard.max(now);
        // [scenario: flapping_connection_backs_off] Only a ping on a ready connection starts its backoff
        // over.
        c.pinged = true;
        c.attempt = 0;
        self.out.push_back(Output::Pong {
            conn,
            text: wire::pong(ts),
        });
    }

    /// A frame from Sent on `conn` (read by the intake: valid, and of Sent's).
    pub fn handle_frame(&mut self, now: Instant, conn: ConnId, frame: Frame) {
        self.now = self.now.max(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.heard = c.heard.max(now);
        match frame {
            Frame::ConnectionReady(_) => {
                tracing::debug!(conn, "a second connection.ready: ignored");
            }
            Frame::ConnectionDraining(_) => self.drain(conn, now),
            Frame::ErrorFrame(error) => self.error(conn, error, now),
            Frame::SessionStart(start) => self.start_call(conn, start),
            Frame::SessionResumed(resumed) => self.resumed(conn, resumed, now),
            frame => {
                let Some(session_id) = frame.session_id() else {
                    tracing::debug!(
                        conn,
                        frame_type = loggable(frame.frame_type()),
                        "a connection frame of an unknown type: ignored"
                    );
                    return;
                };
                // [scenario: drain_moves_sessions] A call is read only on the connection it is live on: a
                // call that moved is read where it is now, and Sent replays there what it did not get.
                let Some(key) = self.live_on(conn, session_id) else {
                    return;
                };
                self.with_call(key, |call, fx| call.read(frame, now, fx));
            }
        }
    }

    /// Caller audio on `conn`, by its stream number on that connection.
    /// [scenario: concurrent_sessions_isolated]
    pub fn handle_audio(&mut self, now: Instant, conn: ConnId, stream: u16, samples: Bytes) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        // Audio runs fifty messages a second per call: the clock moves by the timers, not by these.
        c.heard = c.heard.max(now);
        let Some(key) = c.streams.get(&stream).copied() else {
            return;
        };
        self.with_call(key, |call, fx| call.audio(samples, fx));
    }

    /// What the shell saw of `conn`'s reader and writer (reported before each
    /// [`Router::handle_timeout`], and before a guest's frame).
    pub fn handle_activity(&mut self, now: Instant, conn: ConnId, activity: Activity) {
        self.now = self.now.max(now);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.heard = c.heard.max(activity.heard);
            c.written = c.written.max(activity.written);
        }
    }

    /// `conn`'s writer has written `frames` of call `key`'s counted frames there, in all.
    pub fn handle_written(&mut self, now: Instant, conn: ConnId, key: CallKey, frames: u64) {
        self.now = self.now.max(now);
        self.with_call(key, |call, _| call.written(conn, frames));
    }

    /// Connection `conn` has ended: its calls wait for another one (or are lost), and it is replaced.
    pub fn handle_closed(&mut self, now: Instant, conn: ConnId) {
        self.now = self.now.max(now);
        let Some(c) = self.conns.remove(&conn) else {
            // A dial that never opened.
            self.handle_dial_failed(now, conn);
            return;
        };
        for key in c.calls.iter().chain(&c.attached) {
            self.with_call(*key, |call, fx| call.connection_lost(conn, now, fx));
        }
        // [scenario: close_right_after_ready_keeps_dialling] A connection that dies is replaced, with a
        // backoff that grows until a connection proves itself with a ping.
        if !self.stopped && !c.draining && !c.closing && self.held() < self.config.connections {
            let attempt = if c.pinged { 0 } else { c.attempt + 1 };
            self.dial(attempt, false, false);
        }
        self.place(now);
    }

    /// What is due at `now`: calls' deadlines, dead connections, connections nobody needs.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.with_call(key, |call, fx| call.timeout(now, fx));
        }
        self.bury(now);
        self.retire(now);
        // A refusal's `connection_full` is believed only for a while.
        for c in self.conns.values_mut() {
            c.full = c.full.filter(|(_, at)| now < *at + FULL_FOR);
        }
        self.place(now);
    }

    /// Every connection closes with 1000 (Sent sends the calls to their fallback at once) and every call
    /// is lost.
    pub fn stop(&mut self, now: Instant) {
        self.now = self.now.max(now);
        self.stopped = true;
        self.dialing.clear();
        let keys: Vec<CallKey> = self.calls.keys().copied().collect();
        for key in keys {
            if let Some(session) = self.calls.get(&key).map(|c| c.session_id().to_string()) {
                tracing::info!(session, "stopping: the call goes to its fallback");
            }
            self.with_call(key, |call, fx| call.stop(fx));
        }
        for (conn, c) in std::mem::take(&mut self.conns) {
            if !c.closing {
                self.out.push_back(Output::Close {
                    conn,
                    why: Closing::Unneeded,
                });
            }
        }
    }

    // ----- the guests' requests -----

    /// The next event for call `key`'s guest, in arrival order; `None` when none waits or the call is
    /// forgotten.
    pub fn poll_event(&mut self, key: CallKey) -> Option<GuestEvent> {
        self.with_call(key, |call, _| call.next_event()).flatten()
    }

    /// A counted frame of the guest's (`agent.say`, `agent.clear`), encoded by the codec. The shell
    /// reports the call's connection ([`Router::handle_activity`], [`Router::handle_written`]) first.
    pub fn handle_send(
        &mut self,
        now: Instant,
        key: CallKey,
        frame: &Frame,
        text: String,
    ) -> Result<(), NotNow> {
        self.now = self.now.max(now);
        let reading = self.reading_until(key, now);
        self.with_call(key, |call, fx| call.send(frame, text, reading, fx))
            .unwrap_or(Err(NotNow::Refused(Refused::Ended)))
    }

    /// The guest's tool call, its arguments as JSON text: the `call_ref` its answer will carry.
    pub fn handle_tool(
        &mut self,
        now: Instant,
        key: CallKey,
        name: String,
        arguments: Option<&str>,
    ) -> Result<String, NotNow> {
        self.now = self.now.max(now);
        let reading = self.reading_until(key, now);
        self.with_call(key, |call, fx| call.tool(name, arguments, reading, now, fx))
            .unwrap_or(Err(NotNow::Refused(Refused::Ended)))
    }

    /// The guest's audio for call `key`, sent as [`Call::send_audio`] says.
    pub fn handle_send_audio(&mut self, key: CallKey, samples: &[i16]) {
        self.with_call(key, |call, fx| call.send_audio(samples, fx));
    }

    /// The agent cannot serve the call: its failure policy.
    pub fn handle_give_up(&mut self, now: Instant, key: CallKey) {
        self.now = self.now.max(now);
        self.with_call(key, |call, fx| call.give_up(now, fx));
    }

    /// The call's task has stopped: the call is forgotten once it is finished.
    pub fn handle_guest_gone(&mut self, key: CallKey) {
        self.with_call(key, |call, _| call.guest_gone());
    }

    // ----- calls moving between hosts -----

    /// Takes call `key` out for another host ([`Call::hand_over`]): nothing of it is read or written here
    /// afterwards, and it is forgotten (its session id remembered, so that its frames here are ignored).
    pub fn hand_over(&mut self, now: Instant, key: CallKey) -> Result<Handover, Unmovable> {
        self.now = self.now.max(now);
        let conn = self.conn_of(key);
        let handover = self
            .with_call(key, |call, fx| call.hand_over(fx))
            .unwrap_or(Err(Unmovable::NotLive))?;
        if let Some(c) = conn.and_then(|conn| self.conns.get_mut(&conn)) {
            c.held_until = Some(now + HANDED_OVER_HOLD);
        }
        tracing::info!(session = handover.session_id, "call handed over");
        Ok(handover)
    }

    /// A call another host handed over ([`Call::adopted`]): carried to a connection with a
    /// `session.resume` as soon as one can take it; its guest's task is the shell's to start (with the key
    /// returned). A call this router handed over itself may come back.
    pub fn adopt(&mut self, now: Instant, handover: Handover) -> Result<CallKey, Unadoptable> {
        self.now = self.now.max(now);
        if self.stopped || self.sessions.contains_key(&handover.session_id) {
            return Err(Unadoptable::Duplicate);
        }
        if self.calls.len() >= MAX_CALLS {
            return Err(Unadoptable::Invalid);
        }
        let key = CallKey(self.next_key);
        let call = Call::adopted(
            key,
            handover,
            self.config.limits.clone(),
            self.config.policy.clone(),
            now,
        )?;
        self.next_key += 1;
        self.recent_ids.remove(call.session_id());
        self.fx.stats.adopted += 1;
        tracing::info!(
            session = call.session_id(),
            "call adopted from another host"
        );
        let place = call.place();
        let deadline = call.deadline();
        self.sessions.insert(call.session_id().to_string(), key);
        self.calls.insert(key, call);
        self.reindex(key, Place::Done, place, None, deadline);
        self.out.push_back(Output::Call(call::Output::Wake { key }));
        self.place(now);
        Ok(key)
    }

    // ----- inside -----

    /// Connections open (not closing, not draining) and being dialled.
    fn held(&self) -> usize {
        let open = self
            .conns
            .values()
            .filter(|c| !c.draining && !c.closing)
            .count();
        open + self.dialing.len()
    }

    /// Whether a call waits with no connection to go to.
    fn homeless(&self) -> bool {
        self.calls
            .values()
            .any(|c| matches!(c.place(), Place::Detached { .. }))
    }

    /// Dials a connection: at once, or after the backoff of `attempt`.
    fn dial(&mut self, attempt: u32, extra: bool, at_once: bool) {
        if self.stopped || self.conns.len() + self.dialing.len() >= self.max_connections {
            return;
        }
        let delay = if at_once {
            Duration::ZERO
        } else {
            backoff::delay(attempt, self.rng.f64())
        };
        let conn = self.next_conn;
        self.next_conn += 1;
        self.dialing.insert(conn, Dialing { attempt, extra });
        tracing::info!(
            conn,
            attempt,
            in_ms = delay.as_millis() as u64,
            extra,
            "connecting"
        );
        self.out.push_back(Output::Dial { conn, delay });
    }

    /// The live call of `session_id` on `conn`, if it is live there.
    fn live_on(&self, conn: ConnId, session_id: &str) -> Option<CallKey> {
        let key = *self.sessions.get(session_id)?;
        match self.calls.get(&key)?.place() {
            Place::Live { conn: on, .. } if on == conn => Some(key),
            _ => None,
        }
    }

    /// Sent's `session.start`.
    fn start_call(&mut self, conn: ConnId, start: SessionStart) {
        if self.stopped {
            return;
        }
        // [scenario: duplicate_session_start_ignored] A session id already here is not a new call.
        self.forget_old(RECENT_SESSIONS);
        if self.sessions.contains_key(&start.session_id)
            || self.recent_ids.contains_key(&start.session_id)
        {
            tracing::warn!(
                conn,
                session = start.session_id,
                "a session.start for a session already here: ignored"
            );
            self.fx.stats.frames_invalid += 1;
            return;
        }
        // A call nobody serves is still hung up, so that Sent does not wait on it. (Unit tests
        // `a_start_past_the_calls_held_is_hung_up`, `a_start_on_a_taken_stream_is_hung_up`.)
        if self.calls.len() >= MAX_CALLS {
            tracing::warn!(
                conn,
                session = start.session_id,
                calls = self.calls.len(),
                "a session.start past the calls one agent holds: hanging it up"
            );
            self.fx.stats.frames_invalid += 1;
            self.hang_up_stray(conn, &start.session_id, 0);
            self.remember(start.session_id, 1);
            return;
        }
        let stream = call::stream_of(&start);
        if let (Some(stream), Some(c)) = (stream, self.conns.get(&conn)) {
            if c.streams.contains_key(&stream) {
                tracing::warn!(
                    conn,
                    session = start.session_id,
                    stream,
                    "a session.start with a stream another call has here: hanging it up"
                );
                self.fx.stats.frames_invalid += 1;
                self.hang_up_stray(conn, &start.session_id, 0);
                self.remember(start.session_id, 1);
                return;
            }
        }
        let key = CallKey(self.next_key);
        self.next_key += 1;
        let call = Call::new(
            key,
            &start,
            conn,
            self.config.limits.clone(),
            self.config.policy.clone(),
            &mut self.fx,
        );
        tracing::info!(
            conn,
            session = start.session_id,
            session_type = start.session_type,
            "session started"
        );
        let place = call.place();
        self.sessions.insert(start.session_id.clone(), key);
        self.calls.insert(key, call);
        self.reindex(key, Place::Done, place, None, None);
        self.out.push_back(Output::Spawn {
            key,
            start: Box::new(start),
        });
        self.out.push_back(Output::Call(call::Output::Wake { key }));
    }

    fn resumed(&mut self, conn: ConnId, resumed: SessionResumed, now: Instant) {
        let key = self.sessions.get(&resumed.session_id).copied();
        let call = key.and_then(|key| self.calls.get(&key));
        match call {
            Some(call) if call.place().moving_to(conn) => {}
            // A second one, or one for a call that waits elsewhere: Sent's mistake, and the call is ours
            // still. Ignored.
            Some(call) if !call.finished() => {
                tracing::warn!(
                    conn,
                    session = resumed.session_id,
                    "a session.resumed no resume of the call waits for here: ignored"
                );
                return;
            }
            // [scenario: late_resumed_is_not_left_silent] Sent carries a call here that no call of ours
            // serves: one given up after an unanswered resume, or one never asked for. Nobody would serve
            // it: it is hung up.
            _ => {
                // After every call_ref the session has had: its call's, and an earlier stray hangup's (a
                // call_ref is unique within a session).
                let issued = call.map_or(0, Call::tools_issued).max(
                    self.recent_ids
                        .get(&resumed.session_id)
                        .copied()
                        .unwrap_or(0),
                );
                tracing::warn!(
                    conn,
                    session = resumed.session_id,
                    "Sent resumed a session no call waits for: hanging it up"
                );
                self.hang_up_stray(conn, &resumed.session_id, issued);
                self.remember(resumed.session_id, issued + 1);
                return;
            }
        }
        let Some(key) = key else { return };
        let stream_free = match resumed.audio.as_ref().map(|a| a.stream) {
            Some(stream) => u16::try_from(stream).is_ok_and(|s| {
                self.conns
                    .get(&conn)
                    .is_some_and(|c| c.streams.get(&s).is_none_or(|k| *k == key))
            }),
            None => false,
        };
        if resumed.audio.is_some() && !stream_free {
            tracing::warn!(
                conn,
                session = resumed.session_id,
                "session.resumed with a stream another call has here"
            );
        }
        tracing::info!(conn, session = resumed.session_id, "session resumed");
        self.with_call(key, |call, fx| {
            call.resumed(conn, &resumed, |_| stream_free, now, fx)
        });
        // [scenario: resumed_on_a_draining_connection_moves_on] The connection may have begun draining
        // while the resume was out: the call moves on from it at once.
        self.place(now);
    }

    /// A `hangup` tool call for a session Sent carries on `conn` that no call serves, numbered after the
    /// `tools` it had issued (not kept, not answered: the session is nobody's).
    fn hang_up_stray(&mut self, conn: ConnId, session_id: &str, tools: u64) {
        let hangup = Frame::ToolCall(ToolCall {
            session_id: session_id.to_string(),
            call_ref: call::call_ref(tools.saturating_add(1)),
            name: "hangup".into(),
            arguments: None,
        });
        if let Ok(text) = wire::frames::encode_to_string(&hangup) {
            self.out.push_back(Output::Call(call::Output::Frame {
                conn,
                key: STRAY,
                text,
                counted: false,
            }));
        }
    }

    fn error(&mut self, conn: ConnId, error: ErrorFrame, now: Instant) {
        // The code and what it was about; never the message, which may quote the frame.
        tracing::warn!(
            conn,
            code = error.error.code,
            session = error.session_id,
            frame_type = error.frame_type.as_deref().map(loggable),
            "Sent refused a frame"
        );
        let Some(key) = error
            .session_id
            .as_deref()
            .and_then(|id| self.sessions.get(id))
            .copied()
        else {
            return;
        };
        let full = self
            .with_call(key, |call, fx| call.refused(conn, &error, now, fx))
            .unwrap_or(false);
        if full {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.full = Some((c.calls.len(), now));
            }
            self.place(now);
        }
    }

    /// `connection.draining` on `conn`: it takes no new calls; a new connection is dialled at once, and
    /// the calls move as soon as one can take them.
    fn drain(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.draining {
            return;
        }
        c.draining = true;
        if c.is_empty() {
            c.empty_since = Some(now);
        }
        let attempt = c.attempt;
        tracing::info!(conn, calls = c.calls.len(), "draining");
        if self.held() < self.config.connections {
            self.dial(attempt, false, true);
        }
        self.place(now);
    }

    /// Carries calls with no connection, and calls on draining connections, to connections that can take
    /// them; dials an extra connection when calls have nowhere to go.
    fn place(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        let mut waiting: Vec<CallKey> = self
            .calls
            .values()
            .filter(|c| matches!(c.place(), Place::Detached { .. }))
            .map(Call::key)
            .collect();
        let draining: Vec<CallKey> = self
            .conns
            .values()
            .filter(|c| c.draining)
            .flat_map(|c| c.calls.iter().copied())
            .filter(|key| {
                self.calls
                    .get(key)
                    .is_some_and(|c| c.movable() && matches!(c.place(), Place::Live { .. }))
            })
            .collect();
        waiting.extend(draining);
        let mut homeless = false;
        for key in waiting {
            // The connection with the most room.
            let target = self
                .conns
                .iter()
                .filter(|(_, c)| c.takes_calls(now))
                .min_by_key(|(id, c)| (c.calls.len(), **id))
                .map(|(id, _)| *id);
            match target {
                Some(conn) => {
                    self.with_call(key, |call, fx| call.move_to(conn, now, fx));
                }
                None => {
                    homeless |= self
                        .calls
                        .get(&key)
                        .is_some_and(|c| matches!(c.place(), Place::Detached { .. }));
                }
            }
        }
        // [scenario: connection_full_resumes_elsewhere]
        if homeless && self.dialing.is_empty() {
            self.dial(0, true, true);
        }
    }

    /// [scenario: extra_connections_retired] Closes connections nobody needs: an extra one empty for a
    /// while once enough others are open, and a drained one Sent leaves open.
    fn retire(&mut self, now: Instant) {
        let open = self
            .conns
            .values()
            .filter(|c| !c.draining && !c.closing)
            .count();
        let mut surplus = open.saturating_sub(self.config.connections);
        let homeless = self.homeless();
        let mut closing = Vec::new();
        for (id, c) in &mut self.conns {
            let idle = c
                .empty_since
                .is_some_and(|since| now.duration_since(since) >= IDLE_RETIRE)
                && c.held_until.is_none_or(|held| held <= now);
            if !idle || c.closing {
                continue;
            }
            if c.draining {
                closing.push(*id);
            } else if c.extra && surplus > 0 && !homeless {
                surplus -= 1;
                closing.push(*id);
            } else if c.extra {
                // Needed for now (another one is down, or a call waits): looked at again later.
                c.empty_since = Some(now);
            }
        }
        for conn in closing {
            if let Some(c) = self.conns.get_mut(&conn) {
                tracing::info!(conn, "closing a connection nobody needs");
                c.closing = true;
                c.empty_since = None;
                self.out.push_back(Output::Close {
                    conn,
                    why: Closing::Unneeded,
                });
            }
        }
    }

    /// Keeps a finished call's session id for a while, within bounds, with the tool calls it issued.
    fn remember(&mut self, session_id: String, tools: u64) {
        self.forget_old(RECENT_SESSIONS - 1);
        match self.recent_ids.get_mut(&session_id) {
            // The most the session has had: a stray hangup may have come after its call's.
            Some(issued) => *issued = (*issued).max(tools),
            None => {
                self.recent_ids.insert(session_id.clone(), tools);
                self.recent.push_back((self.now, session_id));
            }
        }
    }

    /// Forgets remembered session ids past their time, and the oldest beyond `keep`.
    fn forget_old(&mut self, keep: usize) {
        while let Some((at, _)) = self.recent.front() {
            let old = self.now.duration_since(*at) > RECENT_FOR;
            if !old && self.recent.len() <= keep {
                break;
            }
            if let Some((_, id)) = self.recent.pop_front() {
                self.recent_ids.remove(&id);
            }
        }
    }

    /// Closes `conn` for this reason, once.
    fn close(&mut self, conn: ConnId, why: Closing) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if c.closing {
                return;
            }
            c.closing = true;
            c.empty_since = None;
        }
        self.out.push_back(Output::Close { conn, why });
    }

    /// Closes the connections that are dead: Sent sent nothing on one for three heartbeat intervals
    /// (its pings alone come every interval), or took nothing of what waits to be written there.
    fn bury(&mut self, now: Instant) {
        let dead: Vec<(ConnId, Closing)> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.closing && c.dead_at() <= now)
            .map(|(id, c)| {
                let silent = c.heard + c.silence() <= now;
                (
                    *id,
                    if silent {
                        Closing::Silent
                    } else {
                        Closing::Stalled
                    },
                )
            })
            .collect();
        for (conn, why) in dead {
            tracing::warn!(conn, ?why, "the connection is dead: closing it");
            let (draining, attempt) = self.conns.get(&conn).map_or((true, 0), |c| {
                (c.draining, if c.pinged { 0 } else { c.attempt + 1 })
            });
            self.close(conn, why);
            // Replaced at once, as a connection that dropped is, without waiting for its close.
            if !self.stopped && !draining && self.held() < self.config.connections {
                self.dial(attempt, false, false);
            }
        }
    }

    /// Until when Sent counts as reading the connection call `key` is live on: a heartbeat interval after
    /// its writer last made progress (see [`Call::send`]); `None` when that has passed.
    fn reading_until(&self, key: CallKey, now: Instant) -> Option<Instant> {
        let c = self.conns.get(&self.conn_of(key)?)?;
        // Never past the moment the connection counts as stalled (a huge interval is capped there).
        Some(c.written + c.interval.min(c.silence())).filter(|until| *until > now)
    }

    /// Runs `f` on a call and keeps the index (sessions and streams per connection, deadlines) in step
    /// with where the call is afterwards; forgets the call once it is finished and its guest knows.
    fn with_call<R>(
        &mut self,
        key: CallKey,
        f: impl FnOnce(&mut Call, &mut Effects) -> R,
    ) -> Option<R> {
        let call = self.calls.get_mut(&key)?;
        let (place, deadline) = (call.place(), call.deadline());
        let result = f(call, &mut self.fx);
        self.out.extend(self.fx.out.drain(..).map(Output::Call));
        let (after, next) = (call.place(), call.deadline());
        let forget = call.forgettable();
        self.reindex(key, place, after, deadline, next);
        if forget {
            if let Some(call) = self.calls.remove(&key) {
                if self.sessions.get(call.session_id()) == Some(&key) {
                    self.sessions.remove(call.session_id());
                }
                self.remember(call.session_id().to_string(), call.tools_issued());
            }
            if let Some(next) = next {
                self.deadlines.remove(&(next, key));
            }
        }
        Some(result)
    }

    fn reindex(
        &mut self,
        key: CallKey,
        before: Place,
        after: Place,
        deadline: Option<Instant>,
        next: Option<Instant>,
    ) {
        if deadline != next {
            if let Some(at) = deadline {
                self.deadlines.remove(&(at, key));
            }
            if let Some(at) = next {
                self.deadlines.insert((at, key));
            }
        }
        if before == after {
            return;
        }
        let now = self.now;
        match before {
            Place::Live { conn, stream } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.remove(&key);
                    if let Some(stream) = stream {
                        if c.streams.get(&stream) == Some(&key) {
                            c.streams.remove(&stream);
                        }
                    }
                }
            }
            Place::Moving { conn, .. } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.remove(&key);
                }
            }
            Place::Detached { .. } | Place::Done => {}
        }
        if let Some(conn) = before.attached() {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.attached.remove(&key);
            }
        }
        match after {
            Place::Live { conn, stream } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.insert(key);
                    if let Some(stream) = stream {
                        c.streams.insert(stream, key);
                    }
                }
            }
            Place::Moving { conn, .. } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.insert(key);
                }
            }
            Place::Detached { .. } | Place::Done => {}
        }
        if let Some(conn) = after.attached() {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.attached.insert(key);
            }
        }
        for conn in [
            before.conn(),
            before.attached(),
            after.conn(),
            after.attached(),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(c) = self.conns.get_mut(&conn) {
                if !c.is_empty() {
                    c.empty_since = None;
                } else if c.empty_since.is_none() && !c.closing {
                    c.empty_since = Some(now);
                }
            }
        }
    }
}

/// The key stray frames go out under (no call has it: keys start at 1).
const STRAY: CallKey = CallKey(0);
