//! The recorder: every frame both ways, every audio message, every handshake and close, in the order the
//! simulator saw them, with the connection and session each belongs to. Scenarios wait on it with a deadline
//! and, when what they wait for does not come, fail with what did arrive.

use serde_json::Value;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub use sentsim_model::{Dir, What};

/// One thing the simulator saw.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its place in the recorder, from 0: records are numbered in the order the simulator saw them.
    pub seq: usize,
    /// When the simulator recorded it.
    pub at: Instant,
    /// The connection it happened on, numbered from 1 in the order the handshakes were accepted; 0 for a
    /// refused handshake, which never became a connection.
    pub conn: u32,
    /// Which way it went.
    pub dir: Dir,
    /// The id of the session it belongs to; `None` for what belongs to the connection as a whole
    /// (handshakes, pings, closes, connection frames).
    pub session: Option<String>,
    /// What happened.
    pub what: What,
}

impl Record {
    /// The frame's type, when the record is a frame.
    pub fn frame_type(&self) -> Option<&str> {
        match &self.what {
            What::Frame { frame_type, .. } => Some(frame_type),
            _ => None,
        }
    }

    /// The frame's JSON, when the record is a frame.
    pub fn json(&self) -> Option<&Value> {
        match &self.what {
            What::Frame { json, .. } => Some(json),
            _ => None,
        }
    }

    /// Whether the record is a frame of type `frame_type` that went the way `dir` says.
    pub fn is_frame(&self, dir: Dir, frame_type: &str) -> bool {
        self.dir == dir && self.frame_type() == Some(frame_type)
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arrow = match self.dir {
            Dir::ToAgent => "sent→agent",
            Dir::FromAgent => "agent→sent",
        };
        write!(f, "#{} conn {} {arrow} ", self.seq, self.conn)?;
        match &self.what {
            What::Opened => write!(f, "opened"),
            What::Refused { status } => write!(f, "refused {status}"),
            What::Frame { json, .. } => write!(f, "{}", redact(json)),
            What::Audio { stream, samples } => {
                write!(f, "audio stream {stream}, {} bytes", samples.len())
            }
            What::Raw { text } => write!(f, "raw {}", shorten(text)),
            What::Closed { how } => write!(f, "closed ({how})"),
        }
    }
}

/// A frame's JSON for a failure message, without the resume token (a secret, even in a simulator's output).
fn redact(json: &Value) -> String {
    let mut json = json.clone();
    if let Some(object) = json.as_object_mut() {
        if object.contains_key("token") {
            object.insert("token".into(), Value::String("vsr_…".into()));
        }
        if let Some(resume) = object.get_mut("resume").and_then(Value::as_object_mut) {
            resume.insert("token".into(), Value::String("vsr_…".into()));
        }
    }
    shorten(&json.to_string())
}

fn shorten(text: &str) -> String {
    const MOST: usize = 200;
    if text.chars().count() <= MOST {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(MOST).collect::<String>())
    }
}

/// Something an agent did that the protocol forbids. A scenario fails when one is recorded during it.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The sequence number the next record had when the violation was found: the violation came after
    /// every record numbered below it.
    pub seq: usize,
    /// The connection the agent broke the rule on.
    pub conn: u32,
    /// The session concerned, when the rule is about one.
    pub session: Option<String>,
    /// Which rule the agent broke, and how.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} conn {}", self.seq, self.conn)?;
        if let Some(session) = &self.session {
            write!(f, " {session}")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Default)]
struct Log {
    /// The records from the sequence number `forgotten` on.
    records: VecDeque<Arc<Record>>,
    /// How many records were forgotten ([`Recorder::forget_before`]).
    forgotten: usize,
    violations: Vec<Violation>,
}

/// Every record, shared by the simulator (which writes) and scenarios (which wait and read).
#[derive(Clone)]
pub struct Recorder {
    log: Arc<Mutex<Log>>,
    tick: Arc<watch::Sender<usize>>,
    started: Instant,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            log: Arc::default(),
            tick: Arc::new(watch::channel(0).0),
            started: Instant::now(),
        }
    }
}

impl Recorder {
    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one thing and wakes every waiter. Returns its sequence number.
    pub fn push(&self, conn: u32, dir: Dir, session: Option<&str>, what: What) -> usize {
        let seq = {
            let mut log = self.log();
            let seq = log.forgotten + log.records.len();
            log.records.push_back(Arc::new(Record {
                seq,
                at: Instant::now(),
                conn,
                dir,
                session: session.map(str::to_string),
                what,
            }));
            seq
        };
        self.tick.send_replace(seq + 1);
        seq
    }

    /// Records a protocol violation by the agent.
    pub fn violation(&self, conn: u32, session: Option<&str>, message: impl Into<String>) {
        let message = message.into();
        tracing::warn!(conn, session, %message, "protocol violation by the agent");
        let mut log = self.log();
        let seq = log.forgotten + log.records.len();
        log.violations.push(Violation {
            seq,
            conn,
            session: session.map(str::to_string),
            message,
        });
    }

    /// How many records there are: the sequence number the next one gets.
    pub fn len(&self) -> usize {
        let log = self.log();
        log.forgotten + log.records.len()
    }

    /// Lets go of the records before the sequence number `seq` (a long-running user, such as `voicehost
    /// call`, that has read them, so that memory stays bounded): reading from an earlier number then starts
    /// at `seq`. Violations are kept.
    pub fn forget_before(&self, seq: usize) {
        let mut log = self.log();
        let drop = seq.saturating_sub(log.forgotten).min(log.records.len());
        log.records.drain(..drop);
        log.forgotten += drop;
    }

    /// Whether nothing has been recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records from `from` on, copied out of the lock: a predicate may take the simulator's own lock,
    /// which is held while records are pushed.
    fn tail(&self, from: usize) -> Vec<Arc<Record>> {
        let log = self.log();
        let skip = from.saturating_sub(log.forgotten).min(log.records.len());
        log.records.range(skip..).cloned().collect()
    }

    /// The records from `from` on that match.
    pub fn since(&self, from: usize, matches: impl Fn(&Record) -> bool) -> Vec<Arc<Record>> {
        self.tail(from).into_iter().filter(|r| matches(r)).collect()
    }

    /// Violations recorded at or after the record `from`.
    pub fn violations_since(&self, from: usize) -> Vec<Violation> {
        let log = self.log();
        log.violations
            .iter()
            .filter(|v| v.seq >= from)
            .cloned()
            .collect()
    }

    /// Milliseconds since the recorder started, for readable transcripts.
    pub fn elapsed_ms(&self, record: &Record) -> u128 {
        record.at.duration_since(self.started).as_millis()
    }

    /// Waits until a record from `from` on matches `wanted`, and returns it. Records that are `relevant` but
    /// do not match are shown in the failure message, so a scenario says what arrived instead.
    pub async fn wait_for(
        &self,
        from: usize,
        within: Duration,
        what: &str,
        relevant: impl Fn(&Record) -> bool,
        wanted: impl Fn(&Record) -> bool,
    ) -> anyhow::Result<Arc<Record>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut tick = self.tick.subscribe();
        let mut next = from;
        loop {
            tick.borrow_and_update();
            let fresh = self.tail(next);
            next = fresh.last().map_or(next, |last| last.seq + 1);
            if let Some(found) = fresh.into_iter().find(|r| wanted(r)) {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, tick.changed())
                .await
                .is_err()
            {
                let arrived = self.since(from, &relevant);
                return Err(anyhow::anyhow!(
                    "waited {within:?} for {what}; {}",
                    describe(&arrived)
                ));
            }
        }
    }
}

/// "nothing arrived" or the records, one a line.
pub fn describe(records: &[Arc<Record>]) -> String {
    if records.is_empty() {
        return "nothing arrived".into();
    }
    let mut text = String::from("what arrived instead:");
    for record in records.iter().take(40) {
        text.push_str("\n    ");
        text.push_str(&record.to_string());
    }
    if records.len() > 40 {
        text.push_str(&format!("\n    … and {} more", records.len() - 40));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn say(text: &str) -> What {
        What::Frame {
            frame_type: "agent.say".into(),
            json: json!({"type": "agent.say", "session_id": "vs_1", "text": text}),
            counted: true,
        }
    }

    #[tokio::test]
    async fn a_wait_returns_the_first_match_after_the_cursor() {
        let recorder = Recorder::default();
        recorder.push(1, Dir::FromAgent, Some("vs_1"), say("old"));
        let from = recorder.len();
        let late = recorder.clone();
        tokio::spawn(async move { late.push(1, Dir::FromAgent, Some("vs_1"), say("new")) });
        let found = recorder
            .wait_for(
                from,
                Duration::from_secs(5),
                "a say",
                |_| true,
                |r| r.is_frame(Dir::FromAgent, "agent.say"),
            )
            .await
            .expect("found");
        assert_eq!(found.json().unwrap()["text"], "new");
    }

    #[tokio::test]
    async fn a_failed_wait_says_what_arrived_instead() {
        let recorder = Recorder::default();
        recorder.push(1, Dir::FromAgent, Some("vs_1"), say("something else"));
        let error = recorder
            .wait_for(
                0,
                Duration::from_millis(20),
                "a clear",
                |_| true,
                |r| r.is_frame(Dir::FromAgent, "agent.clear"),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("a clear"), "{error}");
        assert!(error.contains("something else"), "{error}");
    }

    #[test]
    fn resume_tokens_never_reach_a_failure_message() {
        let record = Record {
            seq: 0,
            at: Instant::now(),
            conn: 1,
            dir: Dir::FromAgent,
            session: Some("vs_1".into()),
            what: What::Frame {
                frame_type: "session.resume".into(),
                json: json!({"type": "session.resume", "session_id": "vs_1",
                    "token": "vsr_secretsecretsecretsecret", "received": 1}),
                counted: false,
            },
        };
        assert!(!record.to_string().contains("secret"), "{record}");
    }
}
