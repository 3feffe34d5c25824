//! What the call core's tests share: a `session.start` as Sent writes one.

use sentdm_voice_agents::frames::{Party, Resume, SessionStart, SessionStartAudio};

/// Sent's `session.start` for `session_id`: a text call, or an audio call at 16 kHz on `stream`; resumable
/// with `token` for `window_ms` when a token is given.
pub(crate) fn session_start(
    session_id: &str,
    stream: Option<i64>,
    token: Option<String>,
    window_ms: i64,
) -> SessionStart {
    SessionStart {
        session_id: session_id.into(),
        call_id: "call_1".into(),
        agent_id: "agent_1".into(),
        direction: "inbound".into(),
        from: Party {
            kind: "number".into(),
            value: Some("+14155550100".into()),
        },
        to: Party {
            kind: "agent".into(),
            value: Some("agent_1".into()),
        },
        session_type: if stream.is_some() { "audio" } else { "text" }.into(),
        language: None,
        audio: stream.map(|stream| SessionStartAudio {
            stream,
            sample_rate: Some(16000),
        }),
        max_duration_ms: None,
        context: None,
        resume: token.map(|token| Resume { token, window_ms }),
        started_at: "2026-12-01T00:00:00Z".into(),
    }
}
