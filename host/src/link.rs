//! All connections of one agent: opening them with backoff, routing Sent's frames and audio to sessions,
//! draining, `connection_full`, and moving sessions between connections. One task owns all of it, so the
//! routing tables need no lock; sessions are reached by `session_id` or by stream number per connection.

use crate::admission::Admission;
use crate::connection::{ConnectError, Connection, Dial, Incoming, Outgoing};
use crate::protocol::{stream_of, Frame, AUDIO_HEADER};
use crate::sandbox::AgentCode;
use crate::session::{self, CallRules, Session};
use crate::stats::Stats;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The longest wait before another attempt to connect.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// One version of an agent, ready to serve calls.
pub struct Deployment {
    /// The version number in the registry (0 when the agent was not uploaded, as with `voicehost run`).
    pub version: u32,
    pub code: AgentCode,
    pub rules: CallRules,
}

/// One agent as the host serves it.
#[derive(Clone)]
pub struct AgentConfig {
    pub dial: Dial,
    /// What new calls get. Activating a version replaces it; a live call keeps the one it started with.
    pub deployment: watch::Receiver<Arc<Deployment>>,
    /// How many connections to hold at once (more when draining or after `connection_full`).
    pub connections: usize,
    /// The caps on concurrent calls this agent's calls fall under.
    pub admission: Admission,
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
        }
    }
}

/// The delay before connection attempt `attempt` (0, 1, 2, 4, 8, 16, then 30 s), as the official SDKs.
pub fn backoff(attempt: u32) -> Duration {
    if attempt == 0 {
        Duration::ZERO
    } else {
        MAX_BACKOFF.min(Duration::from_secs(1u64 << (attempt - 1).min(5)))
    }
}

struct Conn {
    conn: Connection,
    draining: bool,
    sessions: HashSet<String>,
    streams: HashMap<u16, String>,
}

enum Dialed {
    Opened(Connection, Vec<Arc<Session>>),
    Failed(ConnectError, Vec<Arc<Session>>),
}

struct Link {
    config: AgentConfig,
    stats: Arc<Stats>,
    conns: HashMap<u64, Conn>,
    sessions: HashMap<String, Arc<Session>>,
    /// Sessions on their way to a connection being dialled.
    carried: HashSet<String>,
    next_id: u64,
    attempt: u32,
    events: mpsc::UnboundedSender<(u64, Incoming)>,
    dialed: mpsc::UnboundedSender<Dialed>,
    /// Dials under way: aborted when the link stops, so a stopped agent never connects again.
    dialing: Vec<tokio::task::JoinHandle<()>>,
}

/// Serves the agent's calls until `stop` turns true. Fails only when Sent refuses the connection for a
/// reason that needs a person (400, 401, 403, 404).
pub async fn serve(
    config: AgentConfig,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConnectError> {
    let (events, mut incoming) = mpsc::unbounded_channel();
    let (dialed, mut dials) = mpsc::unbounded_channel();
    let mut link = Link {
        config,
        stats,
        conns: HashMap::new(),
        sessions: HashMap::new(),
        carried: HashSet::new(),
        next_id: 1,
        attempt: 0,
        events,
        dialed,
        dialing: Vec::new(),
    };
    for _ in 0..link.config.connections.max(1) {
        link.dial(Vec::new(), Duration::ZERO);
    }
    let result = loop {
        tokio::select! {
            Some((id, event)) = incoming.recv() => link.on_event(id, event),
            Some(dial) = dials.recv() => {
                if let Err(error) = link.on_dialed(dial) {
                    break Err(error);
                }
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break Ok(());
                }
            }
        }
    };
    for dial in &link.dialing {
        dial.abort();
    }
    // Every connection closes with 1000: Sent sends the calls to their fallback at once.
    for conn in link.conns.values() {
        conn.conn.send(Outgoing::Close);
        link.stats.connections_open.dec();
    }
    for session in link.sessions.values() {
        tracing::info!(
            session = session.id,
            "stopping: the call goes to its fallback"
        );
        session.lose();
    }
    result
}

impl Link {
    fn dial(&mut self, carry: Vec<Arc<Session>>, delay: Duration) {
        let id = self.next_id;
        self.next_id += 1;
        for session in &carry {
            self.carried.insert(session.id.clone());
        }
        let dial = self.config.dial.clone();
        let events = self.events.clone();
        let dialed = self.dialed.clone();
        self.dialing.retain(|dial| !dial.is_finished());
        self.dialing.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let result = Connection::open(id, &dial, events).await;
            let _ = dialed.send(match result {
                Ok(conn) => Dialed::Opened(conn, carry),
                Err(error) => Dialed::Failed(error, carry),
            });
        }));
    }

    fn on_dialed(&mut self, dialed: Dialed) -> Result<(), ConnectError> {
        match dialed {
            Dialed::Failed(error, carry) => {
                for session in &carry {
                    self.carried.remove(&session.id);
                }
                if error.is_fatal() {
                    tracing::error!(%error, "Sent refused the agent: stopping");
                    return Err(error);
                }
                self.attempt += 1;
                let delay = backoff(self.attempt);
                tracing::info!(in_ms = delay.as_millis() as u64, "reconnecting");
                self.dial(carry, delay);
            }
            Dialed::Opened(conn, carry) => {
                self.stats.connections_opened.inc();
                self.stats.connections_open.inc();
                let id = conn.id;
                let mut entry = Conn {
                    conn,
                    draining: false,
                    sessions: HashSet::new(),
                    streams: HashMap::new(),
                };
                for session in carry {
                    self.carried.remove(&session.id);
                    if !self.sessions.contains_key(&session.id) {
                        continue;
                    }
                    for other in self.conns.values_mut() {
                        other.sessions.remove(&session.id);
                        other.streams.retain(|_, s| *s != session.id);
                    }
                    if let Some(resume) = session.move_to(entry.conn.sender()) {
                        entry.sessions.insert(session.id.clone());
                        entry.conn.send(Outgoing::Text(resume));
                    }
                }
                self.conns.insert(id, entry);
            }
        }
        Ok(())
    }

    fn on_event(&mut self, id: u64, event: Incoming) {
        match event {
            // Everything before the ping has been handled: the pong may go.
            Incoming::Ping(pong) => pong.send(),
            Incoming::Frame(frame) => self.on_frame(id, *frame),
            Incoming::Audio(message) => self.on_audio(id, &message),
            Incoming::Closed { why } => self.on_closed(id, &why),
        }
    }

    fn on_audio(&mut self, id: u64, message: &[u8]) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let Some(stream) = stream_of(message) else {
            return;
        };
        let Some(session) = conn.streams.get(&stream).and_then(|s| self.sessions.get(s)) else {
            return;
        };
        // Audio for a session that is moving belongs to the old stream: dropped.
        if !session.resuming() {
            session.audio(&message[AUDIO_HEADER..]);
        }
    }

    fn on_frame(&mut self, id: u64, frame: Frame) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        match frame {
            Frame::ConnectionDraining(_) => {
                conn.draining = true;
                let moving: Vec<Arc<Session>> = conn
                    .sessions
                    .iter()
                    .filter_map(|s| self.sessions.get(s))
                    .filter(|s| s.movable() && !self.carried.contains(&s.id))
                    .cloned()
                    .collect();
                tracing::info!(conn = id, moving = moving.len(), "draining");
                self.dial(moving, Duration::ZERO);
            }
            Frame::SessionStart(start) => {
                // The version active now serves the whole call, even if another is activated meanwhile.
                let deployment = self.config.deployment.borrow().clone();
                let session = Session::new(
                    &start,
                    conn.conn.sender(),
                    deployment.rules.clone(),
                    self.stats.clone(),
                );
                conn.sessions.insert(session.id.clone());
                if let Some(audio) = &start.audio {
                    conn.streams.insert(audio.stream as u16, session.id.clone());
                }
                tracing::info!(
                    conn = id,
                    session = session.id,
                    session_type = start.session_type,
                    version = deployment.version,
                    "session started"
                );
                self.sessions.insert(session.id.clone(), session.clone());
                match self.config.admission.admit() {
                    Some(permit) => {
                        tokio::spawn(session::run(session, deployment, permit));
                    }
                    None => {
                        tokio::spawn(session::refuse(session));
                    }
                }
            }
            Frame::SessionResumed(resumed) => {
                let session = self.sessions.get(&resumed.session_id).cloned();
                let Some(session) =
                    session.filter(|s| conn.sessions.contains(&s.id) && s.resuming())
                else {
                    return;
                };
                session.resumed(&resumed);
                if let Some(audio) = &resumed.audio {
                    conn.streams.insert(audio.stream as u16, session.id.clone());
                }
                tracing::info!(conn = id, session = session.id, "session resumed");
            }
            Frame::ErrorFrame(error) => {
                tracing::warn!(
                    conn = id,
                    code = error.error.code,
                    message = error.error.message,
                    session = error.session_id,
                    frame_type = error.frame_type,
                    "Sent refused a frame"
                );
                let about_resume = error.frame_type.as_deref() == Some("session.resume")
                    || matches!(
                        error.error.code.as_str(),
                        "resume_failed" | "connection_full"
                    );
                let Some(session_id) = error.session_id.filter(|_| about_resume) else {
                    return;
                };
                let session = self.sessions.get(&session_id).cloned();
                let Some(session) =
                    session.filter(|s| conn.sessions.contains(&s.id) && s.resuming())
                else {
                    return;
                };
                conn.sessions.remove(&session_id);
                if error.error.code == "connection_full" {
                    // The token is still good on another connection; until then the session is held.
                    session.detach();
                    self.dial(vec![session], Duration::ZERO);
                } else {
                    session.lose();
                    self.sessions.remove(&session_id);
                }
            }
            frame => {
                let Some(session_id) = frame.session_id().map(str::to_string) else {
                    tracing::debug!(
                        conn = id,
                        frame_type = frame.frame_type(),
                        "ignored a connection frame"
                    );
                    return;
                };
                // A session that moved away is read where it is now: Sent replays there.
                if !conn.sessions.contains(&session_id) {
                    return;
                }
                let Some(session) = self.sessions.get(&session_id).cloned() else {
                    return;
                };
                if session.resuming() {
                    return;
                }
                let ends = matches!(frame, Frame::SessionEnd(_));
                session.read(frame);
                if ends {
                    conn.sessions.remove(&session_id);
                    conn.streams.retain(|_, s| *s != session_id);
                    self.sessions.remove(&session_id);
                }
            }
        }
    }

    fn on_closed(&mut self, id: u64, why: &str) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        self.stats.connections_open.dec();
        tracing::info!(conn = id, why, "connection closed");
        let mut carry = Vec::new();
        for session_id in &conn.sessions {
            if self.carried.contains(session_id) {
                continue;
            }
            let Some(session) = self.sessions.get(session_id).cloned() else {
                continue;
            };
            if session.movable() {
                carry.push(session);
            } else {
                // No token, or its resume here was never answered.
                tracing::warn!(session = session.id, "session lost with its connection");
                session.lose();
                self.sessions.remove(session_id);
            }
        }
        if conn.draining && carry.is_empty() {
            return;
        }
        // A ping on a ready connection means Sent is reachable again: the backoff starts over (as the
        // official SDKs do, whichever connection heard it).
        if conn.conn.pinged() || self.conns.values().any(|c| c.conn.pinged()) {
            self.attempt = 0;
        }
        let delay = backoff(self.attempt);
        self.attempt += 1;
        tracing::info!(
            in_ms = delay.as_millis() as u64,
            resuming = carry.len(),
            "reconnecting"
        );
        self.dial(carry, delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_thirty_seconds() {
        let delays: Vec<u64> = (0..8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 30, 30]);
    }
}
