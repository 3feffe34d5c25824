//! What one agent's host counts and measures, for logs, the demo's summary and `/metrics`; and the agent's
//! live calls, for the admin API.

use crate::sandbox::wit::CallInfo;
use crate::sandbox::{Event, TrapKind, HANDLERS};
use prometheus_client::metrics::histogram::Histogram;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One monotonically increasing count: prometheus-client's, read with `get` and encoded as it is.
pub type Counter = prometheus_client::metrics::counter::Counter<u64, AtomicU64>;

/// A value that goes up and down: prometheus-client's.
pub type Gauge = prometheus_client::metrics::gauge::Gauge<i64, AtomicI64>;

/// The upper bounds of the latency histograms' buckets, in seconds: from 50 µs (an audio frame) to 5 s (a
/// handler waiting on a tool or an HTTP call).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// How long each handler took, in seconds: one of prometheus-client's histograms per handler, in the order
/// of [`HANDLERS`], with the bounds of [`LATENCY_BUCKETS`] (and `+Inf`).
#[derive(Debug)]
pub struct HandlerLatency(pub [Histogram; HANDLERS.len()]);

impl Default for HandlerLatency {
    fn default() -> Self {
        HandlerLatency(std::array::from_fn(|_| Histogram::new(LATENCY_BUCKETS)))
    }
}

/// A call being served, as the admin API lists it (never its resume token).
#[derive(Debug, Clone)]
pub struct LiveSession {
    /// The call as its `session.start` described it (what the guest's `info` returns): no resume token.
    pub info: CallInfo,
    /// The agent version serving it.
    pub version: u32,
    /// Replaces the call's instance as if it had trapped.
    pub force_trap: ForceTrap,
}

/// A live call's instance replaced on demand, as if it had trapped (`voicehost call`'s `/restart`): the
/// call's task takes it as a trap of kind [`TrapKind::Forced`] before its next event, so the restart
/// path (a fresh instance, `on-restart`, the trap window) runs as it would for a real one. One is asked
/// for at a time, and none once the host has given up on the call: the answer says which.
#[derive(Debug, Clone, Default)]
pub struct ForceTrap {
    state: Arc<AtomicU8>,
    waker: Arc<Notify>,
}

/// What became of a forced trap asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// The call's task will take it before its next event.
    Asked,
    /// One asked for before has not been taken yet: this one adds nothing.
    AlreadyAsked,
    /// The call has no instance to replace: it is not served, or the host gave up on it.
    NoInstance,
}

const IDLE: u8 = 0;
const WANTED: u8 = 1;
const CLOSED: u8 = 2;

impl ForceTrap {
    /// A switch that wakes the call's task through `waker`.
    pub fn new(waker: Arc<Notify>) -> ForceTrap {
        ForceTrap {
            state: Arc::default(),
            waker,
        }
    }

    /// Asks for the trap, and wakes the call's task.
    pub fn fire(&self) -> Forced {
        match self
            .state
            .compare_exchange(IDLE, WANTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.waker.notify_one();
                Forced::Asked
            }
            Err(WANTED) => Forced::AlreadyAsked,
            Err(_) => Forced::NoInstance,
        }
    }

    /// Whether a trap was asked for since the last look; a look takes it.
    pub fn take(&self) -> bool {
        self.state
            .compare_exchange(WANTED, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The call has no instance any more: no trap can be asked for from now on.
    pub fn close(&self) {
        self.state.store(CLOSED, Ordering::Release);
    }
}

/// Everything one agent's host counts.
#[derive(Default, Debug)]
pub struct Stats {
    /// Connections to Sent that reached `connection.ready` and were kept.
    pub connections_opened: Counter,
    /// Connections to Sent open now: ready, and not yet closed.
    pub connections_open: Gauge,
    /// Calls started by a `session.start` (a duplicate one starts none).
    pub sessions_started: Counter,
    /// Calls that ended with Sent's `session.end`.
    pub sessions_ended: Counter,
    /// Calls lost: their connection went with no token to resume, a resume failed or went unanswered, the
    /// resume window passed, or the host stopped.
    pub sessions_lost: Counter,
    /// Sent's counted session frames read by the agent's calls (what each call's `received` counts).
    pub frames_in: Counter,
    /// The calls' counted frames queued on a connection, replays included (a `session.resume` or a pong is
    /// not counted).
    pub frames_out: Counter,
    /// Caller audio messages queued for a call's guest.
    pub audio_in: Counter,
    /// The agent's audio messages queued for Sent, after cutting into messages of at most 200 ms.
    pub audio_out: Counter,
    /// Caller audio dropped: the guest was behind, or the call ended with audio still queued for it.
    pub audio_dropped: Counter,
    /// The agent's audio dropped: past what may wait for the socket, cut past the end, sent without a
    /// stream (while moving, after the end).
    pub audio_out_dropped: Counter,
    /// Messages from Sent dropped by the intake (not valid, not Sent's to send, over a size limit) or
    /// ignored by the router (a second `session.start` for a session, a stream already taken).
    pub frames_invalid: Counter,
    /// Sent's frames not delivered to a guest that could not keep up (the call got its failure policy).
    pub frames_dropped: Counter,
    /// Calls carried to a connection: `session.resumed` answered their `session.resume`.
    pub resumes: Counter,
    /// Handler calls that returned an error (the instance goes on).
    pub handler_errors: Counter,
    /// Guest log lines over the call's rate limit.
    pub log_dropped: Counter,
    /// Traps contained, by kind, in the order of [`TrapKind::ALL`].
    traps: [Counter; TrapKind::ALL.len()],
    /// Fresh instances that got `on-restart` after a trap.
    pub restarts: Counter,
    /// Calls served by a component of a deprecated world (`voicehost:agent@0.1.0`, through its adapter).
    pub deprecated_world_calls: Counter,
    /// Calls given their failure policy (once per call at most).
    pub policies_applied: Counter,
    /// Calls handed over to another host (cluster mode, the host leaving).
    pub calls_handed_over: Counter,
    /// Calls another host handed over, taken here.
    pub calls_taken_over: Counter,
    /// Calls over a session cap: given the failure policy at once, never a guest.
    pub sessions_refused: Counter,
    /// Calls that found no slot in the host's pool their tenant may take (the rest is other tenants'
    /// reservations, or in use): given the failure policy at once, never a guest.
    pub sessions_host_full: Counter,
    /// Handler latency by handler, in the order of [`HANDLERS`].
    pub handlers: HandlerLatency,
    /// By session id and the call's key in its agent's router: a call that left and came back (a
    /// handover taken back) is another call of the same session, listed before the first is gone.
    live: Mutex<BTreeMap<(String, u64), LiveSession>>,
}

impl Stats {
    /// Adds what the core counted since `before` (its counts are plain numbers, these Prometheus's).
    pub fn add_core(&self, before: &voicehost_proto::Stats, now: &voicehost_proto::Stats) {
        let counted = [
            (
                &self.connections_opened,
                before.connections_opened,
                now.connections_opened,
            ),
            (
                &self.sessions_started,
                before.sessions_started,
                now.sessions_started,
            ),
            (
                &self.sessions_ended,
                before.sessions_ended,
                now.sessions_ended,
            ),
            (&self.sessions_lost, before.sessions_lost, now.sessions_lost),
            (&self.frames_in, before.frames_in, now.frames_in),
            (&self.frames_out, before.frames_out, now.frames_out),
            (&self.audio_in, before.audio_in, now.audio_in),
            (&self.audio_out, before.audio_out, now.audio_out),
            (&self.audio_dropped, before.audio_dropped, now.audio_dropped),
            (
                &self.audio_out_dropped,
                before.audio_out_dropped,
                now.audio_out_dropped,
            ),
            (
                &self.frames_invalid,
                before.frames_invalid,
                now.frames_invalid,
            ),
            (
                &self.frames_dropped,
                before.frames_dropped,
                now.frames_dropped,
            ),
            (&self.resumes, before.resumes, now.resumes),
            (
                &self.policies_applied,
                before.policies_applied,
                now.policies_applied,
            ),
            (&self.calls_handed_over, before.handed_over, now.handed_over),
            (&self.calls_taken_over, before.adopted, now.adopted),
        ];
        for (counter, was, is) in counted {
            if is > was {
                counter.inc_by(is - was);
            }
        }
        self.connections_open
            .set(i64::try_from(now.connections_open).unwrap_or(i64::MAX));
    }

    /// Counts one contained trap of `kind`.
    pub fn trap(&self, kind: TrapKind) {
        self.traps[kind.index()].inc();
    }

    /// Traps of this kind contained so far.
    pub fn trapped(&self, kind: TrapKind) -> u64 {
        self.trap_counter(kind).get()
    }

    /// The counter of contained traps of this kind.
    pub fn trap_counter(&self, kind: TrapKind) -> &Counter {
        &self.traps[kind.index()]
    }

    /// Records how long the handler for `event` took, in that handler's histogram.
    pub fn handled(&self, event: &Event, took: Duration) {
        self.handlers.0[event.handler()].observe(took.as_secs_f64());
    }

    /// A call starts being served (`key`: its key in the agent's router).
    pub fn live_start(&self, session_id: &str, key: u64, live: LiveSession) {
        self.live_calls()
            .insert((session_id.to_string(), key), live);
    }

    /// The call is no longer served.
    pub fn live_end(&self, session_id: &str, key: u64) {
        self.live_calls().remove(&(session_id.to_string(), key));
    }

    /// Replaces the instance of the live call `session_id` as if it had trapped ([`ForceTrap`]).
    pub fn force_trap(&self, session_id: &str) -> Forced {
        let calls = self.live_calls();
        let mut of_session =
            calls.range((session_id.to_string(), 0)..=(session_id.to_string(), u64::MAX));
        match of_session.next_back() {
            Some((_, live)) => live.force_trap.fire(),
            None => Forced::NoInstance,
        }
    }

    /// The calls being served now, by session id.
    pub fn live(&self) -> Vec<LiveSession> {
        self.live_calls().values().cloned().collect()
    }

    /// How many calls are being served now.
    pub fn live_count(&self) -> usize {
        self.live_calls().len()
    }

    fn live_calls(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u64), LiveSession>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Traps of every kind contained so far.
    pub fn traps(&self) -> u64 {
        self.traps.iter().map(Counter::get).sum()
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "connections opened  {}", self.connections_opened.get())?;
        writeln!(
            f,
            "sessions            {} started, {} ended, {} lost",
            self.sessions_started.get(),
            self.sessions_ended.get(),
            self.sessions_lost.get()
        )?;
        writeln!(
            f,
            "frames              {} in, {} out",
            self.frames_in.get(),
            self.frames_out.get()
        )?;
        writeln!(
            f,
            "audio messages      {} in, {} out, {} dropped",
            self.audio_in.get(),
            self.audio_out.get(),
            self.audio_dropped.get()
        )?;
        writeln!(f, "resumes             {}", self.resumes.get())?;
        writeln!(f, "handler errors      {}", self.handler_errors.get())?;
        let kinds = TrapKind::ALL.map(|kind| format!("{} {}", kind.as_str(), self.trapped(kind)));
        writeln!(
            f,
            "traps contained     {} ({})",
            self.traps(),
            kinds.join(", ")
        )?;
        writeln!(f, "restarts            {}", self.restarts.get())?;
        writeln!(f, "over a session cap  {}", self.sessions_refused.get())?;
        writeln!(f, "host full           {}", self.sessions_host_full.get())?;
        write!(f, "failure policies    {}", self.policies_applied.get())
    }
}

#[cfg(test)]
mod force_trap_tests {
    use super::*;

    #[test]
    fn one_forced_trap_at_a_time_and_none_once_closed() {
        let force = ForceTrap::new(Arc::default());
        assert_eq!(force.fire(), Forced::Asked);
        assert_eq!(force.fire(), Forced::AlreadyAsked);
        assert!(force.take());
        assert!(!force.take());
        assert_eq!(force.fire(), Forced::Asked);
        force.close();
        assert!(!force.take());
        assert_eq!(force.fire(), Forced::NoInstance);
    }
}
