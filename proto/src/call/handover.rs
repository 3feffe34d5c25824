//! A call handed from one host to another (a rolling restart): everything the next host needs to resume
//! it with Sent and serve it from where it is, as data. The leaving host takes it out of its router at a
//! handler boundary ([`Call::hand_over`]); the next one makes a detached call of it ([`Call::adopted`]),
//! which its router carries to a connection with a `session.resume`. Sent's token is spent once: if both
//! hosts resume it, one of them is refused and loses its copy, so the call is served once.
//!
//! What a handover does not carry: caller audio queued for the guest (audio is dropped while a call
//! moves, as on any resume), the agent's audio not yet written, and the guest's tool calls still waiting
//! (their answers reach the new instance as results, once, as a timed-out call's late answer does).

use super::{
    window_of, Call, CallKey, CallLimits, Effects, FailurePolicy, Guest, GuestEvent, Kept, Media,
    Output, Owner, State, ToolAnswer, MAX_LATE_ANSWERS,
};
use crate::wire::{MAX_ID_CHARS, MAX_MESSAGE_BYTES, RETAINED_FRAMES};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// The state of one call that moves to another host.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// Sent's session id.
    pub session_id: String,
    /// The latest resume token: a secret, never logged (not in `Debug`).
    token: String,
    window_ms: u64,
    /// The call's audio rate; `None` for a text call.
    sample_rate: Option<u32>,
    /// Sent's counted frames read.
    received: u64,
    /// Our counted frames no longer kept, and the kept ones, oldest first, with the tool call each is.
    before: u64,
    kept: Vec<(String, Option<u64>)>,
    /// The last `call_ref` number issued.
    tools_issued: u64,
    /// The guest's tool calls whose answer has not reached it: the next instance gets each once.
    late: Vec<u64>,
    /// Whether the guest had its `on-session-start` (a call handed over before gets it on the next host).
    started: bool,
    /// Sent's frames read but not yet handed to the guest, in order.
    events: Vec<Pending>,
}

/// One of Sent's frames waiting for the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Pending {
    UserSaid {
        text: String,
        correction: bool,
    },
    ToolResult {
        call_ref: String,
        ok: bool,
        error: Option<(String, String)>,
    },
    Unknown {
        frame_type: String,
        json: String,
    },
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handover")
            .field("session_id", &self.session_id)
            .field("received", &self.received)
            .field("sent", &(self.before + self.kept.len() as u64))
            .field("tools_issued", &self.tools_issued)
            .field("started", &self.started)
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

/// Why a call cannot be handed over now (it finishes where it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmovable {
    /// Sent gave it no resume token.
    NoToken,
    /// It is not live on a connection (moving, detached, ended or lost).
    NotLive,
    /// Its failure policy runs, or its guest is gone: it ends here.
    GivenUp,
    /// Its end is queued for the guest.
    Ending,
}

/// The largest count a handover may carry (Sent's and ours, tool calls): far past any call's, and far
/// from where adding to it could overflow.
const MAX_COUNT: u64 = 1 << 48;

/// Whether `text` is one of a call's own counted frames, of session `id`: an `agent.say`, an
/// `agent.clear` or a `tool.call` numbered `t<tool>` within the `issued` ones. A handover's kept frames
/// are sent to Sent as they are: nothing else may be among them.
fn own_frame(text: &str, id: &str, tool: Option<u64>, issued: u64) -> bool {
    if text.len() > MAX_MESSAGE_BYTES {
        return false;
    }
    let Ok(serde_json::Value::Object(frame)) = serde_json::from_str(text) else {
        return false;
    };
    if frame.get("session_id").and_then(|v| v.as_str()) != Some(id) {
        return false;
    }
    match (frame.get("type").and_then(|v| v.as_str()), tool) {
        (Some("agent.say" | "agent.clear"), None) => true,
        (Some("tool.call"), Some(n)) => {
            n <= issued
                && frame.get("call_ref").and_then(|v| v.as_str()) == Some(&super::call_ref(n))
        }
        _ => false,
    }
}

/// Why a handover cannot be adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unadoptable {
    /// It holds more than a call may (kept frames, frames for the guest, late answers), or is malformed.
    Invalid,
    /// The session is served here already.
    Duplicate,
    /// Its media is not what the handover says (an audio rate out of range).
    Media,
}

impl Handover {
    /// The call's media.
    pub fn media(&self) -> Media {
        match self.sample_rate {
            Some(sample_rate) => Media::Audio { sample_rate },
            None => Media::Text,
        }
    }

    /// Sent's counted frames read, and ours sent (for the log and tests).
    pub fn counts(&self) -> (u64, u64) {
        (self.received, self.before + self.kept.len() as u64)
    }

    /// The resume token, to name the claim on it (hash it; never log it).
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Call {
    /// Takes the call out for another host, if it can move: live, with a token, served by its guest,
    /// nothing ending it. What is queued on its connection is retracted (the next host's replay brings
    /// it); the guest's waiting tool calls are answered `ended` here (that instance is done) and become
    /// late answers for the next. The call is finished here afterwards, and forgotten with its guest.
    pub fn hand_over(&mut self, fx: &mut Effects) -> Result<Handover, Unmovable> {
        let token = self.token.clone().ok_or(Unmovable::NoToken)?;
        let State::Live { conn, .. } = self.state else {
            return Err(Unmovable::NotLive);
        };
        if self.gave_up || self.guest != Guest::Serving {
            return Err(Unmovable::GivenUp);
        }
        if self.events.iter().any(GuestEvent::is_terminal)
            || self.waiting.iter().any(|w| w.owner != Owner::Guest)
        {
            return Err(Unmovable::Ending);
        }
        let started = !matches!(self.events.front(), Some(GuestEvent::Start));
        let events = self
            .events
            .iter()
            .filter_map(|event| match event {
                GuestEvent::UserSaid { text, correction } => Some(Pending::UserSaid {
                    text: text.clone(),
                    correction: *correction,
                }),
                GuestEvent::ToolResult(answer) => Some(Pending::ToolResult {
                    call_ref: answer.call_ref.clone(),
                    ok: answer.ok,
                    error: answer.error.clone(),
                }),
                GuestEvent::Unknown { frame_type, json } => Some(Pending::Unknown {
                    frame_type: frame_type.clone(),
                    json: json.clone(),
                }),
                // Audio is dropped while a call moves; the start is `started`.
                _ => None,
            })
            .collect();
        let mut late: Vec<u64> = self.timed_out.iter().map(|(n, _)| *n).collect();
        late.extend(self.waiting.iter().map(|w| w.n));
        let late = late.split_off(late.len().saturating_sub(MAX_LATE_ANSWERS));
        let handover = Handover {
            session_id: self.id.clone(),
            token,
            window_ms: self.window.as_millis() as u64,
            sample_rate: self.media.sample_rate(),
            received: self.received,
            before: self.before,
            kept: self.kept.iter().map(|k| (k.text.clone(), k.tool)).collect(),
            tools_issued: self.tools_issued,
            late,
            started,
            events,
        };
        fx.out.push_back(Output::Retract {
            conn,
            key: self.key,
        });
        self.end_guest_tools(fx);
        self.waiting.clear();
        self.timed_out.clear();
        self.state = State::Left;
        self.guest_gone();
        fx.stats.handed_over += 1;
        Ok(handover)
    }

    /// A call handed over by another host, detached until the router carries it to a connection: its
    /// guest (a fresh instance) first hears that the call moved ([`GuestEvent::Moved`]), or its start if
    /// it never had it, then the frames the last host had not handed to its guest. Sent holds the call for
    /// its window from `now` at the latest.
    pub fn adopted(
        key: CallKey,
        handover: Handover,
        limits: CallLimits,
        policy: FailurePolicy,
        now: Instant,
    ) -> Result<Call, Unadoptable> {
        let issued = handover.tools_issued;
        if handover.kept.len() > RETAINED_FRAMES
            || handover.late.len() > MAX_LATE_ANSWERS
            || handover.events.len() > limits.frame_backlog
            || handover.token.is_empty()
            || handover.token.len() > MAX_MESSAGE_BYTES
            || handover.session_id.is_empty()
            || handover.session_id.chars().count() > MAX_ID_CHARS
            || [handover.before, handover.received, issued]
                .iter()
                .any(|n| *n > MAX_COUNT)
            || handover.late.iter().any(|n| *n == 0 || *n > issued)
            || !handover
                .kept
                .iter()
                .all(|(text, tool)| own_frame(text, &handover.session_id, *tool, issued))
        {
            return Err(Unadoptable::Invalid);
        }
        if handover
            .sample_rate
            .is_some_and(|rate| !(1..=48_000).contains(&rate))
        {
            return Err(Unadoptable::Media);
        }
        let mut events = VecDeque::with_capacity(handover.events.len() + 1);
        events.push_back(if handover.started {
            GuestEvent::Moved
        } else {
            GuestEvent::Start
        });
        let mut queued = (0, 0);
        for pending in handover.events {
            let event = match pending {
                Pending::UserSaid { text, correction } => GuestEvent::UserSaid { text, correction },
                Pending::ToolResult {
                    call_ref,
                    ok,
                    error,
                } => GuestEvent::ToolResult(ToolAnswer {
                    call_ref,
                    ok,
                    error,
                }),
                Pending::Unknown { frame_type, json } => GuestEvent::Unknown { frame_type, json },
            };
            queued.0 += 1;
            queued.1 += super::event_bytes(&event);
            events.push_back(event);
        }
        if queued.1 > limits.frame_backlog_bytes {
            return Err(Unadoptable::Invalid);
        }
        let sent = handover.before + handover.kept.len() as u64;
        let window = window_of(Some(handover.window_ms.min(i64::MAX as u64) as i64));
        Ok(Call {
            key,
            id: handover.session_id,
            media: match handover.sample_rate {
                Some(sample_rate) => Media::Audio { sample_rate },
                None => Media::Text,
            },
            state: State::Detached,
            token: Some(handover.token),
            window,
            attached: None,
            window_ends: Some(now + window.max(Duration::from_secs(1))),
            received: handover.received,
            before: handover.before,
            kept: handover
                .kept
                .into_iter()
                .map(|(text, tool)| Kept { text, tool })
                .collect(),
            handed: sent,
            written: handover.before,
            written_base: handover.before,
            tools_issued: handover.tools_issued,
            waiting: Vec::new(),
            timed_out: handover.late.into_iter().map(|n| (n, true)).collect(),
            events,
            audio_queued: 0,
            frames_queued: queued,
            guest: Guest::Serving,
            gave_up: false,
            policy,
            limits,
        })
    }
}
