//! What one agent's host counts and measures, for logs, the demo's summary and `/metrics`; and the agent's
//! live calls, for the admin API.

use crate::sandbox::wit::Call;
use crate::sandbox::{Event, TrapKind, HANDLERS};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// One monotonically increasing count.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` at once.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Default, Debug)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one away.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// The value now.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The upper bounds of the latency histograms' buckets, in seconds: from 50 µs (an audio frame) to 5 s (a
/// handler waiting on a tool or an HTTP call).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// A latency histogram with fixed buckets, lock-free to observe (cumulative when rendered).
#[derive(Default, Debug)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is above every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Counts `took` in the first bucket whose bound holds it (the last when none does), and adds it to the
    /// sum.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let at = LATENCY_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Observations in each bucket (not cumulative), the last above every bound.
    pub fn counts(&self) -> [u64; LATENCY_BUCKETS.len() + 1] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// The sum of every observation, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// A call being served, as the admin API lists it (never its resume token).
#[derive(Debug, Clone)]
pub struct LiveSession {
    /// The call as its `session.start` described it (what the guest's `info` returns): no resume token.
    pub call: Call,
    /// The agent version serving it.
    pub version: u32,
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
    /// Calls given their failure policy (once per call at most).
    pub policies_applied: Counter,
    /// Calls over a session cap: given the failure policy at once, never a guest.
    pub sessions_refused: Counter,
    /// Handler latency by handler, in the order of [`HANDLERS`].
    pub handlers: [Histogram; HANDLERS.len()],
    live: Mutex<BTreeMap<String, LiveSession>>,
}

impl Stats {
    /// Counts one contained trap of `kind`.
    pub fn trap(&self, kind: TrapKind) {
        self.traps[kind.index()].inc();
    }

    /// Traps of this kind contained so far.
    pub fn trapped(&self, kind: TrapKind) -> u64 {
        self.traps[kind.index()].get()
    }

    /// Records how long the handler for `event` took, in that handler's histogram.
    pub fn handled(&self, event: &Event, took: Duration) {
        self.handlers[event.handler()].observe(took);
    }

    /// A call starts being served.
    pub fn live_start(&self, session_id: &str, live: LiveSession) {
        self.live_calls().insert(session_id.to_string(), live);
    }

    /// The call is no longer served.
    pub fn live_end(&self, session_id: &str) {
        self.live_calls().remove(session_id);
    }

    /// The calls being served now, by session id.
    pub fn live(&self) -> Vec<LiveSession> {
        self.live_calls().values().cloned().collect()
    }

    /// How many calls are being served now.
    pub fn live_count(&self) -> usize {
        self.live_calls().len()
    }

    fn live_calls(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LiveSession>> {
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
        write!(f, "failure policies    {}", self.policies_applied.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_observation_in_the_first_bucket_that_holds_it() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(30));
        histogram.observe(Duration::from_micros(100));
        histogram.observe(Duration::from_secs(9));
        let counts = histogram.counts();
        assert_eq!(counts[0], 1, "30 µs is under 50 µs");
        assert_eq!(counts[1], 1, "100 µs is at the 100 µs bound");
        assert_eq!(counts[2..LATENCY_BUCKETS.len()].iter().sum::<u64>(), 0);
        assert_eq!(
            counts[LATENCY_BUCKETS.len()],
            1,
            "9 s only above every bound"
        );
        assert!((histogram.sum_seconds() - 9.00013).abs() < 1e-9);
    }
}
