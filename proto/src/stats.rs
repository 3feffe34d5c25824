//! What the core counts, as plain numbers: the router's own and its calls' together, read with
//! [`crate::Router::stats`]. The host exports them (to Prometheus); the core knows nothing of how.

/// Counts of one agent's router and every call it has held. Each only grows, but `connections_open`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Connections to Sent that reached `connection.ready` and were kept.
    pub connections_opened: u64,
    /// Connections to Sent open now: ready, and not yet closed.
    pub connections_open: u64,
    /// Calls started by a `session.start` (a duplicate one starts none).
    pub sessions_started: u64,
    /// Calls that ended with Sent's `session.end`.
    pub sessions_ended: u64,
    /// Calls lost: their connection went with no token to resume, a resume failed or went unanswered, the
    /// resume window passed, or the agent stopped.
    pub sessions_lost: u64,
    /// Sent's counted session frames read by the calls (what each call's `received` counts).
    pub frames_in: u64,
    /// The calls' counted frames handed to a connection, replays included (a `session.resume` or a pong is
    /// not counted).
    pub frames_out: u64,
    /// Caller audio messages queued for a call's guest.
    pub audio_in: u64,
    /// The agent's audio messages handed to a connection, after cutting into messages of at most 200 ms.
    pub audio_out: u64,
    /// Caller audio dropped: the guest was behind, or the call ended with audio still queued for it.
    pub audio_dropped: u64,
    /// The agent's audio dropped by the core: past what may wait for the socket, sent without a stream
    /// (while moving, after the end).
    pub audio_out_dropped: u64,
    /// Frames the router ignored: a second `session.start` for a session, a stream already taken.
    pub frames_invalid: u64,
    /// Sent's frames not delivered to a guest that could not keep up (the call got its failure policy).
    pub frames_dropped: u64,
    /// Calls carried to a connection: `session.resumed` answered their `session.resume`.
    pub resumes: u64,
    /// Calls given their failure policy (once per call at most).
    pub policies_applied: u64,
    /// Calls handed over to another host ([`crate::call::Call::hand_over`]).
    pub handed_over: u64,
    /// Calls handed over by another host and taken here ([`crate::Router::adopt`]).
    pub adopted: u64,
}
