//! The wire: the official codec (`sentdm_voice_agents::frames`, generated from the protocol's schemas), the
//! binary audio header, the size limits of what Sent may send, and the intake that turns what arrives into
//! frames the host acts on (or refuses, with a reason that quotes nothing from the frame).

pub use sentdm_voice_agents::frames::{
    self, Frame, CONNECT_PATH, FROM_SENT, RETAINED_FRAMES, SUBPROTOCOL, UNCOUNTED,
};

/// The `pong` answering a `ping`'s `ts` (one place builds it, for the router and for a connection that is
/// not ready yet).
pub fn pong(ts: i64) -> String {
    frames::encode_to_string(&Frame::Pong(frames::Pong { ts }))
        .unwrap_or_else(|_| format!(r#"{{"type":"pong","ts":{ts}}}"#))
}

/// Whether a session frame of this type counts towards `received` (Counting frames in the protocol).
pub fn counted(frame_type: &str) -> bool {
    !UNCOUNTED.contains(&frame_type)
}

/// The size of the stream number in front of the samples of a binary audio message.
pub const AUDIO_HEADER: usize = 2;

/// The largest WebSocket message (and frame) the host reads. The largest valid text frame is a `user.said`
/// of 4096 characters, each escaped to six bytes (about 25 KiB); 200 ms of 24 kHz audio is 9.6 KB. A
/// quarter of a MiB leaves room for fields Sent may add and bounds what one message can cost.
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;

/// The longest id (`session_id`, `call_id`, `agent_id`) the host accepts from Sent. The protocol gives no
/// length; Sent's ids are a prefix and a UUID.
pub const MAX_ID_CHARS: usize = 128;

/// The most audio one binary message to Sent may carry (the protocol: at most 200 ms per message).
pub const MAX_AUDIO_MS_PER_MESSAGE: u32 = 200;

/// The stream number of a binary audio message, or `None` when it is too short to have one.
pub fn stream_of(message: &[u8]) -> Option<u16> {
    (message.len() >= AUDIO_HEADER).then(|| u16::from_be_bytes([message[0], message[1]]))
}

/// Why something Sent sent was dropped. The message never quotes the frame (it may hold a resume token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The text does not decode as a frame of the official codec: the codec's message, made [`loggable`].
    #[error("not a valid frame: {0}")]
    Schema(String),
    /// A frame of a type only the agent sends (`agent.say`, `pong`, …): the type.
    #[error("a {0} frame only goes from the agent to Sent")]
    WrongDirection(&'static str),
    /// An id (`session_id`, `call_id` or `agent_id`) longer than [`MAX_ID_CHARS`] characters.
    #[error("its {field} is longer than {MAX_ID_CHARS} characters")]
    IdTooLong {
        /// Which id: `session_id`, `call_id` or `agent_id`.
        field: &'static str,
    },
    /// A binary message shorter than [`AUDIO_HEADER`]: its length in bytes.
    #[error("a binary message of {0} bytes is too short for a stream number")]
    ShortAudio(usize),
    /// A binary message with a stream number and not one whole sample: its length in bytes.
    #[error("a binary message of {0} bytes carries no sample")]
    NoSamples(usize),
}

/// What Sent sent, once read.
#[derive(Debug, Clone, PartialEq)]
pub enum FromSent {
    /// `ping`: answered with a pong carrying the same `ts`.
    Ping(i64),
    /// Any other frame (a session frame of an unknown type included).
    Frame(Box<Frame>),
}

/// Reads one text message from Sent: it must decode with the official codec, be a frame Sent sends (or of
/// an unknown type), and carry ids of sane length.
/// [scenario: wrong_direction_frames_not_counted, invalid_frames_from_sent_ignored]
pub fn read_text(text: &str) -> Result<FromSent, Invalid> {
    let frame = frames::decode(text).map_err(|e| Invalid::Schema(loggable(&e.message)))?;
    let frame_type = frame.frame_type().to_string();
    if let Some(agent_only) = frames::FROM_AGENT.iter().find(|t| **t == frame_type) {
        return Err(Invalid::WrongDirection(agent_only));
    }
    check_ids(&frame)?;
    Ok(match frame {
        Frame::Ping(ping) => FromSent::Ping(ping.ts),
        frame => FromSent::Frame(Box::new(frame)),
    })
}

/// Reads one binary message from Sent: its stream number and samples (a trailing odd byte is not a sample).
/// One without a sample carries nothing, and would cost the call an event for nothing: it is refused.
pub fn read_binary(data: &[u8]) -> Result<(u16, &[u8]), Invalid> {
    let stream = stream_of(data).ok_or(Invalid::ShortAudio(data.len()))?;
    let samples = &data[AUDIO_HEADER..];
    let samples = &samples[..samples.len() & !1];
    if samples.is_empty() {
        return Err(Invalid::NoSamples(data.len()));
    }
    Ok((stream, samples))
}

/// [scenario: overlong_session_id_dropped]
fn check_ids(frame: &Frame) -> Result<(), Invalid> {
    let long = |id: &str| id.chars().count() > MAX_ID_CHARS;
    if frame.session_id().is_some_and(long) {
        return Err(Invalid::IdTooLong {
            field: "session_id",
        });
    }
    match frame {
        Frame::SessionStart(start) if long(&start.call_id) => {
            Err(Invalid::IdTooLong { field: "call_id" })
        }
        Frame::SessionStart(start) if long(&start.agent_id) => {
            Err(Invalid::IdTooLong { field: "agent_id" })
        }
        Frame::ErrorFrame(error) if error.session_id.as_deref().is_some_and(long) => {
            Err(Invalid::IdTooLong {
                field: "session_id",
            })
        }
        _ => Ok(()),
    }
}

/// A message for the log without anything quoted in it (a value from the frame, in double quotes or
/// backticks), without anything that looks like a resume token, and not too long.
pub fn loggable(message: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for c in message.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '`' => {
                out.push(c);
                out.push('…');
                out.push(c);
                quote = Some(c);
            }
            None => out.push(c),
        }
        if out.len() > 200 {
            out.push('…');
            break;
        }
    }
    redact_tokens(&out)
}

/// `text` with every resume token (`vsr_…`) masked.
pub fn redact_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("vsr_") {
        out.push_str(&rest[..at]);
        out.push_str("vsr_…");
        let tail = &rest[at + 4..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_only_the_agent_sends_is_refused() {
        let say = r#"{"type":"agent.say","session_id":"vs_1","text":"hi"}"#;
        assert_eq!(read_text(say), Err(Invalid::WrongDirection("agent.say")));
        let pong = r#"{"type":"pong","ts":1}"#;
        assert_eq!(read_text(pong), Err(Invalid::WrongDirection("pong")));
    }

    #[test]
    fn a_ping_is_read_apart_from_the_other_frames() {
        assert_eq!(
            read_text(r#"{"type":"ping","ts":42}"#),
            Ok(FromSent::Ping(42))
        );
    }

    #[test]
    fn an_overlong_session_id_is_refused_even_on_an_unknown_frame() {
        let id = format!("vs_{}", "a".repeat(MAX_ID_CHARS));
        let said = format!(r#"{{"type":"user.said","session_id":"{id}","text":"hi"}}"#);
        assert!(matches!(read_text(&said), Err(Invalid::IdTooLong { .. })));
        let unknown = format!(r#"{{"type":"session.note","session_id":"{id}"}}"#);
        assert!(matches!(
            read_text(&unknown),
            Err(Invalid::IdTooLong { .. })
        ));
    }

    #[test]
    fn a_schema_error_quotes_nothing_of_the_frame() {
        let text =
            r#"{"type":"session.resume","session_id":"vs_1","token":"vsr_secret","received":1}"#;
        // A frame of the agent's: refused by direction, before anything else.
        assert!(read_text(text).is_err());
        let bad = r#"{"type":"user.said","session_id":"vs_1","text":"","x":"vsr_secret_token_value_here"}"#;
        let Err(Invalid::Schema(message)) = read_text(bad) else {
            panic!("expected a schema error");
        };
        assert!(!message.contains("vsr_"), "{message}");
    }

    #[test]
    fn a_log_line_quotes_nothing_and_masks_tokens() {
        assert_eq!(
            loggable("unknown variant `vsr_abc`, expected \"x\""),
            "unknown variant `…`, expected \"…\""
        );
        assert_eq!(redact_tokens("a vsr_0123-x_y b"), "a vsr_… b");
        assert_eq!(redact_tokens("no token"), "no token");
    }

    #[test]
    fn audio_is_split_into_its_stream_and_whole_samples() {
        assert_eq!(read_binary(&[0, 7, 1, 2, 3]), Ok((7, &[1u8, 2][..])));
        assert_eq!(read_binary(&[1]), Err(Invalid::ShortAudio(1)));
        assert_eq!(read_binary(&[0, 7]), Err(Invalid::NoSamples(2)));
        assert_eq!(read_binary(&[0, 7, 1]), Err(Invalid::NoSamples(3)));
    }
}
