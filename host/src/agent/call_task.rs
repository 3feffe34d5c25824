//! One call's task: it feeds the call's events to its guest, one at a time, in the order Sent's frames
//! arrived; it replaces a trapped instance with a fresh one; it asks for the failure policy when the agent
//! cannot serve the call. The guest's imports ([`CallImports`]) reach the call's state machine through the
//! agent's lock; what the protocol allows is decided there, not here.

use super::admission::{Permit, Refusal};
use super::moving::{start_without_token, Arrival, Departure, Kept, MovingCall};
use super::{Agent, Deployment, FailurePolicy};
use crate::sandbox::limits;
use crate::sandbox::wit::{self, CallInfo, Direction, Level, Party};
use crate::sandbox::{Event, GuestImports, Instance, Limits, Outcome, TrapKind, World};
use crate::stats::{ForceTrap, LiveSession, Stats};
use sentdm_voice_agents::frames::{AgentClear, AgentSay, SessionStart};
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use voicehost_proto::call::{CallKey, CallLimits, GuestEvent, Media, NotNow, TrapWindow};
use voicehost_proto::wire::{frames, Frame};

/// The rules one agent's calls run under.
#[derive(Debug, Clone)]
pub struct CallRules {
    /// The sandbox's limits on each call's instance.
    pub limits: Limits,
    /// How many traps within [`CallRules::trap_window`] make the host give up on the agent for the call.
    pub max_traps: usize,
    /// How far back traps count towards [`CallRules::max_traps`].
    pub trap_window: Duration,
    /// What happens to a call the agent cannot serve.
    pub policy: FailurePolicy,
    /// The protocol's bounds on each call: tool timeout, backlogs.
    pub call: CallLimits,
    /// Saved state per call, keys and values together, in bytes.
    pub state_bytes: usize,
}

impl Default for CallRules {
    fn default() -> Self {
        CallRules {
            limits: Limits::default(),
            max_traps: limits::MAX_TRAPS,
            trap_window: limits::TRAP_WINDOW,
            policy: FailurePolicy::HangUp,
            call: CallLimits::default(),
            state_bytes: limits::STATE_BYTES,
        }
    }
}

/// What one call's guest reaches through its imports.
struct CallImports {
    agent: Arc<Agent>,
    key: CallKey,
    info: CallInfo,
    session_id: String,
    /// Shared with the call's task, which hands it over with the call when the host leaves.
    saved: Arc<Mutex<Saved>>,
    state_bytes: usize,
    stats: Arc<Stats>,
}

impl CallImports {
    /// A counted frame of the guest's, checked by the codec before the call's machine sees it. While the
    /// call has as many frames unwritten as may be and Sent is reading, it waits for the writer (the
    /// call's wall-clock bound covers the wait); the machine says when that stops.
    fn send(&self, frame: Frame) -> Pin<Box<dyn Future<Output = Result<(), wit::Refused>> + Send>> {
        let agent = self.agent.clone();
        let key = self.key;
        Box::pin(async move {
            let text = frames::encode_to_string(&frame).map_err(|_| wit::Refused::Invalid)?;
            with_room(&agent, key, |shared, now| {
                shared.router.handle_send(now, key, &frame, text.clone())
            })
            .await
        })
    }
}

/// Runs `attempt` on the router (with the writer's progress reported first) until it is done or refused:
/// while the router says to wait, waits for the call's connection to write more, or for the moment it
/// names.
async fn with_room<T>(
    agent: &Arc<Agent>,
    key: CallKey,
    mut attempt: impl FnMut(&mut super::Shared, Instant) -> Result<T, NotNow>,
) -> Result<T, wit::Refused> {
    loop {
        let outbox = agent.outbox_of(key);
        let mut wrote = outbox.as_ref().map(|o| Box::pin(o.wrote()));
        if let Some(wrote) = wrote.as_mut() {
            wrote.as_mut().enable();
        }
        let result = agent.with(|shared| {
            let now = Instant::now();
            shared.report(key, now);
            attempt(shared, now)
        });
        match result {
            Ok(done) => return Ok(done),
            Err(NotNow::Refused(why)) => return Err(wit::Refused::from(why)),
            Err(NotNow::Wait(until)) => room(until, wrote).await,
        }
    }
}

/// Waits until the connection's writer has written more (`wrote`, enabled before the router said to
/// wait), or until `until`.
async fn room(until: Instant, wrote: Option<Pin<Box<tokio::sync::futures::Notified<'_>>>>) {
    let deadline = tokio::time::sleep_until(until.into());
    match wrote {
        Some(wrote) => {
            tokio::select! {
                () = wrote => {}
                () = deadline => {}
            }
        }
        None => deadline.await,
    }
}

/// What the guest saved with `save`, by key.
type Saved = HashMap<String, Vec<u8>>;

/// What a call brings when it comes from another host (nothing, for a call that starts here).
pub(super) struct Taken {
    /// What the guest saved there.
    pub(super) saved: Saved,
    /// The call does not leave again before this (a leaving host that took back a call no peer took).
    pub(super) leave_after: Instant,
}

impl Taken {
    /// A call that starts here.
    pub(super) fn nothing() -> Taken {
        Taken {
            saved: Saved::new(),
            leave_after: Instant::now(),
        }
    }
}

/// How long a call that could not leave (no token, its end queued, its policy running) waits before it
/// is tried again.
const LEAVE_AGAIN_AFTER: Duration = Duration::from_millis(500);

/// What one saved entry costs against the call's state bound: its key and value, and what the map keeps
/// for every entry (so that many tiny keys cannot cost the host more than the bound says).
pub(super) fn saved_bytes(key: &str, value: &[u8]) -> usize {
    const PER_ENTRY: usize = 64;
    PER_ENTRY + key.len() + value.len()
}

impl GuestImports for CallImports {
    fn info(&self) -> CallInfo {
        self.info.clone()
    }

    fn say(
        &self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Pin<Box<dyn Future<Output = Result<(), wit::Refused>> + Send>> {
        self.send(Frame::AgentSay(AgentSay {
            session_id: self.session_id.clone(),
            text,
            interruptible,
            last,
        }))
    }

    fn clear(&self) -> Pin<Box<dyn Future<Output = Result<(), wit::Refused>> + Send>> {
        self.send(Frame::AgentClear(AgentClear {
            session_id: self.session_id.clone(),
        }))
    }

    fn send_audio(&self, samples: Vec<i16>) {
        self.agent
            .with(|shared| shared.router.handle_send_audio(self.key, &samples));
    }

    fn tool(
        &self,
        name: String,
        arguments: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<wit::ToolResult, wit::Refused>> + Send>> {
        let agent = self.agent.clone();
        let key = self.key;
        Box::pin(async move {
            // Issued once there is room (as `say` waits), then answered exactly once by the call's
            // machine: Sent's result, `ended` or `timed-out`. A dropped sender only happens when the agent
            // has stopped.
            let answer = with_room(&agent, key, |shared, now| {
                let call_ref =
                    shared
                        .router
                        .handle_tool(now, key, name.clone(), arguments.as_deref())?;
                let (answer, waiting) = oneshot::channel();
                shared.waiters.insert((key, call_ref), answer);
                Ok(waiting)
            })
            .await?;
            // The tool's deadline may be the router's next one.
            agent.timers.notify_one();
            match answer.await {
                Ok(Ok(answer)) => Ok(answer.into()),
                Ok(Err(error)) => Err(error.into()),
                Err(_) => Err(wit::Refused::Ended),
            }
        })
    }

    fn save(&self, key: String, value: Vec<u8>) -> Result<(), wit::Refused> {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        let used: usize = saved
            .iter()
            .filter(|(k, _)| **k != key)
            .map(|(k, v)| saved_bytes(k, v))
            .sum();
        if used + saved_bytes(&key, &value) > self.state_bytes {
            return Err(wit::Refused::OverLimit);
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
        let session = self.session_id.as_str();
        match level {
            Level::Trace => tracing::trace!(session, guest = message),
            Level::Debug => tracing::debug!(session, guest = message),
            Level::Info => tracing::info!(session, guest = message),
            Level::Warn => tracing::warn!(session, guest = message),
            // `critical` is `wasi:logging`'s; the host's log has no level above error.
            Level::Error | Level::Critical => tracing::error!(session, guest = message),
        }
    }
}

fn info_of(start: &SessionStart, media: Media) -> CallInfo {
    let party = |p: &frames::Party| Party {
        kind: p.kind.clone(),
        value: p.value.clone(),
    };
    CallInfo {
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
        media: media.into(),
        language: start.language.clone(),
        context: start
            .context
            .as_ref()
            .map(|c| Value::Object(c.clone()).to_string()),
        started_at: start.started_at.clone(),
        max_duration_ms: start.max_duration_ms.map(|ms| ms.max(0) as u64),
    }
}

/// A call's task has stopped: its machine is told, and forgets the call once it is finished.
struct GoneOnDrop {
    agent: Arc<Agent>,
    key: CallKey,
}

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        let key = self.key;
        self.agent.with(|shared| {
            shared.router.handle_guest_gone(key);
            shared.wakers.remove(&key);
            shared.waiters.retain(|(k, _), _| *k != key);
        });
    }
}

/// A call listed live, until dropped.
struct Listed {
    stats: Arc<Stats>,
    session_id: String,
    key: CallKey,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.stats.live_end(&self.session_id, self.key.0);
    }
}

/// Starts call `key`'s task. An admitted call is listed live at once, before its task first runs: a
/// leaving host that takes a call back counts it from the moment it is taken.
pub(super) fn spawn(
    agent: &Arc<Agent>,
    key: CallKey,
    start: Box<SessionStart>,
    waker: Arc<Notify>,
    deployment: Arc<Deployment>,
    permit: Result<Permit, Refusal>,
    taken: Taken,
) {
    let force_trap = ForceTrap::new(waker.clone());
    let info = info_of(&start, Media::of(&start));
    let admitted = permit.map(|permit| {
        agent.stats.live_start(
            &start.session_id,
            key.0,
            LiveSession {
                info: info.clone(),
                version: deployment.version,
                force_trap: force_trap.clone(),
            },
        );
        let listed = Listed {
            stats: agent.stats.clone(),
            session_id: start.session_id.clone(),
            key,
        };
        (permit, listed)
    });
    crate::sandbox::spawn_call(run(
        agent.clone(),
        key,
        start,
        info,
        (waker, force_trap),
        deployment,
        admitted,
        taken,
    ));
}

/// Says and counts why a call was not admitted.
fn refused(stats: &Stats, session: &str, refusal: Refusal) {
    match refusal {
        Refusal::OverCap => {
            tracing::warn!(session, "over the session cap: applying the failure policy");
            stats.sessions_refused.inc();
        }
        Refusal::HostFull => {
            tracing::warn!(
                session,
                "no pool slot for the tenant (max_calls, less other tenants' reserved_calls, is in use): \
                 applying the failure policy"
            );
            stats.sessions_host_full.inc();
        }
    }
}

/// Serves one call until it ends or is lost. A call refused admission (over a session cap, or no pool
/// slot for its tenant) gets the failure policy at once, without a guest.
#[allow(clippy::too_many_arguments)]
async fn run(
    agent: Arc<Agent>,
    key: CallKey,
    start: Box<SessionStart>,
    info: CallInfo,
    (waker, force_trap): (Arc<Notify>, ForceTrap),
    deployment: Arc<Deployment>,
    admitted: Result<(Permit, Listed), Refusal>,
    taken: Taken,
) {
    // Forgotten by the router however the task ends.
    let _gone = GoneOnDrop {
        agent: agent.clone(),
        key,
    };
    let session_id = start.session_id.clone();
    let stats = agent.stats.clone();
    let saved = Arc::new(Mutex::new(taken.saved));
    let (permit, listed, refusal) = match admitted {
        Ok((permit, listed)) => (Some(permit), Some(listed), None),
        Err(refusal) => (None, None, Some(refusal)),
    };
    let task = Task {
        agent: agent.clone(),
        key,
        force_trap,
        waker,
        session_id: session_id.clone(),
        rules: deployment.rules.clone(),
        start,
        saved: saved.clone(),
        deployment: deployment.clone(),
        permit: Mutex::new(permit),
        leave_after: Mutex::new(taken.leave_after),
    };
    if let Some(refusal) = refusal {
        refused(&stats, &session_id, refusal);
        // Never listed live: it holds no room under the caps, and no instance.
        task.give_up().await;
        return;
    }
    // Off the live list (and, with the task's permit, out of its caps) however the task ends.
    let _listed = listed;
    let imports: Arc<dyn GuestImports> = Arc::new(CallImports {
        agent,
        key,
        info,
        session_id: session_id.clone(),
        saved,
        state_bytes: deployment.rules.state_bytes,
        stats,
    });
    if deployment.code.world().is_some_and(World::deprecated) {
        task.agent.stats.deprecated_world_calls.inc();
    }
    match Instance::new(&deployment.code, imports, deployment.rules.limits.clone()).await {
        Ok(instance) => task.serve(instance).await,
        Err(unmade) => {
            tracing::error!(session = session_id, kind = unmade.kind.as_str(), error = %unmade, "the agent could not be instantiated");
            task.agent.stats.trap(unmade.kind);
            task.give_up().await;
        }
    }
}

struct Task {
    agent: Arc<Agent>,
    key: CallKey,
    waker: Arc<Notify>,
    /// Set from outside the call: its instance is to be replaced as if it had trapped.
    force_trap: ForceTrap,
    session_id: String,
    rules: CallRules,
    /// Sent's `session.start`, for a handover.
    start: Box<SessionStart>,
    saved: Arc<Mutex<Saved>>,
    /// The version the call runs: a call taken back after no other host took it runs on it still.
    deployment: Arc<Deployment>,
    /// Its room under the caps and in the pool: handed out with the call while it is offered, so that
    /// the call finds its room again if it comes back.
    permit: Mutex<Option<Permit>>,
    /// When the host leaves, the call leaves at its first handler boundary from then.
    leave_after: Mutex<Instant>,
}

/// What the call's task does next.
enum Turn {
    /// Hands the guest an event.
    Event(GuestEvent),
    /// Replaces the instance as if it had trapped ([`ForceTrap`]).
    ForcedTrap,
    /// The host leaves: the call is to be handed over, between two handlers.
    Leave,
}

/// What follows a trap.
enum AfterTrap {
    /// A fresh instance gets `on-restart`.
    Restart(Event),
    /// The call's last event trapped: nothing follows.
    Nothing,
    /// The agent cannot serve the call (too many traps): its failure policy was asked for.
    GaveUp,
}

impl Task {
    /// What the call's task does next; `None` once the router has forgotten the call. A forced trap
    /// comes before the events waiting, so that it falls between the caller's turns where it was asked.
    async fn next(&self) -> Option<Turn> {
        loop {
            let notified = self.waker.notified();
            if self.force_trap.take() {
                return Some(Turn::ForcedTrap);
            }
            let leave_at = self.leave_at();
            if leave_at.is_some_and(|at| at <= Instant::now()) {
                return Some(Turn::Leave);
            }
            let (event, known) = self.agent.with(|shared| {
                let event = shared.router.poll_event(self.key);
                (event, shared.wakers.contains_key(&self.key))
            });
            if event.is_some() || !known {
                return event.map(Turn::Event);
            }
            match leave_at {
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// When the call is to leave: never unless the host leaves.
    fn leave_at(&self) -> Option<Instant> {
        let leaving = self
            .agent
            .leave
            .as_ref()
            .is_some_and(|leave| *leave.borrow());
        leaving.then(|| *self.leave_after.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Hands the call over, between two handlers: out of the router with its saved state, to whoever
    /// takes leaving calls. Returns false when it cannot leave now (tried again a little later).
    fn hand_over(&self) -> bool {
        let Some(out) = &self.agent.moves_out else {
            return false;
        };
        let saved: Vec<(String, Vec<u8>)> = self
            .saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let key = self.key;
        let handed = self
            .agent
            .with(|shared| shared.router.hand_over(Instant::now(), key));
        let call = match handed {
            Ok(call) => call,
            Err(why) => {
                tracing::debug!(session = self.session_id, ?why, "the call cannot leave now");
                *self.leave_after.lock().unwrap_or_else(|p| p.into_inner()) =
                    Instant::now() + LEAVE_AGAIN_AFTER;
                return false;
            }
        };
        let departure = Departure {
            call: MovingCall {
                call,
                start: start_without_token(&self.start),
                saved,
                version: self.deployment.version,
            },
            kept: Kept {
                permit: self.permit.lock().unwrap_or_else(|p| p.into_inner()).take(),
                deployment: self.deployment.clone(),
            },
        };
        if let Err(unsent) = out(departure) {
            // Nobody takes leaving calls any more: the call stays here, resumed on this host's connection.
            tracing::warn!(
                session = self.session_id,
                "nobody takes leaving calls: the call stays"
            );
            let unsent = *unsent;
            let (resumed, _) = oneshot::channel();
            self.agent.adopt(Arrival {
                call: unsent.call,
                kept: Some(unsent.kept),
                leave_after: Duration::from_secs(3600),
                resumed,
            });
        }
        true
    }

    /// The agent cannot serve the call: its failure policy; then only the end is awaited.
    async fn give_up(&self) {
        tracing::warn!(
            session = self.session_id,
            "the agent cannot serve the call: applying its failure policy"
        );
        self.force_trap.close();
        let key = self.key;
        self.agent
            .with(|shared| shared.router.handle_give_up(Instant::now(), key));
        self.agent.timers.notify_one();
        while let Some(turn) = self.next().await {
            if matches!(turn, Turn::Event(GuestEvent::End { .. } | GuestEvent::Lost)) {
                return;
            }
        }
    }

    /// A trap of `kind` was contained: counted, and against the call's trap window.
    async fn after_trap(&self, kind: TrapKind, last: bool, traps: &mut TrapWindow) -> AfterTrap {
        self.agent.stats.trap(kind);
        if traps.trapped(Instant::now()) {
            if last {
                return AfterTrap::Nothing;
            }
            self.give_up().await;
            return AfterTrap::GaveUp;
        }
        if last {
            return AfterTrap::Nothing;
        }
        self.agent.stats.restarts.inc();
        AfterTrap::Restart(Event::Restart(kind.into()))
    }

    async fn serve(&self, mut instance: Instance) {
        let stats = self.agent.stats.clone();
        let mut traps = TrapWindow::new(self.rules.max_traps, self.rules.trap_window);
        while let Some(turn) = self.next().await {
            let (last, mut next) = match turn {
                Turn::Event(event) => (
                    matches!(event, GuestEvent::End { .. } | GuestEvent::Lost),
                    Some(Event::from(event)),
                ),
                Turn::Leave => {
                    if self.hand_over() {
                        tracing::info!(session = self.session_id, "the call leaves this host");
                        return;
                    }
                    continue;
                }
                Turn::ForcedTrap => {
                    tracing::warn!(
                        session = self.session_id,
                        kind = TrapKind::Forced.as_str(),
                        "the agent's instance was made to trap: a fresh instance takes over"
                    );
                    instance.discard();
                    match self.after_trap(TrapKind::Forced, false, &mut traps).await {
                        AfterTrap::Restart(restart) => (false, Some(restart)),
                        AfterTrap::Nothing => (false, None),
                        AfterTrap::GaveUp => return,
                    }
                }
            };
            while let Some(event) = next.take() {
                let started = Instant::now();
                let outcome = instance.call(&event).await;
                let took = started.elapsed();
                stats.handled(&event, took);
                tracing::trace!(
                    session = self.session_id,
                    handler = event.name(),
                    took_us = took.as_micros() as u64,
                    "handler"
                );
                match outcome {
                    Outcome::Ok => {}
                    Outcome::Failed(message) => {
                        stats.handler_errors.inc();
                        // A guest failing every frame would log 50 lines a second.
                        if instance.may_log() {
                            tracing::warn!(
                                session = self.session_id,
                                handler = event.name(),
                                error = message,
                                "the handler failed"
                            );
                        }
                    }
                    Outcome::Trapped { kind, report } => {
                        // One line for the operator; the whole wasm backtrace only at debug.
                        tracing::warn!(
                            session = self.session_id,
                            handler = event.name(),
                            kind = kind.as_str(),
                            function = report.function.as_deref().unwrap_or("-"),
                            cause = report.cause,
                            "the agent trapped: a fresh instance takes over"
                        );
                        if !report.backtrace.is_empty() {
                            tracing::debug!(
                                session = self.session_id,
                                handler = event.name(),
                                backtrace = report.backtrace,
                                "the trap's wasm backtrace"
                            );
                        }
                        match self.after_trap(kind, last, &mut traps).await {
                            AfterTrap::Restart(restart) => next = Some(restart),
                            AfterTrap::Nothing => {}
                            AfterTrap::GaveUp => return,
                        }
                    }
                }
            }
            if last {
                return;
            }
        }
    }
}
