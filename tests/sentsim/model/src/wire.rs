//! The wire as Sent reads it: the official codec (`sentdm_voice_agents::frames`) plus the rules the codec
//! leaves to the reader (who may send a frame, and in which session type), and the binary audio header.

use sentdm_voice_agents::frames::{self, Frame, FROM_AGENT, UNCOUNTED};
use serde_json::Value;

/// Why a frame from the agent was refused. Each becomes an `error` frame with this code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The protocol's error code, such as `invalid_frame` or `frame_not_allowed`.
    pub code: &'static str,
    /// What exactly was wrong, for the `error` frame's `message`.
    pub message: String,
}

impl Refusal {
    fn new(code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// An agent frame Sent accepted, with what the protocol says about it.
#[derive(Debug, Clone)]
pub struct AgentFrame {
    /// The frame as the official codec decoded it.
    pub frame: Frame,
    /// The frame's JSON as the agent sent it, for the recorder.
    pub json: Value,
}

impl AgentFrame {
    /// The frame's `type`, such as `agent.say`.
    pub fn frame_type(&self) -> &str {
        self.frame.frame_type()
    }

    /// The session the frame is for; `None` for a connection frame.
    pub fn session_id(&self) -> Option<&str> {
        self.frame.session_id()
    }
}

/// Whether a frame of this type counts towards `received` (Counting frames in the protocol).
pub fn counted(frame_type: &str) -> bool {
    !UNCOUNTED.contains(&frame_type)
}

/// The frame a text message from the agent carries, checked as Sent checks it: the schema (official codec),
/// the direction, and (given the session's type, when the frame names a known session) the session type.
pub fn decode_from_agent(text: &str) -> Result<AgentFrame, Refusal> {
    let json: Value = serde_json::from_str(text)
        .map_err(|e| Refusal::new("invalid_frame", format!("not JSON: {e}")))?;
    let frame =
        frames::decode_value(json.clone()).map_err(|e| Refusal::new("invalid_frame", e.message))?;
    if !FROM_AGENT.contains(&frame.frame_type()) {
        return Err(Refusal::new(
            "frame_not_allowed",
            format!("{} is not a frame an agent sends", frame.frame_type()),
        ));
    }
    Ok(AgentFrame { frame, json })
}

/// Refuses a session frame the session's type does not allow (an `agent.say` in an audio session).
pub fn check_session_type(frame_type: &str, session_type: &str) -> Result<(), Refusal> {
    match frames::session_types(frame_type) {
        Some(allowed) if !allowed.contains(&session_type) => Err(Refusal::new(
            "frame_not_allowed",
            format!("{frame_type} is not allowed in a {session_type} session"),
        )),
        _ => Ok(()),
    }
}

/// The JSON text of a frame Sent sends, through the official encoder so the simulator never sends what the
/// protocol forbids by accident. Scenarios that send invalid frames on purpose use raw text.
pub fn encode(frame: Frame) -> String {
    match frames::encode_to_string(&frame) {
        Ok(text) => text,
        // Only the simulator builds these frames: a failure is a bug in the simulator itself.
        Err(e) => panic!("the simulator built an invalid {}: {e}", frame.frame_type()),
    }
}

/// A binary audio message: the stream number, big-endian, then the samples untouched.
pub fn audio_message(stream: u16, samples: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(2 + samples.len());
    message.extend_from_slice(&stream.to_be_bytes());
    message.extend_from_slice(samples);
    message
}

/// The stream and samples of a binary message from the agent.
pub fn split_audio(message: &[u8]) -> Result<(u16, &[u8]), Refusal> {
    if message.len() < 2 {
        return Err(Refusal::new(
            "invalid_frame",
            "a binary message starts with a 2-byte stream number",
        ));
    }
    let samples = &message[2..];
    if samples.len() % 2 != 0 {
        return Err(Refusal::new(
            "invalid_frame",
            "audio is a whole number of 16-bit samples",
        ));
    }
    Ok((u16::from_be_bytes([message[0], message[1]]), samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_say_from_the_agent_is_accepted_and_counts() {
        let frame = decode_from_agent(r#"{"type":"agent.say","session_id":"vs_1","text":"hi"}"#)
            .expect("valid");
        assert_eq!(frame.frame_type(), "agent.say");
        assert!(counted(frame.frame_type()));
        assert!(!counted("session.resume"));
    }

    #[test]
    fn frames_in_the_wrong_direction_are_not_allowed() {
        let refusal = decode_from_agent(r#"{"type":"ping","ts":1}"#).unwrap_err();
        assert_eq!(refusal.code, "frame_not_allowed");
        let refusal =
            decode_from_agent(r#"{"type":"session.note","session_id":"vs_1"}"#).unwrap_err();
        assert_eq!(refusal.code, "frame_not_allowed");
    }

    #[test]
    fn frames_that_break_the_schema_are_invalid() {
        let refusal =
            decode_from_agent(r#"{"type":"agent.say","session_id":"vs_1","text":""}"#).unwrap_err();
        assert_eq!(refusal.code, "invalid_frame");
        assert!(
            refusal.message.contains("shorter than 1"),
            "{}",
            refusal.message
        );
        assert_eq!(
            decode_from_agent("{nope").unwrap_err().code,
            "invalid_frame"
        );
    }

    #[test]
    fn a_say_is_not_allowed_in_an_audio_session() {
        assert_eq!(
            check_session_type("agent.say", "audio").unwrap_err().code,
            "frame_not_allowed"
        );
        assert!(check_session_type("tool.call", "audio").is_ok());
    }

    #[test]
    fn audio_keeps_its_stream_and_whole_samples() {
        let message = audio_message(258, &[1, 2, 3, 4]);
        assert_eq!(message, [1, 2, 1, 2, 3, 4]);
        assert_eq!(split_audio(&message).unwrap(), (258, &[1u8, 2, 3, 4][..]));
        assert!(split_audio(&[0, 1, 2]).is_err());
        assert!(split_audio(&[0]).is_err());
    }
}
