//! Calls moving between hosts (a rolling restart in cluster mode): what one call carries when it leaves
//! this host ([`MovingCall`]: the core's [`Handover`] and the host's part of the call), and how an agent
//! is told to let its calls go and is handed calls to take ([`Moves`]). Where calls go and how they travel
//! is the tenancy's (`tenancy::handover`); this module only takes a call out at a handler boundary and
//! puts one in.

use super::{call_task, Agent};
use sentdm_voice_agents::frames::SessionStart;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use voicehost_proto::call::{CallKey, Handover, Place, Unadoptable};

/// One call leaving this host, or arriving from another.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MovingCall {
    /// The protocol's state of the call (its token inside: never logged).
    pub call: Handover,
    /// Sent's `session.start`, for the call's info, without its resume token.
    pub start: SessionStart,
    /// What the guest saved with `save`, as it was at the handler boundary the call left at.
    pub saved: Vec<(String, Vec<u8>)>,
    /// The version of the agent that served it (a fresh instance of the same version takes over).
    pub version: u32,
}

/// A call handed to this agent.
pub struct Arrival {
    /// The call.
    pub call: MovingCall,
    /// How long before the call may leave again, if this host is leaving itself (a call it took back
    /// after no peer took it).
    pub leave_after: Duration,
    /// Told whether Sent resumed the call here (`false`: it was refused, lost, or could not be taken).
    pub resumed: oneshot::Sender<bool>,
}

/// Takes a call leaving the host; gives it back when nobody takes leaving calls any more.
pub type LeavingSink = Arc<dyn Fn(MovingCall) -> Result<(), Box<MovingCall>> + Send + Sync>;

/// Where an agent's calls go when the host leaves, and where calls come from.
pub struct Moves {
    /// Turns true when the host leaves: each call that can move leaves at its next handler boundary.
    pub leave: watch::Receiver<bool>,
    /// Where leaving calls go (in the order they leave).
    pub out: LeavingSink,
    /// Calls handed to this agent: adopted, and resumed on one of its connections.
    pub arrive: mpsc::Receiver<Arrival>,
}

/// An arrival waiting for Sent's answer to its resume.
pub(super) struct Resuming {
    key: CallKey,
    session_id: String,
    resumed: oneshot::Sender<bool>,
}

impl Resuming {
    /// Whether the call's resume has been answered (and the arrival told), judging by where it is now.
    pub(super) fn settled(self, place: Option<Place>) -> Option<Resuming> {
        let resumed = match place {
            Some(Place::Live { .. }) => true,
            Some(Place::Done) | None => false,
            Some(Place::Moving { .. } | Place::Detached { .. }) => return Some(self),
        };
        tracing::info!(
            session = self.session_id,
            resumed,
            "a call handed over by another host"
        );
        let _ = self.resumed.send(resumed);
        None
    }
}

/// The strip of `start` a [`MovingCall`] carries: the resume token is the handover's, not repeated.
pub(super) fn start_without_token(start: &SessionStart) -> SessionStart {
    SessionStart {
        resume: None,
        ..start.clone()
    }
}

impl Agent {
    /// Takes `arrival`'s call: adopted by the router (which sends its `session.resume`), its guest's task
    /// started with the call's saved state. Returns what waits for Sent's answer, or tells the arrival
    /// at once that it was not taken.
    pub(super) fn adopt(self: &Arc<Agent>, arrival: Arrival) -> Option<Resuming> {
        let Arrival {
            call: moving,
            leave_after,
            resumed,
        } = arrival;
        let session_id = moving.call.session_id.clone();
        let deployment = self.deployment.borrow().clone();
        let permit = match self.admission.admit_moved(deployment.code.pool_slots()) {
            Ok(permit) => permit,
            Err(refusal) => {
                tracing::warn!(
                    session = session_id,
                    ?refusal,
                    "a call handed over: no room here"
                );
                let _ = resumed.send(false);
                return None;
            }
        };
        let waker = Arc::new(Notify::new());
        let adopted = self.with(|shared| {
            let key = shared.router.adopt(Instant::now(), moving.call)?;
            shared.wakers.insert(key, waker.clone());
            Ok::<_, Unadoptable>(key)
        });
        let key = match adopted {
            Ok(key) => key,
            Err(why) => {
                tracing::warn!(
                    session = session_id,
                    ?why,
                    "a call handed over cannot be taken"
                );
                let _ = resumed.send(false);
                return None;
            }
        };
        tracing::info!(
            session = session_id,
            version = deployment.version,
            from_version = moving.version,
            "taking a call handed over"
        );
        crate::sandbox::spawn_call(call_task::run(
            self.clone(),
            key,
            Box::new(moving.start),
            waker,
            deployment,
            Ok(permit),
            call_task::Taken {
                saved: moving.saved.into_iter().collect(),
                leave_after: Instant::now() + leave_after,
            },
        ));
        self.timers.notify_one();
        Some(Resuming {
            key,
            session_id,
            resumed,
        })
    }

    /// Where arrival `resuming`'s call is now, for [`Resuming::settled`].
    pub(super) fn place_of(&self, key: CallKey) -> Option<Place> {
        self.lock().router.place_of(key)
    }
}

impl Resuming {
    pub(super) fn key(&self) -> CallKey {
        self.key
    }
}
