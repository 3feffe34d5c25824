//! Calls moving between hosts (a rolling restart in cluster mode): what one call carries when it leaves
//! this host ([`MovingCall`]: the core's [`Handover`] and the host's part of the call), and how an agent
//! is told to let its calls go and is handed calls to take ([`Moves`]). Where calls go and how they travel
//! is the tenancy's (`tenancy::handover`); this module only takes a call out at a handler boundary and
//! puts one in.

use super::admission::Permit;
use super::{call_task, Agent, Deployment};
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
    /// What the guest saved with `save`, as it was at the handler boundary the call left at (each value
    /// in base64: 4 bytes for 3, where JSON's numbers take about 3.5 for 1).
    #[serde(with = "saved_base64")]
    pub saved: Vec<(String, Vec<u8>)>,
    /// The version of the agent that served it (a fresh instance of the same version takes over).
    pub version: u32,
}

/// [`MovingCall::saved`] in JSON: `[key, base64]` pairs.
mod saved_base64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        saved: &[(String, Vec<u8>)],
        out: S,
    ) -> Result<S::Ok, S::Error> {
        let encoded: Vec<(&str, String)> = saved
            .iter()
            .map(|(key, value)| (key.as_str(), STANDARD.encode(value)))
            .collect();
        encoded.serialize(out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        Vec::<(String, String)>::deserialize(from)?
            .into_iter()
            .map(|(key, value)| Ok((key, STANDARD.decode(value).map_err(D::Error::custom)?)))
            .collect()
    }
}

/// A call leaving this host: what travels, and what stays here while it is offered.
pub struct Departure {
    /// What travels to the next host.
    pub call: MovingCall,
    /// What this host keeps for the call, should it come back.
    pub kept: Kept,
}

/// What a leaving host keeps for a call while it offers it: its room here (under the caps and in the
/// pool, so that it finds it again if no other host takes it), and the version it runs.
pub struct Kept {
    pub(super) permit: Option<Permit>,
    pub(super) deployment: Arc<Deployment>,
}

/// A call handed to this agent.
pub struct Arrival {
    /// The call.
    pub call: MovingCall,
    /// What this host kept for it, when it is one of its own coming back.
    pub kept: Option<Kept>,
    /// How long before the call may leave again, if this host is leaving itself (a call it took back
    /// after no peer took it).
    pub leave_after: Duration,
    /// Told whether Sent resumed the call here (`false`: it was refused, lost, or could not be taken).
    pub resumed: oneshot::Sender<bool>,
}

/// Takes a call leaving the host; gives it back when nobody takes leaving calls any more.
pub type LeavingSink = Arc<dyn Fn(Departure) -> Result<(), Box<Departure>> + Send + Sync>;

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
            kept,
            leave_after,
            resumed,
        } = arrival;
        let session_id = moving.call.session_id.clone();
        // One of this host's own comes back to its version and its room; another's gets the version
        // served here (the offer was checked to be the same) and a pool slot.
        let (deployment, permit) = match kept {
            Some(Kept {
                deployment,
                permit: Some(permit),
            }) => (deployment, Ok(permit)),
            Some(Kept { deployment, .. }) => {
                let permit = self.admission.admit_moved(deployment.code.pool_slots());
                (deployment, permit)
            }
            None => {
                let deployment = self.deployment.borrow().clone();
                let permit = self.admission.admit_moved(deployment.code.pool_slots());
                (deployment, permit)
            }
        };
        if let Err(why) = check(&moving, &deployment) {
            tracing::warn!(
                session = session_id,
                why,
                "a call handed over cannot be taken"
            );
            let _ = resumed.send(false);
            return None;
        }
        let permit = match permit {
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
        call_task::spawn(
            self,
            key,
            Box::new(moving.start),
            waker,
            deployment,
            Ok(permit),
            call_task::Taken {
                saved: moving.saved.into_iter().collect(),
                leave_after: Instant::now() + leave_after,
            },
        );
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

/// Whether a call handed over fits what this host serves: its session is the one its start names, its
/// media what the start says, its saved state within the version's bound.
fn check(moving: &MovingCall, deployment: &Deployment) -> Result<(), &'static str> {
    if moving.start.session_id != moving.call.session_id {
        return Err("its session.start is another session's");
    }
    if voicehost_proto::call::Media::of(&moving.start) != moving.call.media() {
        return Err("its media is not what its session.start says");
    }
    let saved: usize = moving
        .saved
        .iter()
        .map(|(k, v)| call_task::saved_bytes(k, v))
        .fold(0, usize::saturating_add);
    if saved > deployment.rules.state_bytes {
        return Err("its saved state is over the agent's bound");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Saved(#[serde(with = "super::saved_base64")] Vec<(String, Vec<u8>)>);

    #[test]
    fn saved_values_travel_in_base64_and_come_back_whole() {
        let saved = Saved(vec![
            ("count".into(), vec![0, 1, 2, 255]),
            ("empty".into(), vec![]),
        ]);
        let json = serde_json::to_string(&saved).unwrap();
        assert_eq!(json, r#"[["count","AAEC/w=="],["empty",""]]"#);
        assert_eq!(serde_json::from_str::<Saved>(&json).unwrap(), saved);
    }

    #[test]
    fn a_saved_value_that_is_not_base64_is_refused() {
        assert!(serde_json::from_str::<Saved>(r#"[["count","not base64!"]]"#).is_err());
        assert!(serde_json::from_str::<Saved>(r#"[["count",[0,1,2]]]"#).is_err());
    }
}
