//! What Sent saw, as records: each frame both ways, each audio message, each open and close.

use crate::wire::{self, AgentFrame};
use serde_json::Value;

/// Which way a record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Sent → agent.
    ToAgent,
    /// Agent → Sent.
    FromAgent,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum What {
    /// A handshake was accepted: the connection is open.
    Opened,
    /// A handshake was refused with this HTTP status.
    Refused {
        /// The HTTP status: 400, 401, 403 or 404 for a faulty handshake, or whatever a plan asked for.
        status: u16,
    },
    /// A frame, valid for the protocol. `counted` says whether it counts towards `received`.
    Frame {
        /// The frame's `type`, such as `agent.say`.
        frame_type: String,
        /// The whole frame as it went over the wire.
        json: Value,
        /// Whether it is a session frame of a counted type: one that moves the receiver's `received`.
        counted: bool,
    },
    /// A binary audio message.
    Audio {
        /// The stream number from the message's 2-byte header: which session's audio it is.
        stream: u16,
        /// The audio bytes after the header, 16-bit samples as they went over the wire.
        samples: Vec<u8>,
    },
    /// Text Sent sent as is (invalid on purpose), or the agent sent and Sent refused.
    Raw {
        /// The text as it went over the wire.
        text: String,
    },
    /// The connection closed; `how` says who closed it and how.
    Closed {
        /// Who closed it and how, such as "dropped by Sent" or "closed by the agent with 1000".
        how: String,
    },
}

/// The record of a frame Sent accepted from the agent.
pub(crate) fn of_frame(frame: &AgentFrame) -> What {
    What::Frame {
        frame_type: frame.frame_type().into(),
        json: frame.json.clone(),
        counted: wire::counted(frame.frame_type()) && frame.session_id().is_some(),
    }
}

/// The record of a text Sent sends: a frame when it parses as one, raw text otherwise.
pub(crate) fn of_text(text: &str) -> What {
    match serde_json::from_str::<Value>(text) {
        Ok(json) if json.get("type").and_then(Value::as_str).is_some() => {
            let frame_type = json["type"].as_str().unwrap_or_default().to_string();
            let counted = wire::counted(&frame_type) && json.get("session_id").is_some();
            What::Frame {
                frame_type,
                json,
                counted,
            }
        }
        _ => What::Raw { text: text.into() },
    }
}

pub(crate) fn session_of(text: &str) -> Option<String> {
    let json: Value = serde_json::from_str(text).ok()?;
    json.get("session_id")?.as_str().map(str::to_string)
}

pub(crate) fn type_of(text: &str) -> Option<String> {
    let json: Value = serde_json::from_str(text).ok()?;
    json.get("type")?.as_str().map(str::to_string)
}
