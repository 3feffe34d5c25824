//! All connections of one agent and the calls on them, as a sans-IO state machine: which connections to
//! dial (and when, with backoff), the one index of sessions and streams per connection, routing Sent's
//! frames and audio to calls, draining, `connection_full`, carrying calls to another connection, retiring
//! connections nobody needs. It owns every [`Call`]; [`super`] wraps it in a lock and moves inputs in
//! (events of the connections in one FIFO, the guests' requests, the clock) and [`Output`]s out.

use crate::backoff;
use crate::call::{
    Call, CallKey, CallLimits, ConnId, Effects, FailurePolicy, GuestEvent, Output, Place, Refused,
};
use crate::stats::Stats;
use crate::wire::{self, loggable, Frame};
use bytes::Bytes;
use sentdm_voice_agents::frames::{ConnectionReady, ErrorFrame, SessionResumed, SessionStart};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

/// Connections beyond the ones asked for that `connection_full` may add, at most.
pub const EXTRA_CONNECTIONS: usize = 8;

/// Session ids of finished calls remembered, at most, and for how long: a `session.start` for one of them
/// is a duplicate, not a new call (Sent never reuses a session id).
pub const RECENT_SESSIONS: usize = 4096;
/// How long a finished call's session id is remembered, at most (see [`RECENT_SESSIONS`]).
pub const RECENT_FOR: Duration = Duration::from_secs(600);

/// How long an extra connection (or a drained one Sent keeps open) may sit empty before it is closed.
pub const IDLE_RETIRE: Duration = Duration::from_secs(10);

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
    draining: bool,
    /// Sent refused a resume here with `connection_full`; no resume goes here until a call leaves.
    full: bool,
    /// Closed by the router, waiting for its end.
    closing: bool,
    extra: bool,
    /// A ping arrived since `connection.ready`: Sent is reachable, the backoff starts over.
    pinged: bool,
    attempt: u32,
    /// Calls live on the connection or moving to it; the streams of the live ones.
    calls: BTreeSet<CallKey>,
    streams: HashMap<u16, CallKey>,
    empty_since: Option<Instant>,
}

impl Conn {
    /// Whether a call may be carried here.
    fn takes_calls(&self) -> bool {
        !self.draining && !self.full && !self.closing && self.calls.len() < self.max_sessions
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
    /// Session ids of calls forgotten lately, oldest first.
    recent: VecDeque<(Instant, String)>,
    recent_ids: HashSet<String>,
    /// When each call next has something due, for [`Router::deadline`].
    deadlines: BTreeSet<(Instant, CallKey)>,
    next_conn: ConnId,
    next_key: u64,
    /// The outputs waiting to be polled, and the counts.
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
            recent_ids: HashSet::new(),
            deadlines: BTreeSet::new(),
            next_conn: 1,
            next_key: 1,
            fx: Effects::default(),
            now,
            rng: fastrand::Rng::with_seed(seed),
            stopped: false,
        }
    }

    /// Dials the connections asked for.
    pub fn start(&mut self) {
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
        self.fx.out.pop_front()
    }

    /// The earliest moment something is due ([`Router::timeout`] then).
    pub fn deadline(&self) -> Option<Instant> {
        let calls = self.deadlines.first().map(|(at, _)| *at);
        // Only connections that may be retired; a connection asked for stays, empty or not.
        let idle = self
            .conns
            .values()
            .filter(|c| (c.extra || c.draining) && !c.closing)
            .filter_map(|c| c.empty_since)
            .min()
            .map(|since| since + IDLE_RETIRE);
        [calls, idle].into_iter().flatten().min()
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

    /// The call of a session, for tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn call(&self, session_id: &str) -> Option<&Call> {
        self.calls.get(self.sessions.get(session_id)?)
    }

    // ----- the connections' events -----

    /// Connection `conn` is open and Sent sent `connection.ready` on it.
    pub fn opened(&mut self, conn: ConnId, ready: &ConnectionReady, now: Instant) {
        self.now = self.now.max(now);
        let Some(dialing) = self.dialing.remove(&conn) else {
            // Not asked for (any more): closed at once.
            self.fx.out.push_back(Output::Close { conn });
            return;
        };
        if self.stopped {
            self.fx.out.push_back(Output::Close { conn });
            return;
        }
        self.fx.stats.connections_opened += 1;
        self.conns.insert(
            conn,
            Conn {
                max_sessions: usize::try_from(ready.max_sessions)
                    .unwrap_or(1)
                    .clamp(1, 100_000),
                draining: false,
                full: false,
                closing: false,
                extra: dialing.extra,
                pinged: false,
                attempt: dialing.attempt,
                calls: BTreeSet::new(),
                streams: HashMap::new(),
                empty_since: Some(now),
            },
        );
        self.place(now);
    }

    /// Dialling `conn` failed, for a reason worth retrying.
    pub fn dial_failed(&mut self, conn: ConnId, now: Instant) {
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
    pub fn ping(&mut self, conn: ConnId, ts: i64) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        // [scenario: flapping_connection_backs_off] Only a ping on a ready connection starts its backoff
        // over.
        c.pinged = true;
        c.attempt = 0;
        self.fx.out.push_back(Output::Pong {
            conn,
            text: wire::pong(ts),
        });
    }

    /// A frame from Sent on `conn` (read by the intake: valid, and of Sent's).
    pub fn frame(&mut self, conn: ConnId, frame: Frame, now: Instant) {
        self.now = self.now.max(now);
        if !self.conns.contains_key(&conn) {
            return;
        }
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
    pub fn audio(&mut self, conn: ConnId, stream: u16, samples: Bytes) {
        let Some(key) = self
            .conns
            .get(&conn)
            .and_then(|c| c.streams.get(&stream))
            .copied()
        else {
            return;
        };
        self.with_call(key, |call, fx| call.audio(samples, fx));
    }

    /// Connection `conn` has ended: its calls wait for another one (or are lost), and it is replaced.
    pub fn closed(&mut self, conn: ConnId, now: Instant) {
        self.now = self.now.max(now);
        let Some(c) = self.conns.remove(&conn) else {
            // A dial that never opened.
            self.dial_failed(conn, now);
            return;
        };
        for key in &c.calls {
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

    /// What is due at `now`: calls' deadlines, and connections nobody needs.
    pub fn timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.with_call(key, |call, fx| call.timeout(now, fx));
        }
        self.retire(now);
        self.place(now);
    }

    /// Every connection closes with 1000 (Sent sends the calls to their fallback at once) and every call
    /// is lost.
    pub fn stop(&mut self) {
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
                self.fx.out.push_back(Output::Close { conn });
            }
        }
    }

    // ----- the guests' requests -----

    /// The next event for call `key`'s guest, in arrival order; `None` when none waits or the call is
    /// forgotten.
    pub fn next_event(&mut self, key: CallKey) -> Option<GuestEvent> {
        self.with_call(key, |call, _| call.next_event()).flatten()
    }

    /// A counted frame of the guest's. `unwritten` says how many of a call's frames wait in a connection's
    /// queue.
    pub fn send(
        &mut self,
        key: CallKey,
        frame: &Frame,
        text: String,
        unwritten: impl Fn(ConnId, CallKey) -> usize,
    ) -> Result<(), Refused> {
        let queued = self.conn_of(key).map_or(0, |conn| unwritten(conn, key));
        self.with_call(key, |call, fx| call.send(frame, text, queued, fx))
            .unwrap_or(Err(Refused::Ended))
    }

    /// The guest's tool call: the `call_ref` its answer will carry.
    pub fn tool(
        &mut self,
        key: CallKey,
        name: String,
        arguments: Option<Map<String, Value>>,
        unwritten: impl Fn(ConnId, CallKey) -> usize,
        now: Instant,
    ) -> Result<String, Refused> {
        self.now = self.now.max(now);
        let queued = self.conn_of(key).map_or(0, |conn| unwritten(conn, key));
        self.with_call(key, |call, fx| call.tool(name, arguments, queued, now, fx))
            .unwrap_or(Err(Refused::Ended))
    }

    /// The guest's audio for call `key` (16-bit little-endian samples), sent as [`Call::send_audio`] says.
    pub fn send_audio(&mut self, key: CallKey, samples: &[u8]) {
        self.with_call(key, |call, fx| call.send_audio(samples, fx));
    }

    /// The agent cannot serve the call: its failure policy.
    pub fn give_up(&mut self, key: CallKey, now: Instant) {
        self.now = self.now.max(now);
        self.with_call(key, |call, fx| call.give_up(now, fx));
    }

    /// The call's task has stopped: the call is forgotten once it is finished.
    pub fn release(&mut self, key: CallKey) {
        self.with_call(key, |call, _| call.release());
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
        self.calls.values().any(|c| c.place() == Place::Detached)
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
        self.fx.out.push_back(Output::Dial { conn, delay });
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
            || self.recent_ids.contains(&start.session_id)
        {
            tracing::warn!(
                conn,
                session = start.session_id,
                "a session.start for a session already here: ignored"
            );
            self.fx.stats.frames_invalid += 1;
            return;
        }
        let stream = start
            .audio
            .as_ref()
            .and_then(|a| u16::try_from(a.stream).ok());
        if let (Some(stream), Some(c)) = (stream, self.conns.get(&conn)) {
            if c.streams.contains_key(&stream) {
                tracing::warn!(
                    conn,
                    session = start.session_id,
                    stream,
                    "a session.start with a stream another call has here: ignored"
                );
                self.fx.stats.frames_invalid += 1;
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
        self.fx.out.push_back(Output::Spawn {
            key,
            start: Box::new(start),
        });
        self.fx.out.push_back(Output::Wake { key });
    }

    fn resumed(&mut self, conn: ConnId, resumed: SessionResumed, now: Instant) {
        let Some(&key) = self.sessions.get(&resumed.session_id) else {
            return;
        };
        if self.calls.get(&key).map(Call::place) != Some(Place::Moving { conn }) {
            return;
        }
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
                c.full = true;
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
        if c.calls.is_empty() {
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
            .filter(|c| c.place() == Place::Detached)
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
                .filter(|(_, c)| c.takes_calls())
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
                        .is_some_and(|c| c.place() == Place::Detached);
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
                .is_some_and(|since| now.duration_since(since) >= IDLE_RETIRE);
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
                self.fx.out.push_back(Output::Close { conn });
            }
        }
    }

    /// Keeps a finished call's session id for a while, within bounds.
    fn remember(&mut self, session_id: String) {
        self.forget_old(RECENT_SESSIONS - 1);
        if self.recent_ids.insert(session_id.clone()) {
            self.recent.push_back((self.now, session_id));
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
        let (after, next) = (call.place(), call.deadline());
        let forget = call.forgettable();
        self.reindex(key, place, after, deadline, next);
        if forget {
            if let Some(call) = self.calls.remove(&key) {
                if self.sessions.get(call.session_id()) == Some(&key) {
                    self.sessions.remove(call.session_id());
                }
                self.remember(call.session_id().to_string());
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
        let now_empty = |c: &mut Conn| {
            if c.calls.is_empty() && c.empty_since.is_none() {
                c.empty_since = Some(now);
            }
        };
        match before {
            Place::Live { conn, stream } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.remove(&key);
                    if let Some(stream) = stream {
                        if c.streams.get(&stream) == Some(&key) {
                            c.streams.remove(&stream);
                        }
                    }
                    c.full = false;
                    now_empty(c);
                }
            }
            Place::Moving { conn } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.remove(&key);
                    c.full = false;
                    now_empty(c);
                }
            }
            Place::Detached | Place::Done => {}
        }
        match after {
            Place::Live { conn, stream } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.insert(key);
                    c.empty_since = None;
                    if let Some(stream) = stream {
                        c.streams.insert(stream, key);
                    }
                }
            }
            Place::Moving { conn } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.calls.insert(key);
                    c.empty_since = None;
                }
            }
            Place::Detached | Place::Done => {}
        }
    }
}
