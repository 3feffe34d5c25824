//! One agent as the host serves it: its connections to Sent and its calls. The rules are in the core's
//! [`Router`] (connections, routing) and [`voicehost_proto::call`] (each call); this module is the I/O
//! around them. One lock
//! holds the router; each connection's task feeds it that connection's events itself, in order (`opened`
//! before any frame, `closed` last), the router task feeds it the clock, each call's task feeds it its
//! guest's requests, and whoever fed it carries out what it asks while still holding the lock (queueing on
//! a connection never waits), so that what the router decided reaches the sockets in the order it decided
//! it. A frame from Sent thus crosses three tasks: its connection's reader, its call's task (the guest, on
//! the calls' runtime: see `sandbox::spawn_call`), and the connection's writer.

mod admission;
mod call_task;
pub mod connection;
mod moving;

pub use admission::{Admission, Gate, Refusal};
pub use call_task::CallRules;
pub use connection::{ApiKey, ConnectError, Dial, SENT_URL};
pub use moving::{Arrival, Departure, Kept, Moves, MovingCall};
pub use voicehost_proto::call::FailurePolicy;

use crate::sandbox::AgentCode;
use crate::stats::Stats;
use connection::{Event, EventSink, Outbox};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinHandle;
use voicehost_proto::call::{self, CallKey, ConnId, Refused, ToolAnswer};
use voicehost_proto::router::{Closing, Output, Router, RouterConfig};

/// One version of an agent, ready to serve calls.
pub struct Deployment {
    /// The version number in the registry (0 when the agent was not uploaded, as with `voicehost run`).
    pub version: u32,
    /// The version's component, compiled and pre-linked.
    pub code: AgentCode,
    /// What this version's new calls run under: limits, failure policy.
    pub rules: CallRules,
}

/// One agent as the host serves it.
pub struct AgentConfig {
    /// Where to connect to Sent, as which agent, with which key.
    pub dial: Dial,
    /// What new calls get. Activating a version replaces it; a live call keeps the one it started with.
    pub deployment: watch::Receiver<Arc<Deployment>>,
    /// How many connections to hold at once (more when draining or after `connection_full`).
    pub connections: usize,
    /// The caps on concurrent calls this agent's calls fall under.
    pub admission: Admission,
    /// In a cluster: where its calls go when the host leaves, and calls handed to it by other hosts.
    pub moves: Option<Moves>,
}

impl AgentConfig {
    /// An agent with one version that never changes, and no cap on its calls.
    pub fn fixed(dial: Dial, code: AgentCode, rules: CallRules, connections: usize) -> AgentConfig {
        let (_, deployment) = watch::channel(Arc::new(Deployment {
            version: 0,
            code,
            rules,
        }));
        AgentConfig {
            dial,
            deployment,
            connections,
            admission: Admission::default(),
            moves: None,
        }
    }
}

/// What a guest's tool call waits on.
type Waiter = oneshot::Sender<Result<ToolAnswer, Refused>>;

/// The router and what carries out its outputs, under one lock.
struct Shared {
    router: Router,
    /// The core's counts as last added to the agent's [`Stats`].
    exported: voicehost_proto::Stats,
    outboxes: HashMap<ConnId, Arc<Outbox>>,
    waiters: HashMap<(CallKey, String), Waiter>,
    wakers: HashMap<CallKey, Arc<Notify>>,
    /// Connections being dialled: aborted when the agent stops, so a stopped agent never connects again.
    dials: HashMap<ConnId, JoinHandle<()>>,
    /// The tasks of open connections: awaited when the agent stops, so their close reaches Sent.
    open: HashMap<ConnId, JoinHandle<()>>,
    /// Sent refused the agent for a reason that needs a person: the router task stops serving.
    fatal: Option<ConnectError>,
    /// The agent has stopped serving: a connection's events find nobody (it closes with 1001).
    stopped: bool,
}

/// One served agent.
struct Agent {
    shared: Mutex<Shared>,
    /// A request or a connection's event may have set a new deadline (or a fatal refusal): the router
    /// task looks again.
    timers: Notify,
    dial: Dial,
    /// What the connections' tasks hand their events to: this agent, weakly (a connection's task does
    /// not keep a stopped agent alive).
    events: connection::Events,
    deployment: watch::Receiver<Arc<Deployment>>,
    admission: Admission,
    stats: Arc<Stats>,
    /// True once the host leaves (cluster mode): calls that can move leave at their next handler boundary.
    leave: Option<watch::Receiver<bool>>,
    /// Where leaving calls go.
    moves_out: Option<moving::LeavingSink>,
}

/// Serves the agent's calls until `stop` turns true. Fails only when Sent refuses the connection for a
/// reason that needs a person (400, 401, 403, 404).
pub async fn serve(
    config: AgentConfig,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConnectError> {
    let rules = config.deployment.borrow().rules.clone();
    let router = Router::new(
        RouterConfig {
            connections: config.connections,
            limits: rules.call.clone(),
            policy: rules.policy.clone(),
        },
        fastrand::u64(..),
        Instant::now(),
    );
    let agent = Arc::new_cyclic(|me: &Weak<Agent>| Agent {
        shared: Mutex::new(Shared {
            router,
            exported: voicehost_proto::Stats::default(),
            outboxes: HashMap::new(),
            waiters: HashMap::new(),
            wakers: HashMap::new(),
            dials: HashMap::new(),
            open: HashMap::new(),
            fatal: None,
            stopped: false,
        }),
        timers: Notify::new(),
        dial: config.dial,
        events: Arc::new(Feed(me.clone())),
        deployment: config.deployment.clone(),
        admission: config.admission,
        stats,
        leave: config.moves.as_ref().map(|m| m.leave.clone()),
        moves_out: config.moves.as_ref().map(|m| m.out.clone()),
    });
    let mut deployments = config.deployment;
    let (mut leave, mut arrivals) = match config.moves {
        Some(moves) => (Some(moves.leave), Some(moves.arrive)),
        None => (None, None),
    };
    // Calls handed over here, waiting for Sent to answer their resume.
    let mut resuming: Vec<moving::Resuming> = Vec::new();
    agent.with(|shared| shared.router.start(Instant::now()));
    let result = loop {
        let deadline = agent.lock().router.poll_timeout();
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break Ok(());
                }
            }
            // Before the timers, which every frame from Sent wakes: a busy agent still takes its calls.
            Some(arrival) = next_arrival(&mut arrivals) => {
                resuming.extend(agent.adopt(arrival));
            }
            () = left(&mut leave) => {
                // Every call's task looks at once: those between handlers leave now.
                agent.lock().wakers.values().for_each(|waker| waker.notify_one());
            }
            () = agent.timers.notified() => {
                // The router panicked in a connection's task: its state is not to be trusted.
                assert!(
                    !agent.shared.is_poisoned(),
                    "the agent's router panicked while handling a connection's event"
                );
            }
            () = sleep => {}
            Ok(()) = deployments.changed() => {
                let rules = deployments.borrow().rules.clone();
                agent.with(|shared| shared.router.set_rules(rules.call, rules.policy));
            }
        }
        // Whatever woke the loop, what is due is done now. The connections' events are handled in their
        // own tasks, so no flood of them keeps this one from its timers.
        let now = Instant::now();
        let fatal = agent.with(|shared| {
            if shared.router.poll_timeout().is_some_and(|at| at <= now) {
                shared.timeout(now);
            }
            shared.fatal.take()
        });
        if let Some(error) = fatal {
            tracing::error!(%error, "Sent refused the agent: stopping");
            break Err(error);
        }
        resuming = resuming
            .into_iter()
            .filter_map(|r| {
                let place = agent.place_of(r.key());
                r.settled(place)
            })
            .collect();
    };
    let closing = agent.with(|shared| {
        shared.router.stop(Instant::now());
        for (_, dial) in shared.dials.drain() {
            dial.abort();
        }
        std::mem::take(&mut shared.open)
    });
    // Each open connection has been told to close with 1000; its task ends once the close is written and
    // answered. Without this wait a process that stops right after would reset them instead.
    let tasks: Vec<JoinHandle<()>> = closing.into_values().collect();
    let aborts: Vec<_> = tasks.iter().map(JoinHandle::abort_handle).collect();
    if tokio::time::timeout(CLOSE_WITHIN, futures_util::future::join_all(tasks))
        .await
        .is_err()
    {
        tracing::warn!("a connection did not close in time: dropped");
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
    }
    agent.lock().stopped = true;
    result
}

/// The next call handed to the agent, if it takes any (never, otherwise).
async fn next_arrival(
    arrivals: &mut Option<tokio::sync::mpsc::Receiver<Arrival>>,
) -> Option<Arrival> {
    match arrivals {
        Some(arrivals) => arrivals.recv().await,
        None => std::future::pending().await,
    }
}

/// Returns once the host leaves (and never again after).
async fn left(leave: &mut Option<watch::Receiver<bool>>) {
    let Some(receiver) = leave else {
        return std::future::pending().await;
    };
    let left = receiver.wait_for(|leave| *leave).await.is_ok();
    *leave = None;
    if !left {
        std::future::pending::<()>().await;
    }
}

/// The agent as its connections' [`EventSink`].
struct Feed(Weak<Agent>);

impl EventSink for Feed {
    fn handle(&self, conn: ConnId, event: Event) -> bool {
        let Some(agent) = self.0.upgrade() else {
            return false;
        };
        // Audio sets no deadline; every other event may (a start's, a connection's dead line, a fatal
        // refusal): the router task looks again.
        let timers = !matches!(event, Event::Audio { .. });
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            agent.with(|shared| {
                if shared.stopped {
                    return false;
                }
                if let Some(error) = agent.handle(shared, conn, event) {
                    shared.fatal = Some(error);
                }
                true
            })
        }));
        // A panic in the router (it poisons the lock) must stop the agent as loudly as when the router
        // task handled these: the router task is woken to see it.
        if timers || handled.is_err() {
            agent.timers.notify_one();
        }
        handled.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// How long a stopping agent waits for its connections' closing handshakes.
const CLOSE_WITHIN: Duration = Duration::from_secs(3);

impl Shared {
    /// What the connections' readers and writers did, reported to the core; then what is due.
    fn timeout(&mut self, now: Instant) {
        for (conn, outbox) in &self.outboxes {
            self.router
                .handle_activity(now, *conn, outbox.activity(now));
        }
        self.router.handle_timeout(now);
    }

    /// The writer's count of call `key`'s counted frames on its connection, and that connection's
    /// activity, reported to the core before the call's guest sends one more.
    fn report(&mut self, key: CallKey, now: Instant) {
        let Some(conn) = self.router.conn_of(key) else {
            return;
        };
        if let Some(outbox) = self.outboxes.get(&conn) {
            self.router.handle_activity(now, conn, outbox.activity(now));
            self.router
                .handle_written(now, conn, key, outbox.frames_written(key));
        }
    }
}

impl Agent {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The outbox of the connection call `key` is live on.
    fn outbox_of(&self, key: CallKey) -> Option<Arc<Outbox>> {
        let shared = self.lock();
        let conn = shared.router.conn_of(key)?;
        shared.outboxes.get(&conn).cloned()
    }

    /// Runs `f` on the router, then carries out what it asked, before the lock is let go.
    fn with<R>(self: &Arc<Agent>, f: impl FnOnce(&mut Shared) -> R) -> R {
        let mut shared = self.lock();
        let result = f(&mut shared);
        // Counted before it is carried out: once a frame reaches Sent, what it counts is already in the
        // agent's stats (a writer on another thread may write it before this returns).
        let counted = shared.router.stats();
        self.stats.add_core(&shared.exported, &counted);
        shared.exported = counted;
        self.dispatch(&mut shared);
        result
    }

    /// One event of a connection's. Returns the error when Sent refused the agent for good.
    fn handle(&self, shared: &mut Shared, conn: ConnId, event: Event) -> Option<ConnectError> {
        let now = Instant::now();
        match event {
            Event::Opened { ready, outbox } => {
                if let Some(task) = shared.dials.remove(&conn) {
                    shared.open.insert(conn, task);
                }
                shared.outboxes.insert(conn, outbox);
                shared.router.handle_opened(now, conn, &ready);
            }
            Event::DialFailed(error) => {
                shared.dials.remove(&conn);
                if error.is_fatal() {
                    return Some(error);
                }
                shared.router.handle_dial_failed(now, conn);
            }
            Event::Frame(frame) => shared.router.handle_frame(now, conn, *frame),
            Event::Ping(ts) => shared.router.handle_ping(now, conn, ts),
            Event::Audio { stream, samples } => {
                shared.router.handle_audio(now, conn, stream, samples)
            }
            Event::Closed { why } => {
                tracing::info!(conn, why, "connection closed");
                // What its writer wrote, last: what it did not is held again by its calls.
                if let Some(outbox) = shared.outboxes.remove(&conn) {
                    for (key, frames) in outbox.all_frames_written() {
                        shared.router.handle_written(now, conn, key, frames);
                    }
                }
                shared.open.remove(&conn);
                shared.router.handle_closed(now, conn);
            }
        }
        None
    }

    /// Carries out what the router asked, in order.
    fn dispatch(self: &Arc<Agent>, shared: &mut Shared) {
        while let Some(output) = shared.router.poll_output() {
            match output {
                Output::Call(call::Output::Frame {
                    conn,
                    key,
                    text,
                    counted,
                }) => {
                    if let Some(outbox) = shared.outboxes.get(&conn) {
                        outbox.frame(key, text, counted);
                    }
                }
                Output::Call(call::Output::Audio {
                    conn,
                    key,
                    message,
                    backlog,
                }) => {
                    if let Some(outbox) = shared.outboxes.get(&conn) {
                        let dropped = outbox.audio(key, message, backlog);
                        self.stats.audio_out_dropped.inc_by(dropped as u64);
                    }
                }
                Output::Call(call::Output::Retract { conn, key }) => {
                    if let Some(outbox) = shared.outboxes.get(&conn) {
                        outbox.retract(key);
                    }
                }
                Output::Pong { conn, text } => {
                    if let Some(outbox) = shared.outboxes.get(&conn) {
                        outbox.pong(text);
                    }
                }
                Output::Close { conn, why } => {
                    if let Some(outbox) = shared.outboxes.get(&conn) {
                        match why {
                            Closing::Unneeded => outbox.close(),
                            Closing::Silent => outbox.close_away("silent"),
                            Closing::Stalled => outbox.abort(),
                        }
                    }
                }
                Output::Call(call::Output::Answer {
                    key,
                    call_ref,
                    answer,
                }) => {
                    if let Some(waiter) = shared.waiters.remove(&(key, call_ref)) {
                        let _ = waiter.send(answer);
                    }
                }
                Output::Call(call::Output::Wake { key }) => {
                    if let Some(waker) = shared.wakers.get(&key) {
                        waker.notify_one();
                    }
                }
                Output::Dial { conn, delay } => {
                    shared.dials.retain(|_, dial| !dial.is_finished());
                    let task = tokio::spawn(connection::run(
                        conn,
                        self.dial.clone(),
                        delay,
                        self.events.clone(),
                        self.stats.clone(),
                    ));
                    shared.dials.insert(conn, task);
                }
                Output::Spawn { key, start } => {
                    let waker = Arc::new(Notify::new());
                    shared.wakers.insert(key, waker.clone());
                    // The version active now serves the whole call, even if another is activated meanwhile.
                    let deployment = self.deployment.borrow().clone();
                    let permit = self.admission.admit(deployment.code.pool_slots());
                    tracing::info!(
                        session = start.session_id,
                        version = deployment.version,
                        admitted = permit.is_ok(),
                        "serving a call"
                    );
                    call_task::spawn(
                        self,
                        key,
                        start,
                        waker,
                        deployment,
                        permit,
                        call_task::Taken::nothing(),
                    );
                }
            }
        }
    }
}
