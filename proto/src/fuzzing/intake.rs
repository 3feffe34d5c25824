//! The harness of the host's intake and call core: the cargo-fuzz target `intake`, whose kept corpus
//! (`proto/fuzz/corpus/intake`) is replayed on every `cargo test`.
//!
//! [`run`] reads its input as a few settings and then a sequence of operations: what Sent sends (raw text,
//! structured frames of every type with fuzzed fields, answers aimed at live calls, binary audio, pings),
//! connections opening, failing and closing, the clock moving (fake [`Instant`]s from a base), and the
//! guests' requests on live calls. Text goes through [`wire::read_text`] and audio through
//! [`wire::read_binary`], as the connection's reader does, and only what they accept reaches the
//! [`Router`]. After every operation it drains [`Router::poll_output`] and checks what must always hold; a
//! broken rule panics with what broke. At the end the router is stopped and every call must have been
//! heard to its end, every tool call of a guest answered exactly once, and nothing left behind.
//!
//! Besides the hostile Sent the bytes make up, a well-behaved one takes part: the one model of Sent
//! ([`sentsim_model::Sent`], which the simulator and the property tests drive too) starts sessions on the
//! connections the harness opened, speaks, ends, answers tool calls and resumes as Sent does, and reads
//! everything the router writes. Its judgements of the agent are not checked here (the made-up frames of
//! the rest of the input make it see sessions it never started); what it brings is traffic a fuzzer would
//! take long to find: resumes answered with the right counts and tokens, replays, drains that close.
//!
//! The input format is this module's own (one byte picks an operation, the next ones its fields; missing
//! bytes read as zero), so that seeds can be written by hand ([`Script`]) and libFuzzer's mutations stay
//! meaningful. Everything is deterministic: the same bytes run the same way.

use crate::call::{
    self, CallKey, CallLimits, ConnId, FailurePolicy, GuestEvent, NotNow, Place, Refused,
};
use crate::router::{Output, Router, RouterConfig, EXTRA_CONNECTIONS};
use crate::wire::{self, frames, Frame, FromSent, Invalid, MAX_AUDIO_MS_PER_MESSAGE};
use bytes::Bytes;
use sentsim_model::{self as model, Sent};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Operations read from one input, at most.
pub const MAX_OPS: usize = 512;

/// The longest raw text message an input may carry (the WebSocket limit is far above; nothing is gained).
const MAX_RAW_TEXT: usize = 8 << 10;

/// The most audio one binary message to Sent may carry: 200 ms at the highest rate, 24 kHz.
pub const MAX_AUDIO_MESSAGE: usize =
    wire::AUDIO_HEADER + 24_000 * 2 * MAX_AUDIO_MS_PER_MESSAGE as usize / 1000;

/// The longest delay before a dial: the backoff's cap, jitter included.
const MAX_DIAL_DELAY: Duration = crate::backoff::MAX_BACKOFF;

/// Checks that can be turned off while a broken rule they catch waits for its fix, so that fuzzing goes on
/// finding other things meanwhile (see [`Checks::KNOWN_OK`]). The other rules are always checked.
#[derive(Debug, Clone, Copy)]
pub struct Checks {
    /// After [`Router::timeout`]`(now)`, nothing is due at `now` any more (else the agent's loop spins).
    pub deadline_moves_on: bool,
    /// Every [`Output::Answer`] names the very `call_ref` the guest was given (off: one Sent wrote
    /// otherwise, `t01` for `t1`, counts as the answer to the call of that number).
    pub answers_carry_the_issued_ref: bool,
}

impl Checks {
    /// Every check.
    pub const ALL: Checks = Checks {
        deadline_moves_on: true,
        answers_carry_the_issued_ref: true,
    };

    /// What [`run`] (the fuzz target and the corpus test) checks: every check but those whose broken
    /// rule is reported and not fixed yet (their reproducers go in `proto/fuzz/known/`, and
    /// `tests::every_check_left_off_has_a_reproducer_that_still_breaks_it` says when a fix lands). None is, today: the one found
    /// so far (`t01` answering `t1`) is fixed and its input kept in the corpus.
    pub const KNOWN_OK: Checks = Checks::ALL;
}

/// Runs one input with [`Checks::KNOWN_OK`]; panics when a rule breaks.
pub fn run(data: &[u8]) {
    run_with(data, Checks::KNOWN_OK);
}

/// Runs one input with the checks given; panics when a rule breaks.
pub fn run_with(data: &[u8], checks: Checks) {
    let mut input = Input { data };
    let mut harness = Harness::new(&mut input, checks);
    let mut ops = 0;
    while !input.is_empty() && ops < MAX_OPS {
        ops += 1;
        harness.step(&mut input);
    }
    harness.finish();
}

// ----- the input -----

/// The bytes of an input, read front to back; past the end every read is zero.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        bytes.iter_mut().for_each(|b| *b = self.u8());
        u64::from_le_bytes(bytes)
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer at the end).
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        taken
    }

    /// One of `items`, by one byte.
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.u8() as usize % items.len()].clone()
    }

    /// One of `interesting`, or (for the byte values past them) any 64-bit value.
    fn int(&mut self, interesting: &[i64]) -> i64 {
        let at = self.u8() as usize;
        match interesting.get(at) {
            Some(n) => *n,
            None if at.is_multiple_of(2) => self.u64() as i64,
            None => interesting[at % interesting.len()],
        }
    }

    /// A text: one of `interesting`, or (for the byte values past them) a length byte and that many bytes.
    fn text(&mut self, interesting: &[&str]) -> String {
        let at = self.u8() as usize;
        match interesting.get(at) {
            Some(text) => text.to_string(),
            None => {
                let len = self.u8() as usize;
                String::from_utf8_lossy(self.bytes(len)).into_owned()
            }
        }
    }
}

/// What one byte of an input asks for: the operation codes.
pub mod op {
    /// Raw text from Sent: a connection byte, a 16-bit length, that many bytes (UTF-8, lossily).
    pub const TEXT: u8 = 0;
    /// A structured frame from Sent: a connection byte, a kind byte, its fields, a mutation byte.
    pub const FRAME: u8 = 1;
    /// Binary audio from Sent: a connection byte, a stream, a length, a fill byte.
    pub const AUDIO: u8 = 2;
    /// A dialled connection opens: a dial byte, then `connection.ready`'s `max_sessions`.
    pub const OPEN: u8 = 3;
    pub const DIAL_FAILED: u8 = 4;
    /// An open connection ends: a connection byte.
    pub const CLOSED: u8 = 5;
    /// The clock moves on: a duration; whatever is then due runs, as in the agent's loop.
    pub const ADVANCE: u8 = 6;
    /// A ping from Sent: a connection byte, `ts`.
    pub const PING: u8 = 7;
    /// The guests' requests: a call byte, then their fields.
    pub const NEXT_EVENT: u8 = 8;
    pub const SAY: u8 = 9;
    pub const CLEAR: u8 = 10;
    pub const TOOL: u8 = 11;
    pub const SEND_AUDIO: u8 = 12;
    pub const GIVE_UP: u8 = 13;
    pub const GUEST_GONE: u8 = 14;
    /// Sent answers a call where it is: a call byte, a kind byte, its fields.
    pub const REPLY: u8 = 15;
    /// New rules for new calls: a limits byte, a policy byte.
    pub const RULES: u8 = 16;
    /// The agent stops (when the next byte is below 32); past 31, the byte says what the model of Sent does
    /// (see [`super::sent`]), and everything it has to send goes to the router.
    pub const STOP: u8 = 17;
    pub const COUNT: u8 = 18;
}

/// Kinds of [`op::FRAME`].
pub mod kind {
    pub const READY: u8 = 0;
    pub const DRAINING: u8 = 1;
    pub const PING: u8 = 2;
    pub const ERROR: u8 = 3;
    pub const START: u8 = 4;
    pub const SAID: u8 = 5;
    pub const TOOL_RESULT: u8 = 6;
    pub const END: u8 = 7;
    pub const RESUMED: u8 = 8;
    pub const UNKNOWN: u8 = 9;
    pub const AGENTS: u8 = 10;
    pub const GARBAGE: u8 = 11;
    pub const COUNT: u8 = 12;
}

/// What the model of Sent does, by [`op::STOP`]'s byte past 31 (modulo [`sent::COUNT`]).
pub mod sent {
    /// Starts a session on an open connection: a byte picks it, one the type and whether it is resumable.
    pub const START: u8 = 0;
    /// `user.said` on one of its sessions (a byte picks it).
    pub const SAID: u8 = 1;
    pub const END: u8 = 2;
    /// Answers the oldest tool call a session waits on: ok, or failed (a byte says).
    pub const ANSWER: u8 = 3;
    /// Drains an open connection.
    pub const DRAIN: u8 = 4;
    /// Answers a resume it holds.
    pub const ANSWER_RESUME: u8 = 5;
    /// How it answers the next resume (a byte picks the plan).
    pub const PLAN_RESUME: u8 = 6;
    /// Caller audio on one of its sessions.
    pub const AUDIO: u8 = 7;
    pub const COUNT: u8 = 8;
}

/// Kinds of [`op::REPLY`].
pub mod reply {
    pub const RESUMED: u8 = 0;
    pub const TOOL_RESULT: u8 = 1;
    pub const CONNECTION_FULL: u8 = 2;
    pub const RESUME_FAILED: u8 = 3;
    pub const TOOL_REFUSED: u8 = 4;
    pub const END: u8 = 5;
    pub const SAID: u8 = 6;
    pub const DRAINING: u8 = 7;
    pub const COUNT: u8 = 8;
}

/// Session ids Sent uses, so that frames hit live calls; past them, any text.
const SESSIONS: &[&str] = &["vs_a", "vs_b", "vs_c", "vs_d"];
const TOKENS: &[&str] = &[
    "vsr_0123456789abcdefghijklmnop",
    "vsr_zyxwvutsrqponmlkjihgfedcba",
    "vsr_short",
    "not-a-token-at-all-but-long-enough",
];
const STREAMS: &[i64] = &[1, 2, 3, 4, 1, 2, 3, 0, 65535, 65536, -1];
const RECEIVED: &[i64] = &[0, 1, 2, 3, 4, 31, 32, 33, 64, i64::MAX, -1, 1 << 53];
const MILLIS: &[i64] = &[
    0, 1, 10, 100, 999, 1000, 5000, 9999, 10_000, 10_001, 15_000, 30_000, 60_000, 3_600_000,
];
const AUDIO_LENGTHS: &[i64] = &[0, 1, 2, 3, 320, 640, 960, 9600, 9601, 19_200, 48_001];

fn long(prefix: &str, chars: usize) -> String {
    format!("{prefix}{}", "a".repeat(chars))
}

fn limits(choice: u8) -> CallLimits {
    match choice % 4 {
        // What the host runs under.
        0..=2 => CallLimits::default(),
        // Tight, as the tests run them.
        _ => CallLimits {
            tool_timeout: Duration::from_secs(1),
            audio_backlog_ms: 100,
            frame_backlog: 4,
            frame_backlog_bytes: 64,
            audio_out_ms: 100,
        },
    }
}

fn policy(choice: u8) -> FailurePolicy {
    match choice % 3 {
        0 => FailurePolicy::HangUp,
        1 => FailurePolicy::transfer("number", "+14155550100").unwrap(),
        // One the codec refuses (the config and the API refuse it; the call hangs up if one gets through).
        _ => FailurePolicy::transfer_unchecked("conference", "room"),
    }
}

// ----- the harness -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Dialing,
    Open,
    Failed,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuestState {
    Serving,
    GaveUp,
    Gone,
}

/// What the harness saw of one call.
struct Seen {
    session_id: String,
    audio: bool,
    guest: GuestState,
    /// The guest took an event, and which was the first.
    took_any: bool,
    terminal: bool,
    /// The call ended or was forgotten (sticky).
    finished: bool,
    /// The guest's last `next_event` found nothing: only a wake brings it back.
    sleeping: bool,
    /// `call_ref`s the guest was given, and how often each was answered.
    refs: BTreeMap<String, u32>,
    /// Every `call_ref` of a `tool.call` the call sent (the guest's and the host's), for Sent's answers.
    tool_refs: Vec<String>,
    last_resume_received: i64,
}

/// What the operation being checked did.
#[derive(Default)]
struct OpContext {
    name: &'static str,
    /// A ping on this connection with this `ts`: one pong is owed.
    ping: Option<(ConnId, i64)>,
}

struct Harness {
    router: Router,
    now: Instant,
    connections: usize,
    conns: BTreeMap<ConnId, ConnState>,
    calls: BTreeMap<CallKey, Seen>,
    /// Each call's counted frames handed to each connection, as its writer would count them.
    handed: BTreeMap<(ConnId, CallKey), u64>,
    keys: Vec<CallKey>,
    stopped: bool,
    checks: Checks,
    /// A ping went to the router in this operation: its pong is owed.
    pending_ping: Option<(ConnId, i64)>,
    trace: Vec<String>,
    /// The well-behaved Sent, and the messages it has for the router.
    sent: Sent,
    sent_out: Vec<model::Transmit>,
}

/// A connection no dial ever named.
const STRAY_CONN: ConnId = 1_000_000;
/// A call the router never had.
const STRAY_KEY: CallKey = CallKey(u64::MAX);
/// The key of a hangup for a session that no call serves (the router's own).
const STRAY_HANGUP: CallKey = CallKey(0);

impl Harness {
    fn new(input: &mut Input, checks: Checks) -> Harness {
        let connections = 1 + input.u8() as usize % 3;
        let limits = limits(input.u8());
        let policy = policy(input.u8());
        let seed = input.u64();
        let now = Instant::now();
        let router = Router::new(
            RouterConfig {
                connections,
                limits,
                policy,
            },
            seed,
            now,
        );
        let mut harness = Harness {
            router,
            now,
            connections,
            conns: BTreeMap::new(),
            calls: BTreeMap::new(),
            handed: BTreeMap::new(),
            keys: Vec::new(),
            stopped: false,
            checks,
            pending_ping: None,
            trace: Vec::new(),
            sent: Sent::new(model::Config {
                tools: model::ToolPlan::Hold,
                ..model::Config::default()
            }),
            sent_out: Vec::new(),
        };
        harness.router.start(now);
        harness.drain(OpContext {
            name: "start",
            ..OpContext::default()
        });
        harness
    }

    /// Panics with the broken rule and the operations so far.
    #[track_caller]
    fn broke(&self, rule: impl std::fmt::Display) -> ! {
        let start = self.trace.len().saturating_sub(12);
        panic!(
            "fuzzing invariant broken: {rule}\nlast operations:\n  {}",
            self.trace[start..].join("\n  ")
        );
    }

    fn note(&mut self, what: String) {
        self.trace.push(what);
    }

    fn conns_in(&self, state: ConnState) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, s)| **s == state)
            .map(|(c, _)| *c)
            .collect()
    }

    /// An open connection (or, for 255, one never dialled).
    fn open_conn(&self, choice: u8) -> Option<ConnId> {
        if choice == 255 {
            return Some(STRAY_CONN);
        }
        let open = self.conns_in(ConnState::Open);
        (!open.is_empty()).then(|| open[choice as usize % open.len()])
    }

    /// A call whose guest can still ask for things (or, for 255, a call that never was).
    fn guest_call(&self, choice: u8, gave_up_too: bool) -> Option<CallKey> {
        if choice == 255 {
            return Some(STRAY_KEY);
        }
        let keys: Vec<CallKey> = self
            .keys
            .iter()
            .copied()
            .filter(|k| match self.calls[k].guest {
                GuestState::Serving => true,
                GuestState::GaveUp => gave_up_too,
                GuestState::Gone => false,
            })
            .collect();
        (!keys.is_empty()).then(|| keys[choice as usize % keys.len()])
    }

    fn session_id(&mut self, input: &mut Input) -> String {
        let at = input.u8() as usize;
        match at {
            _ if at < 200 => SESSIONS[at % SESSIONS.len()].to_string(),
            200..=219 => {
                // A session a call has now (or had), however Sent named it.
                match self.keys.get(at - 200) {
                    Some(key) => self.calls[key].session_id.clone(),
                    None => SESSIONS[0].to_string(),
                }
            }
            220 => long("vs_", 126),
            221 => long("vs_", 125),
            222 => "vs_é".to_string(),
            223 => String::new(),
            _ => format!("vs_{}", input.text(&[])),
        }
    }

    // ----- one operation -----

    fn step(&mut self, input: &mut Input) {
        let code = input.u8() % op::COUNT;
        let name = match code {
            op::TEXT => {
                let conn = input.u8();
                let len = input.u16() as usize % MAX_RAW_TEXT;
                let text = String::from_utf8_lossy(input.bytes(len)).into_owned();
                if let Some(conn) = self.open_conn(conn) {
                    self.note(format!("text on {conn}: {text:?}"));
                    self.sent_text(conn, &text);
                }
                "text"
            }
            op::FRAME => {
                let conn = input.u8();
                let text = self.frame_text(input);
                if let Some(conn) = self.open_conn(conn) {
                    self.note(format!("frame on {conn}: {text}"));
                    self.sent_text(conn, &text);
                }
                "frame"
            }
            op::AUDIO => {
                let conn = input.u8();
                let stream = match input.u8() {
                    n @ 0..=3 => n as u16,
                    255 => u16::MAX,
                    _ => input.u16(),
                };
                let len = input.int(AUDIO_LENGTHS).clamp(0, 60_000) as usize;
                let fill = input.u8();
                let mut message = stream.to_be_bytes().to_vec();
                message.resize(2 + len, fill);
                // A message shorter than the stream number.
                if fill == 255 {
                    message.truncate(len.min(1));
                }
                if let Some(conn) = self.open_conn(conn) {
                    self.note(format!("audio on {conn}: {} bytes", message.len()));
                    self.sent_audio(conn, &message);
                }
                "audio"
            }
            op::OPEN => {
                let dial = input.u8();
                let max_sessions = input.int(&[1, 2, 3, 10, 100_000, i64::MAX, 0]);
                let dialing = self.conns_in(ConnState::Dialing);
                if !dialing.is_empty() {
                    let conn = dialing[dial as usize % dialing.len()];
                    let ready = format!(
                        r#"{{"type":"connection.ready","protocol_version":"0.2.0","heartbeat_interval_ms":15000,"max_sessions":{max_sessions}}}"#
                    );
                    self.note(format!("open {conn}: max_sessions {max_sessions}"));
                    match wire::read_text(&ready) {
                        Ok(FromSent::Frame(frame)) => match *frame {
                            Frame::ConnectionReady(ready) => {
                                self.conns.insert(conn, ConnState::Open);
                                self.router.handle_opened(self.now, conn, &ready);
                                self.model_opened(conn, ready.max_sessions);
                            }
                            _ => self.broke("connection.ready read as another frame"),
                        },
                        // No ready in time: the dial fails.
                        _ => {
                            self.conns.insert(conn, ConnState::Failed);
                            self.router.handle_dial_failed(self.now, conn);
                        }
                    }
                }
                "open"
            }
            op::DIAL_FAILED => {
                let dial = input.u8();
                let dialing = self.conns_in(ConnState::Dialing);
                if !dialing.is_empty() {
                    let conn = dialing[dial as usize % dialing.len()];
                    self.note(format!("dial {conn} failed"));
                    self.conns.insert(conn, ConnState::Failed);
                    self.router.handle_dial_failed(self.now, conn);
                }
                "dial failed"
            }
            op::CLOSED => {
                let choice = input.u8();
                if let Some(conn) = self.open_conn(choice).filter(|c| *c != STRAY_CONN) {
                    self.note(format!("closed {conn}"));
                    self.conns.insert(conn, ConnState::Closed);
                    self.router.handle_closed(self.now, conn);
                    self.model_closed(conn, false);
                }
                "closed"
            }
            op::ADVANCE => {
                let ms = input.int(MILLIS).clamp(0, 48 * 3_600_000) as u64;
                self.note(format!("advance {ms} ms"));
                self.advance(Duration::from_millis(ms));
                "advance"
            }
            op::PING => {
                let conn = input.u8();
                let ts = input.int(&[0, 1, 1_767_139_200_000, i64::MAX, -1]);
                if let Some(conn) = self.open_conn(conn) {
                    let text = format!(r#"{{"type":"ping","ts":{ts}}}"#);
                    self.note(format!("ping on {conn}: {ts}"));
                    self.sent_text(conn, &text);
                }
                "ping"
            }
            op::NEXT_EVENT => {
                if let Some(key) = self.guest_call(input.u8(), true) {
                    self.next_event(key);
                }
                "next_event"
            }
            op::SAY => {
                let choice = input.u8();
                let text =
                    input.text(&["hi", "", "I can help", &"é".repeat(4096), &long("", 4096)]);
                let flags = input.u8();
                let unwritten = input.u8() as usize % 40;
                if let Some(key) = self.guest_call(choice, false) {
                    let session_id = self.session_of(key);
                    let frame = Frame::AgentSay(frames::AgentSay {
                        session_id,
                        text,
                        interruptible: [None, Some(false), Some(true)][flags as usize % 3],
                        last: [None, Some(false), Some(true)][(flags as usize / 3) % 3],
                    });
                    self.note(format!("say on {key:?} (unwritten {unwritten})"));
                    self.guest_send(key, frame, unwritten);
                }
                "say"
            }
            op::CLEAR => {
                let choice = input.u8();
                let unwritten = input.u8() as usize % 40;
                if let Some(key) = self.guest_call(choice, false) {
                    let session_id = self.session_of(key);
                    let frame = Frame::AgentClear(frames::AgentClear { session_id });
                    self.note(format!("clear on {key:?} (unwritten {unwritten})"));
                    self.guest_send(key, frame, unwritten);
                }
                "clear"
            }
            op::TOOL => {
                let choice = input.u8();
                let name = input.text(&[
                    "hangup",
                    "transfer",
                    "send_dtmf",
                    "hold",
                    "lookup_order",
                    "Bad",
                ]);
                let arguments = match input.u8() % 6 {
                    0 => None,
                    1 => Some(Map::new()),
                    2 => json!({"to": {"kind": "number", "value": "+14155550100"}})
                        .as_object()
                        .cloned(),
                    3 => json!({"digits": "12#w3"}).as_object().cloned(),
                    4 => json!({"held": true}).as_object().cloned(),
                    _ => json!({"order": "A-1001", "n": 1}).as_object().cloned(),
                };
                let unwritten = input.u8() as usize % 40;
                if let Some(key) = self.guest_call(choice, false) {
                    self.note(format!("tool {name:?} on {key:?} (unwritten {unwritten})"));
                    self.guest_tool(key, name, arguments, unwritten);
                }
                "tool"
            }
            op::SEND_AUDIO => {
                let choice = input.u8();
                let len = input.int(AUDIO_LENGTHS).clamp(0, 100_000) as usize / 2;
                if let Some(key) = self.guest_call(choice, false) {
                    self.note(format!("send_audio on {key:?}: {len} samples"));
                    self.router.handle_send_audio(key, &vec![7; len]);
                }
                "send_audio"
            }
            op::GIVE_UP => {
                if let Some(key) = self.guest_call(input.u8(), true) {
                    self.note(format!("give_up on {key:?}"));
                    if let Some(seen) = self.calls.get_mut(&key) {
                        seen.guest = GuestState::GaveUp;
                    }
                    self.router.handle_give_up(self.now, key);
                }
                "give_up"
            }
            op::GUEST_GONE => {
                if let Some(key) = self.guest_call(input.u8(), true) {
                    self.note(format!("guest gone on {key:?}"));
                    if let Some(seen) = self.calls.get_mut(&key) {
                        seen.guest = GuestState::Gone;
                    }
                    self.router.handle_guest_gone(key);
                }
                "guest_gone"
            }
            op::REPLY => {
                let choice = input.u8();
                self.reply(choice, input);
                "reply"
            }
            op::RULES => {
                let limits = limits(input.u8());
                let policy = policy(input.u8());
                self.note("new rules".into());
                self.router.set_rules(limits, policy);
                "rules"
            }
            _ => match input.u8() {
                0..32 => {
                    self.note("stop".into());
                    self.stopped = true;
                    self.router.stop(self.now);
                    "stop"
                }
                what => {
                    self.model_acts(what % sent::COUNT, input);
                    "sent"
                }
            },
        };
        let ping = self.pending_ping.take();
        self.drain(OpContext { name, ping });
    }
}

// ----- what Sent sends -----

impl Harness {
    /// A text message from Sent through the intake, as the connection's reader does.
    fn sent_text(&mut self, conn: ConnId, text: &str) {
        match wire::read_text(text) {
            Ok(FromSent::Ping(ts)) => {
                self.pending_ping = Some((conn, ts));
                self.router.handle_ping(self.now, conn, ts);
            }
            Ok(FromSent::Frame(frame)) => {
                if frames::FROM_AGENT.contains(&frame.frame_type()) {
                    self.broke(format_args!(
                        "the intake let a {} frame of the agent's through",
                        frame.frame_type()
                    ));
                }
                if frame
                    .session_id()
                    .is_some_and(|id| id.chars().count() > wire::MAX_ID_CHARS)
                {
                    self.broke("the intake let an overlong session_id through");
                }
                self.router.handle_frame(self.now, conn, *frame);
            }
            Err(invalid) => {
                let message = invalid.to_string();
                if quotes_a_token(&message) {
                    self.broke(format_args!(
                        "the intake's reason quotes a resume token: {message}"
                    ));
                }
            }
        }
    }

    /// A binary message from Sent through the intake.
    fn sent_audio(&mut self, conn: ConnId, message: &[u8]) {
        match wire::read_binary(message) {
            Ok((stream, samples)) => {
                if samples.len() != (message.len() - wire::AUDIO_HEADER) & !1
                    || u16::from_be_bytes([message[0], message[1]]) != stream
                {
                    self.broke("the intake split audio into the wrong stream or samples");
                }
                self.router
                    .handle_audio(self.now, conn, stream, Bytes::copy_from_slice(samples));
            }
            Err(Invalid::ShortAudio(n)) if n < wire::AUDIO_HEADER => {}
            Err(Invalid::NoSamples(n)) if n < wire::AUDIO_HEADER + 2 => {}
            Err(other) => self.broke(format_args!("audio refused: {other}")),
        }
    }

    /// A frame of Sent's, built from the input: valid or nearly, of every type.
    fn frame_text(&mut self, input: &mut Input) -> String {
        let mut frame = match input.u8() % kind::COUNT {
            kind::READY => json!({
                "type": "connection.ready",
                "protocol_version": "0.2.0",
                "heartbeat_interval_ms": 15000,
                "max_sessions": input.int(&[1, 10, 0, i64::MAX]),
            }),
            kind::DRAINING => json!({"type": "connection.draining"}),
            kind::PING => {
                json!({"type": "ping", "ts": input.int(&[0, 1_767_139_200_000, i64::MAX])})
            }
            kind::ERROR => {
                let code = input.pick(&[
                    "connection_full",
                    "resume_failed",
                    "frame_not_allowed",
                    "session_not_found",
                    "Bad Code",
                ]);
                let session_id = self.session_id(input);
                let flags = input.u8();
                let mut error = json!({
                    "type": "error",
                    "error": {"code": code, "message": "illustrative message"},
                });
                if flags & 1 == 0 {
                    error["session_id"] = json!(session_id);
                }
                if flags & 2 == 0 {
                    let about = [
                        "session.resume",
                        "tool.call",
                        "agent.say",
                        "agent.clear",
                        "x",
                    ];
                    error["frame_type"] = json!(about[(flags as usize >> 2) % about.len()]);
                }
                error
            }
            kind::START => {
                let session_id = self.session_id(input);
                let flags = input.u8();
                let stream = input.int(&[1, 2, 3, 4, 1, 2, 3, 65535]);
                let token = input.pick(&TOKENS[..2]);
                let window_ms = input.int(&[15_000, 1, 100, 1000, 15_000, 86_400_000]);
                let odd = input.u8();
                let audio = flags & 1 == 1;
                let mut start = json!({
                    "type": "session.start",
                    "session_id": session_id,
                    "call_id": "call_91c2",
                    "agent_id": "agent_1",
                    "direction": if flags & 2 == 0 { "inbound" } else { "outbound" },
                    "from": {"kind": "number", "value": "+14155550100"},
                    "to": {"kind": "agent", "value": "agent_1"},
                    "session_type": if audio { "audio" } else { "text" },
                    "started_at": "2026-11-30T10:00:00Z",
                });
                if audio {
                    let mut media = json!({"stream": stream});
                    let rates = [None, Some(8000), Some(16000), Some(24000)];
                    if let Some(rate) = rates[(flags as usize >> 3) % 4] {
                        media["sample_rate"] = json!(rate);
                    }
                    start["audio"] = media;
                }
                // Mostly resumable.
                if flags & 0b110_0000 != 0b110_0000 {
                    start["resume"] = json!({"token": token, "window_ms": window_ms});
                }
                if flags & 128 == 128 {
                    start["context"] = json!({"order_id": "A-1001"});
                }
                // Now and then one thing odd (mutate() adds more).
                match odd {
                    224 => {
                        if let Some(fields) = start.as_object_mut() {
                            fields.remove("audio");
                        }
                    }
                    225 => start["audio"] = json!({"stream": stream}),
                    226 => start["call_id"] = json!(long("call_", 124)),
                    227 => start["agent_id"] = json!(long("agent_", 123)),
                    228 => start["call_id"] = json!(long("call_", 123)),
                    229 => start["audio"] = json!({"stream": 0}),
                    230 => start["audio"] = json!({"stream": 65536}),
                    231 => start["resume"] = json!({"token": token, "window_ms": 0}),
                    232 => start["resume"] = json!({"token": token, "window_ms": i64::MAX}),
                    233 => start["resume"] = json!({"token": TOKENS[2], "window_ms": 15000}),
                    234 => start["audio"] = json!({"stream": stream, "sample_rate": 12345}),
                    235 => start["session_type"] = json!("video"),
                    _ => {}
                }
                start
            }
            kind::SAID => {
                let session_id = self.session_id(input);
                let text = input.text(&["I need a person", "", &long("", 4096), &long("", 4097)]);
                let correction = input.bool();
                json!({"type": "user.said", "session_id": session_id, "text": text, "correction": correction})
            }
            kind::TOOL_RESULT => {
                let session_id = self.session_id(input);
                let call_ref = input.text(&[
                    "t1",
                    "t2",
                    "t3",
                    "t0",
                    "t01",
                    "t+1",
                    "x",
                    "t18446744073709551616",
                    &long("t", 63),
                ]);
                let flags = input.u8();
                let mut result = json!({"type": "tool.result", "session_id": session_id, "call_ref": call_ref, "ok": flags & 1 == 0});
                if flags & 3 != 0 {
                    result["error"] = json!({"code": "some_code", "message": "why"});
                }
                result
            }
            kind::END => {
                let session_id = self.session_id(input);
                let reason = input.pick(&[
                    "caller_hung_up",
                    "transferred",
                    "failed",
                    "new_reason",
                    "Bad Reason",
                ]);
                let duration_ms = input.int(&[0, 52_310, i64::MAX, -1]);
                json!({"type": "session.end", "session_id": session_id, "reason": reason, "duration_ms": duration_ms})
            }
            kind::RESUMED => {
                let session_id = self.session_id(input);
                let received = input.int(RECEIVED);
                let flags = input.u8();
                let stream = input.int(STREAMS);
                let token = input.pick(&[TOKENS[0], TOKENS[1], TOKENS[1], TOKENS[2]]);
                let mut resumed = json!({"type": "session.resumed", "session_id": session_id, "received": received});
                if flags & 1 == 0 {
                    resumed["resume"] = json!({"token": token, "window_ms": 15000});
                }
                if flags & 2 == 0 {
                    resumed["audio"] = json!({"stream": stream});
                }
                resumed
            }
            kind::UNKNOWN => {
                let frame_type =
                    input.text(&["session.note", "session.x", "connection.x", "audio"]);
                let session_id = self.session_id(input);
                let mut unknown = json!({"type": frame_type, "x": 1});
                if input.bool() {
                    unknown["session_id"] = json!(session_id);
                }
                unknown
            }
            kind::AGENTS => {
                let session_id = self.session_id(input);
                match input.u8() % 5 {
                    0 => json!({"type": "agent.say", "session_id": session_id, "text": "hi"}),
                    1 => {
                        json!({"type": "tool.call", "session_id": session_id, "call_ref": "t1", "name": "hangup"})
                    }
                    2 => json!({"type": "agent.clear", "session_id": session_id}),
                    3 => {
                        json!({"type": "session.resume", "session_id": session_id, "token": TOKENS[0], "received": 3})
                    }
                    _ => json!({"type": "pong", "ts": 1}),
                }
            }
            _ => {
                let garbage = [
                    "",
                    "[]",
                    "null",
                    "{}",
                    r#"{"type":5}"#,
                    r#"{"type":"session.start"}"#,
                    r#"{"type":"user.said","session_id":"vs_a","text":"hi""#,
                    r#"{"type":"ping","ts":1.0}"#,
                    r#"{"type":"ping","ts":1e300}"#,
                    r#"{"type":"ping","type":"user.said","session_id":"vs_a","text":"x"}"#,
                    r#"{"type":"session.resumed","session_id":"vs_a","received":18446744073709551615}"#,
                ];
                let at = input.u8() as usize;
                return match garbage.get(at) {
                    Some(text) => text.to_string(),
                    None => format!("{}{}", "[".repeat(at), "]".repeat(at)),
                };
            }
        };
        mutate(&mut frame, input);
        frame.to_string()
    }

    /// Sent answers a live call where it is: what the call waits for, and then some.
    fn reply(&mut self, choice: u8, input: &mut Input) {
        let kind = input.u8() % reply::COUNT;
        let a = input.u8();
        let b = input.u8();
        let received = input.int(RECEIVED);
        let live: Vec<CallKey> = self
            .keys
            .iter()
            .copied()
            .filter(|k| !self.calls[k].finished)
            .collect();
        if live.is_empty() {
            return;
        }
        let key = live[choice as usize % live.len()];
        let seen = &self.calls[&key];
        let session_id = seen.session_id.clone();
        let Some(call) = self.router.call(&session_id).filter(|c| c.key() == key) else {
            return;
        };
        let (live_on, moving_to) = match call.place() {
            Place::Live { conn, .. } => (Some(conn), None),
            Place::Moving { conn, .. } => (None, Some(conn)),
            Place::Detached { .. } | Place::Done => (None, None),
        };
        let sent = call.counts().1 as i64;
        let (conn, frame) = match kind {
            reply::RESUMED => {
                let received = match a % 4 {
                    0 => sent,
                    1 => sent - 1,
                    2 => 0,
                    _ => received,
                };
                let mut resumed = json!({"type": "session.resumed", "session_id": session_id, "received": received.max(0)});
                if b & 1 == 0 {
                    resumed["resume"] = json!({"token": TOKENS[1], "window_ms": 15000});
                }
                if let Some(stream) = [None, Some(1), Some(2), Some(3)][(b as usize >> 1) % 4] {
                    resumed["audio"] = json!({"stream": stream});
                }
                (moving_to, resumed)
            }
            reply::TOOL_RESULT => {
                let call_ref = match seen.tool_refs.len() {
                    0 => "t1".to_string(),
                    n => seen.tool_refs[a as usize % n].clone(),
                };
                let mut result = json!({"type": "tool.result", "session_id": session_id, "call_ref": call_ref, "ok": b & 1 == 0});
                if b & 3 != 0 {
                    result["error"] = json!({"code": "some_code", "message": "why"});
                }
                (live_on, result)
            }
            reply::CONNECTION_FULL | reply::RESUME_FAILED => {
                let code = if kind == reply::CONNECTION_FULL {
                    "connection_full"
                } else {
                    "resume_failed"
                };
                let mut error = json!({"type": "error", "error": {"code": code, "message": "m"}, "session_id": session_id});
                if b & 1 == 0 {
                    error["frame_type"] = json!("session.resume");
                }
                (moving_to, error)
            }
            reply::TOOL_REFUSED => (
                live_on,
                json!({"type": "error", "error": {"code": "frame_not_allowed", "message": "m"}, "session_id": session_id, "frame_type": "tool.call"}),
            ),
            reply::END => (
                live_on,
                json!({"type": "session.end", "session_id": session_id, "reason": "caller_hung_up", "duration_ms": 1000}),
            ),
            reply::SAID => (
                live_on,
                json!({"type": "user.said", "session_id": session_id, "text": "hello", "correction": b & 1 == 1}),
            ),
            _ => (
                live_on.or(moving_to),
                json!({"type": "connection.draining"}),
            ),
        };
        let Some(conn) = conn.filter(|c| self.conns.get(c) == Some(&ConnState::Open)) else {
            return;
        };
        let text = frame.to_string();
        self.note(format!("reply on {conn}: {text}"));
        self.sent_text(conn, &text);
    }
}

// ----- the well-behaved Sent -----

impl Harness {
    fn model_conn(conn: ConnId) -> Option<u32> {
        u32::try_from(conn).ok()
    }

    /// A connection opened: the model has it too, with the `max_sessions` it was given (within what a
    /// real Sent gives).
    fn model_opened(&mut self, conn: ConnId, max_sessions: i64) {
        let Some(id) = Self::model_conn(conn) else {
            return;
        };
        let settings = model::ConnSettings {
            max_sessions: Some(max_sessions.clamp(1, 10) as usize),
            ..model::ConnSettings::default()
        };
        self.sent.handle_open(self.now, id, "agent_1", settings);
        // The router has its connection.ready already (the input's own).
        self.sent.ready(self.now, id);
        while self.sent.poll_transmit().is_some() {}
        self.sent_out.retain(|t| t.conn != id);
        self.forget_model_events();
    }

    fn model_closed(&mut self, conn: ConnId, clean: bool) {
        if let Some(id) = Self::model_conn(conn) {
            let how = if clean {
                "closed by the agent with 1000"
            } else {
                "closed"
            };
            self.sent.handle_closed(self.now, id, how, clean);
            self.forget_model_events();
        }
    }

    /// The model's records and judgements are not kept (see the module's words): they would only grow.
    fn forget_model_events(&mut self) {
        while self.sent.poll_event().is_some() {}
        self.sent_out
            .extend(std::iter::from_fn(|| self.sent.poll_transmit()));
    }

    /// Sent reads what the router wrote (its own sockets are never slow here).
    fn model_reads(&mut self, written: Vec<(ConnId, CallKey, model::Message)>) {
        for (conn, _, message) in written {
            let Some(id) = Self::model_conn(conn) else {
                continue;
            };
            match message {
                model::Message::Text(text) => self.sent.handle_text(self.now, id, &text),
                model::Message::Binary(data) => self.sent.handle_binary(id, &data),
                model::Message::Close(_) | model::Message::Kill => {}
            }
        }
        self.forget_model_events();
    }

    /// One of the model's sessions that is still live, by `choice`.
    fn model_session(&self, choice: u8) -> Option<String> {
        let live: Vec<&str> = self
            .sent
            .sessions()
            .filter(|(_, s)| s.live())
            .map(|(id, _)| id)
            .collect();
        (!live.is_empty()).then(|| live[choice as usize % live.len()].to_string())
    }

    /// The model of Sent does `what`, then everything it has to send goes to the router.
    fn model_acts(&mut self, what: u8, input: &mut Input) {
        let choice = input.u8();
        let flags = input.u8();
        match what {
            sent::START => {
                let Some(conn) = self.open_conn(choice).and_then(Self::model_conn) else {
                    return;
                };
                if !self.sent.conn(conn).is_some_and(|c| c.usable()) {
                    return;
                }
                let kind = match flags % 3 {
                    0 => model::Kind::Text,
                    1 => model::Kind::Audio { sample_rate: 16000 },
                    _ => model::Kind::Audio { sample_rate: 8000 },
                };
                let spec = model::SessionSpec {
                    kind,
                    resumable: flags & 8 == 0,
                    ..model::SessionSpec::text()
                };
                let id = self.sent.start(conn, &spec, None);
                self.note(format!("Sent starts {id} on {conn}"));
            }
            sent::SAID | sent::END | sent::AUDIO | sent::ANSWER => {
                let Some(id) = self.model_session(choice) else {
                    return;
                };
                self.note(format!("Sent's op {what} on {id}"));
                match what {
                    sent::SAID => self.sent.user_said(&id, "I need a person", flags & 1 == 1),
                    sent::END => self.sent.end(&id, "caller_hung_up"),
                    sent::AUDIO => self.sent.send_audio(&id, &[flags; 640]),
                    _ => {
                        let waiting = self
                            .sent
                            .session(&id)
                            .and_then(|s| s.pending_tools.front().cloned());
                        if let Some((call_ref, name)) = waiting {
                            let error = (flags & 1 == 1).then_some("failed");
                            self.sent.answer(&id, &call_ref, &name, error);
                        }
                    }
                }
            }
            sent::DRAIN => {
                if let Some(conn) = self.open_conn(choice).and_then(Self::model_conn) {
                    self.note(format!("Sent drains {conn}"));
                    self.sent.drain(conn);
                }
            }
            sent::ANSWER_RESUME => {
                let held = self
                    .sent
                    .sessions()
                    .find(|(_, s)| s.resuming.is_some())
                    .map(|(id, _)| id.to_string());
                if let Some(id) = held {
                    self.note(format!("Sent answers the resume of {id}"));
                    self.sent.answer_resume(&id);
                }
            }
            _ if what == sent::PLAN_RESUME => {
                let plan = [
                    model::ResumePlan::Answer,
                    model::ResumePlan::NoStream,
                    model::ResumePlan::Full,
                    model::ResumePlan::Failed,
                    model::ResumePlan::Hold,
                    model::ResumePlan::CollidingStream,
                ][flags as usize % 6];
                self.sent.plan_resume(plan);
            }
            _ => {}
        }
        self.model_flush();
    }

    /// Everything the model has to send, through the intake to the router, on the connections still open.
    fn model_flush(&mut self) {
        self.forget_model_events();
        for transmit in std::mem::take(&mut self.sent_out) {
            let conn = ConnId::from(transmit.conn);
            if self.conns.get(&conn) != Some(&ConnState::Open) {
                continue;
            }
            match transmit.message {
                model::Message::Text(text) => self.sent_text(conn, &text),
                model::Message::Binary(data) => self.sent_audio(conn, &data),
                model::Message::Close(_) | model::Message::Kill => {
                    // What the router wrote while the connection was open is judged as of then.
                    let ping = self.pending_ping.take();
                    self.drain(OpContext { name: "sent", ping });
                    self.note(format!("Sent closes {conn}"));
                    self.conns.insert(conn, ConnState::Closed);
                    self.router.handle_closed(self.now, conn);
                    self.model_closed(conn, false);
                }
            }
        }
    }
}

/// Now and then, one field of a frame removed or replaced by a value of another type.
fn mutate(frame: &mut Value, input: &mut Input) {
    let how = input.u8();
    let Value::Object(fields) = frame else {
        return;
    };
    if fields.is_empty() || how < 224 {
        return;
    }
    let at = input.u8() as usize % fields.len();
    let Some(name) = fields.keys().nth(at).cloned() else {
        return;
    };
    if how < 232 {
        fields.remove(&name);
        return;
    }
    let values = [
        Value::Null,
        json!(true),
        json!(1.5),
        json!(-1),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!({}),
        json!(1e300),
        json!("vs_a"),
    ];
    fields.insert(name, values[how as usize % values.len()].clone());
}

/// The number of a `call_ref` as the call reads it (`t<n>`, n > 0).
fn ref_number(call_ref: &str) -> Option<u64> {
    call_ref.strip_prefix('t')?.parse().ok().filter(|n| *n > 0)
}

/// Whether a text holds what looks like a resume token (`vsr_` and at least 22 more token characters).
fn quotes_a_token(text: &str) -> bool {
    text.match_indices("vsr_").any(|(at, _)| {
        text[at + 4..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .count()
            >= 22
    })
}

// ----- the clock and the guests -----

impl Harness {
    /// The clock moves on by `by`; whatever falls due meanwhile runs at its moment, as in the agent's loop.
    fn advance(&mut self, by: Duration) {
        let until = self.now + by;
        for _ in 0..10_000 {
            match self.router.poll_timeout() {
                Some(at) if at <= until => {
                    self.now = self.now.max(at);
                    self.router.handle_timeout(self.now);
                    if self.checks.deadline_moves_on {
                        if let Some(next) =
                            self.router.poll_timeout().filter(|next| *next <= self.now)
                        {
                            let late = self.now - next;
                            self.broke(format_args!(
                                "after timeout(now) the router's deadline is still due ({late:?} ago): the agent's loop would spin"
                            ));
                        }
                    }
                }
                _ => break,
            }
        }
        self.now = until;
    }

    fn session_of(&self, key: CallKey) -> String {
        self.calls
            .get(&key)
            .map_or_else(|| SESSIONS[0].to_string(), |s| s.session_id.clone())
    }

    fn next_event(&mut self, key: CallKey) {
        let event = self.router.poll_event(key);
        self.note(format!("next_event on {key:?}: {event:?}"));
        let Some(seen) = self.calls.get_mut(&key) else {
            if event.is_some() {
                self.broke("an event for a call that never was");
            }
            return;
        };
        let Some(event) = event else {
            seen.sleeping = true;
            return;
        };
        let rule = if seen.sleeping {
            Some("an event was queued without a wake: the guest sleeps on")
        } else if seen.terminal {
            Some("an event after the call's end or loss")
        } else if !seen.took_any
            && seen.guest == GuestState::Serving
            && !matches!(
                event,
                GuestEvent::Start | GuestEvent::End { .. } | GuestEvent::Lost
            )
        {
            // (A call the host gave up on, flooded, hears only its end.)
            Some("a guest's first event is neither the start nor the end")
        } else {
            match &event {
                GuestEvent::Audio(_) if !seen.audio => Some("caller audio on a text call"),
                GuestEvent::Audio(samples) if samples.len() % 2 == 1 => {
                    Some("caller audio of half a sample")
                }
                _ => None,
            }
        };
        seen.took_any = true;
        seen.terminal |= matches!(event, GuestEvent::End { .. } | GuestEvent::Lost);
        if let Some(rule) = rule {
            self.broke(format_args!("{rule} ({key:?}: {event:?})"));
        }
    }

    /// The writer's report for call `key`'s connection, as the shell gives it before a guest's frame: all
    /// it was handed there but `unwritten`.
    fn report_written(&mut self, key: CallKey, unwritten: usize) {
        let Some(conn) = self.router.conn_of(key) else {
            return;
        };
        let handed = self.handed.get(&(conn, key)).copied().unwrap_or(0);
        let written = handed.saturating_sub(unwritten as u64);
        self.router.handle_written(self.now, conn, key, written);
    }

    /// A counted frame of the guest's, encoded and checked by the codec first, as the guest's port does.
    fn guest_send(&mut self, key: CallKey, frame: Frame, unwritten: usize) {
        let Ok(text) = frames::encode_to_string(&frame) else {
            return;
        };
        self.report_written(key, unwritten);
        let result = self
            .router
            .handle_send(self.now, key, &frame, text)
            .map_err(|not| match not {
                NotNow::Refused(refused) => refused,
                // Waiting is the shell's; to the harness it is a refusal that counts nothing.
                NotNow::Wait(_) => Refused::OverLimit,
            });
        let seen = self.calls.get(&key);
        if (seen.is_none() || seen.is_some_and(|s| s.finished)) && result != Err(Refused::Ended) {
            self.broke(format_args!(
                "a frame of a call that ended was not refused ended: {result:?}"
            ));
        }
        if result.is_ok() && matches!(frame, Frame::AgentSay(_)) && seen.is_some_and(|s| s.audio) {
            self.broke("agent.say on an audio call was taken");
        }
    }

    fn guest_tool(
        &mut self,
        key: CallKey,
        name: String,
        arguments: Option<Map<String, Value>>,
        unwritten: usize,
    ) {
        self.report_written(key, unwritten);
        let arguments = arguments.map(|a| Value::Object(a).to_string());
        let result = self
            .router
            .handle_tool(self.now, key, name, arguments.as_deref());
        let Ok(call_ref) = result else {
            return;
        };
        let Some(seen) = self.calls.get_mut(&key) else {
            self.broke("a tool call of a call that never was was taken");
        };
        if seen.finished {
            self.broke("a tool call of a call that ended was taken");
        }
        if seen.refs.insert(call_ref.clone(), 0).is_some() {
            self.broke(format_args!("call_ref {call_ref} given to the guest twice"));
        }
    }
}

// ----- what the router asks for -----

impl Harness {
    /// A connection the router writes on must be open.
    fn writable(&self, conn: ConnId, what: &str) {
        if self.conns.get(&conn) != Some(&ConnState::Open) {
            self.broke(format_args!(
                "{what} for connection {conn}, which is {:?}",
                self.conns.get(&conn)
            ));
        }
    }

    /// Drains the router's outputs after an operation and checks them, and the calls' places.
    fn drain(&mut self, op: OpContext) {
        let mut outputs = Vec::new();
        while let Some(output) = self.router.poll_output() {
            outputs.push(output);
            if outputs.len() > 1_000_000 {
                self.broke(format_args!("{}: outputs without end", op.name));
            }
        }
        let mut pongs = 0;
        let mut framed = Vec::new();
        let mut audio = Vec::new();
        // What reaches the model of Sent: (connection, call, text or audio).
        let mut to_sent: Vec<(ConnId, CallKey, model::Message)> = Vec::new();
        for output in outputs {
            match output {
                Output::Call(call::Output::Frame {
                    conn,
                    key,
                    text,
                    counted,
                }) => {
                    self.writable(conn, "a frame");
                    to_sent.push((conn, key, model::Message::Text(text.clone())));
                    if key == STRAY_HANGUP {
                        // A session no call serves (resumed for nobody, or a start the host cannot
                        // take): only a hangup may go.
                        let hangup = frames::decode(&text)
                            .is_ok_and(|f| matches!(&f, Frame::ToolCall(t) if t.name == "hangup"));
                        if !hangup {
                            self.broke(format_args!("a stray frame that is not a hangup: {text}"));
                        }
                        continue;
                    }
                    self.check_frame(key, &text);
                    if counted {
                        *self.handed.entry((conn, key)).or_default() += 1;
                    }
                    framed.push((key, conn));
                }
                Output::Call(call::Output::Audio {
                    conn,
                    key,
                    message,
                    backlog,
                }) => {
                    self.writable(conn, "audio");
                    to_sent.push((conn, key, model::Message::Binary(message.to_vec())));
                    let Some(seen) = self.calls.get(&key) else {
                        self.broke(format_args!("audio of a call never started ({key:?})"));
                    };
                    let samples = message.len().saturating_sub(wire::AUDIO_HEADER);
                    let stream = wire::stream_of(&message).unwrap_or(0);
                    let rule = if seen.finished {
                        Some("audio of a call that had ended")
                    } else if !seen.audio {
                        Some("audio of a text call")
                    } else if samples == 0 || samples % 2 == 1 {
                        Some("an audio message without whole samples")
                    } else if message.len() > MAX_AUDIO_MESSAGE {
                        Some("an audio message over 200 ms at 24 kHz")
                    } else if stream == 0 {
                        Some("audio on stream 0")
                    } else if backlog < samples {
                        Some("an audio backlog smaller than one message")
                    } else {
                        None
                    };
                    if let Some(rule) = rule {
                        self.broke(format_args!(
                            "{}: {rule} ({key:?}, {} bytes)",
                            op.name,
                            message.len()
                        ));
                    }
                    audio.push((key, conn, stream));
                }
                Output::Call(call::Output::Retract { conn, key }) => {
                    if !self.calls.contains_key(&key) {
                        self.broke(format_args!(
                            "a retraction for a call never started ({key:?})"
                        ));
                    }
                    // What was queued there is not written after all (a replay brings it again).
                    framed.retain(|(k, c)| (*k, *c) != (key, conn));
                    audio.retain(|(k, c, _)| (*k, *c) != (key, conn));
                    to_sent.retain(|(c, k, _)| (*k, *c) != (key, conn));
                }
                Output::Call(call::Output::Answer {
                    key,
                    call_ref,
                    answer,
                }) => {
                    let exact = self.checks.answers_carry_the_issued_ref;
                    let Some(seen) = self.calls.get_mut(&key) else {
                        self.broke(format_args!("an answer for a call never started ({key:?})"));
                    };
                    let issued = if exact || seen.refs.contains_key(&call_ref) {
                        Some(call_ref.clone())
                    } else {
                        let n = ref_number(&call_ref);
                        seen.refs
                            .keys()
                            .find(|r| n.is_some() && ref_number(r) == n)
                            .cloned()
                    };
                    let rule = match issued.and_then(|r| seen.refs.get_mut(&r)) {
                        Some(n) => {
                            *n += 1;
                            (*n > 1).then_some("a guest's tool call answered twice")
                        }
                        None => Some("an answer for a call_ref the guest was never given"),
                    };
                    let carried = match &answer {
                        Ok(answer) if answer.call_ref != call_ref => Some(answer.call_ref.clone()),
                        _ => None,
                    };
                    if let Some(rule) = rule {
                        self.broke(format_args!(
                            "{}: {rule} ({key:?}, {call_ref:?}: {answer:?})",
                            op.name
                        ));
                    }
                    if let Some(carried) = carried {
                        self.broke(format_args!(
                            "an answer for {call_ref:?} carries {carried:?}"
                        ));
                    }
                }
                Output::Call(call::Output::Wake { key }) => match self.calls.get_mut(&key) {
                    Some(seen) => seen.sleeping = false,
                    None => self.broke(format_args!("a wake for a call never started ({key:?})")),
                },
                Output::Pong { conn, text } => {
                    self.writable(conn, "a pong");
                    to_sent.push((conn, STRAY_HANGUP, model::Message::Text(text.clone())));
                    pongs += 1;
                    let owed = op.ping.filter(|(on, _)| *on == conn).map(|(_, ts)| ts);
                    let pong = frames::decode(&text).ok();
                    let answers =
                        matches!((&pong, owed), (Some(Frame::Pong(p)), Some(ts)) if p.ts == ts);
                    if !answers {
                        self.broke(format_args!("a pong {text} for no ping ({:?})", op.ping));
                    }
                }
                Output::Dial { conn, delay } => {
                    if self.stopped {
                        self.broke(format_args!("dialled {conn} after the agent stopped"));
                    }
                    if self.conns.contains_key(&conn) || conn == STRAY_CONN {
                        self.broke(format_args!("connection {conn} dialled twice"));
                    }
                    if delay > MAX_DIAL_DELAY {
                        self.broke(format_args!("a dial delayed {delay:?}"));
                    }
                    self.conns.insert(conn, ConnState::Dialing);
                    let held = self
                        .conns
                        .values()
                        .filter(|s| matches!(s, ConnState::Dialing | ConnState::Open))
                        .count();
                    if held > self.connections + EXTRA_CONNECTIONS {
                        self.broke(format_args!(
                            "{held} connections held or dialled, over {} + {EXTRA_CONNECTIONS}",
                            self.connections
                        ));
                    }
                }
                Output::Close { conn, why } => {
                    self.writable(conn, "a close");
                    self.model_closed(conn, why == crate::router::Closing::Unneeded);
                }
                Output::Spawn { key, start } => {
                    if self.stopped {
                        self.broke("a call started after the agent stopped");
                    }
                    if self.calls.contains_key(&key) {
                        self.broke(format_args!("{key:?} spawned twice"));
                    }
                    let twin = self
                        .calls
                        .values()
                        .any(|s| !s.finished && s.session_id == start.session_id);
                    if twin {
                        self.broke(format_args!(
                            "a second live call for session {}",
                            start.session_id
                        ));
                    }
                    self.keys.push(key);
                    self.calls.insert(
                        key,
                        Seen {
                            session_id: start.session_id.clone(),
                            // The session type decides (a text call's stray `audio` is not audio).
                            audio: start.session_type == "audio" && start.audio.is_some(),
                            guest: GuestState::Serving,
                            took_any: false,
                            terminal: false,
                            finished: false,
                            sleeping: false,
                            refs: BTreeMap::new(),
                            tool_refs: Vec::new(),
                            last_resume_received: 0,
                        },
                    );
                }
            }
        }
        if let Some((conn, ts)) = op.ping {
            let owed = !self.stopped && self.conns.get(&conn) == Some(&ConnState::Open);
            if owed && pongs != 1 {
                self.broke(format_args!("ping {ts} on {conn} answered {pongs} times"));
            }
        }
        self.check_places(&framed, &audio, op.name);
        self.model_reads(to_sent);
        let open = self.router.stats().connections_open;
        let known = self
            .conns
            .values()
            .filter(|c| **c == ConnState::Open)
            .count() as u64;
        if open > known {
            self.broke(format_args!(
                "{open} connections counted open, {known} opened and not closed"
            ));
        }
    }

    /// A frame the router writes for a call: the agent's, valid, naming the call's session.
    fn check_frame(&mut self, key: CallKey, text: &str) {
        let Some(seen) = self.calls.get(&key) else {
            self.broke(format_args!(
                "a frame of a call never started ({key:?}): {text}"
            ));
        };
        let frame = match frames::decode(text) {
            Ok(frame) => frame,
            Err(error) => self.broke(format_args!(
                "an invalid frame written ({}): {text}",
                error.message
            )),
        };
        let frame_type = frame.frame_type();
        let rule = if seen.finished {
            Some("a frame of a call that had ended")
        } else if !frames::FROM_AGENT.contains(&frame_type) || frame_type == frames::Pong::TYPE {
            Some("a frame that is not a call's frame of the agent's")
        } else if frame.session_id() != Some(seen.session_id.as_str()) {
            Some("a frame naming another session")
        } else if matches!(frame, Frame::AgentSay(_)) && seen.audio {
            Some("agent.say on an audio call")
        } else if matches!(&frame, Frame::SessionResume(r) if r.received < seen.last_resume_received)
        {
            Some("a resume that counts fewer frames read than the one before")
        } else {
            None
        };
        if let Some(rule) = rule {
            self.broke(format_args!("{rule} ({key:?}): {text}"));
        }
        let Some(seen) = self.calls.get_mut(&key) else {
            return;
        };
        match frame {
            Frame::ToolCall(call) => {
                if seen.tool_refs.len() >= 64 {
                    seen.tool_refs.remove(0);
                }
                seen.tool_refs.push(call.call_ref);
            }
            Frame::SessionResume(resume) => seen.last_resume_received = resume.received,
            _ => {}
        }
    }

    /// Where the calls are after an operation: on open connections, one stream per call on each; and what
    /// the operation wrote went where the call is.
    fn check_places(
        &mut self,
        framed: &[(CallKey, ConnId)],
        audio: &[(CallKey, ConnId, u16)],
        op: &str,
    ) {
        let mut places = BTreeMap::new();
        let mut streams = BTreeSet::new();
        for key in self.keys.clone() {
            let seen = &self.calls[&key];
            if seen.finished {
                continue;
            }
            let call = self
                .router
                .call(&seen.session_id)
                .filter(|c| c.key() == key);
            let place = match call {
                Some(call) if !call.finished() => call.place(),
                _ => {
                    if let Some(seen) = self.calls.get_mut(&key) {
                        seen.finished = true;
                    }
                    continue;
                }
            };
            match place {
                Place::Live { conn, stream } => {
                    self.writable(conn, "a live call");
                    if let Some(stream) = stream {
                        if !streams.insert((conn, stream)) {
                            self.broke(format_args!(
                                "{op}: two live calls on stream {stream} of connection {conn}"
                            ));
                        }
                    }
                }
                Place::Moving { conn, .. } => self.writable(conn, "a moving call"),
                Place::Detached { .. } | Place::Done => {}
            }
            places.insert(key, place);
        }
        for (key, conn) in framed {
            match places.get(key) {
                // Ended meanwhile, or forgotten.
                None => {}
                Some(Place::Live { conn: on, .. } | Place::Moving { conn: on, .. })
                    if on == conn => {}
                Some(place) => self.broke(format_args!(
                    "{op}: a frame of {key:?} written on {conn}, but the call is {place:?}"
                )),
            }
        }
        for (key, conn, stream) in audio {
            match places.get(key) {
                Some(Place::Live {
                    conn: on,
                    stream: Some(s),
                }) if on == conn && s == stream => {}
                place => self.broke(format_args!(
                    "{op}: audio of {key:?} on {conn} stream {stream}, but the call is {place:?}"
                )),
            }
        }
    }

    /// The agent stops: every guest still there hears its call's end, every tool call of a guest has its
    /// one answer, and nothing is left behind.
    fn finish(&mut self) {
        if !self.stopped {
            self.note("stop (the end of the input)".into());
            self.stopped = true;
            self.router.stop(self.now);
            self.drain(OpContext {
                name: "stop",
                ..OpContext::default()
            });
        }
        for key in self.keys.clone() {
            if self.calls[&key].guest == GuestState::Gone {
                continue;
            }
            for _ in 0..100_000 {
                self.next_event(key);
                if self.calls[&key].sleeping {
                    break;
                }
            }
            if !self.calls[&key].terminal {
                self.broke(format_args!(
                    "the guest of {key:?} never heard its call's end"
                ));
            }
        }
        self.drain(OpContext {
            name: "the guests' last events",
            ..OpContext::default()
        });
        if self.router.calls() != 0 {
            self.broke(format_args!("{} calls left behind", self.router.calls()));
        }
        for (key, seen) in &self.calls {
            if let Some((call_ref, n)) = seen.refs.iter().find(|(_, n)| **n != 1) {
                self.broke(format_args!(
                    "{key:?}'s tool call {call_ref} answered {n} times"
                ));
            }
        }
        let open = self.router.stats().connections_open;
        if open != 0 {
            self.broke(format_args!("{open} connections still counted open"));
        }
    }
}

// ----- seeds -----

/// Writes an input for [`run`] operation by operation: the seeds of the corpus.
pub struct Script(Vec<u8>);

impl Script {
    /// An agent holding `connections` connections (1 to 3), under the default limits, hanging up on the
    /// calls it cannot serve.
    pub fn new(connections: u8) -> Script {
        let mut bytes = vec![connections.saturating_sub(1), 0, 0];
        bytes.extend_from_slice(&[0; 8]);
        Script(bytes)
    }

    pub fn op(mut self, code: u8, fields: &[u8]) -> Script {
        self.0.push(code);
        self.0.extend_from_slice(fields);
        self
    }

    /// The next dialled connection opens with `max_sessions` 10.
    pub fn open(self) -> Script {
        self.op(op::OPEN, &[0, 3])
    }

    /// Raw text from Sent on the `conn`-th open connection.
    pub fn text(self, conn: u8, text: &str) -> Script {
        let len = u16::try_from(text.len()).expect("a seed's text fits 16 bits");
        self.op(op::TEXT, &[conn])
            .op_bytes(&len.to_le_bytes())
            .op_bytes(text.as_bytes())
    }

    /// Binary audio from Sent on the `conn`-th open connection: 640 bytes (20 ms at 16 kHz) on `stream`.
    pub fn audio(self, conn: u8, stream: u8) -> Script {
        self.op(op::AUDIO, &[conn, stream, 5, 1])
    }

    /// A request of the guest of the `call`-th call (its fields follow).
    pub fn guest(self, code: u8, call: u8, fields: &[u8]) -> Script {
        self.op(code, &[call]).op_bytes(fields)
    }

    /// The clock moves on by `millis[at]` of [`MILLIS`].
    pub fn advance(self, at: u8) -> Script {
        self.op(op::ADVANCE, &[at])
    }

    /// The model of Sent does `what` (of [`sent`]), with a choice byte and a flags byte.
    pub fn sent(self, what: u8, choice: u8, flags: u8) -> Script {
        self.op(op::STOP, &[32 + what, choice, flags])
    }

    fn op_bytes(mut self, bytes: &[u8]) -> Script {
        self.0.extend_from_slice(bytes);
        self
    }

    pub fn bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Protocol appendix B: one valid example of every frame.
pub const APPENDIX_B: &[&str] = &[
    r#"{"type":"connection.ready","protocol_version":"0.2.0","heartbeat_interval_ms":15000,"max_sessions":10}"#,
    r#"{"type":"connection.draining"}"#,
    r#"{"type":"ping","ts":1767139200000}"#,
    r#"{"type":"pong","ts":1767139200000}"#,
    r#"{"type":"error","error":{"code":"frame_not_allowed","message":"illustrative message"},"session_id":"vs_7f3a","frame_type":"agent.say"}"#,
    r#"{"type":"session.start","session_id":"vs_7f3a","call_id":"call_91c2","agent_id":"agent_9f2ab000-0000-4000-8000-000000000001","direction":"inbound","from":{"kind":"number","value":"+14155550100"},"to":{"kind":"agent","value":"agent_9f2ab000-0000-4000-8000-000000000001"},"session_type":"text","language":"en-US","max_duration_ms":1800000,"resume":{"token":"vsr_0123456789abcdefghijklmnop","window_ms":15000},"started_at":"2026-11-30T10:00:00Z"}"#,
    r#"{"type":"session.start","session_id":"vs_8b01","call_id":"call_77aa","agent_id":"agent_1","direction":"outbound","from":{"kind":"agent","value":"agent_1"},"to":{"kind":"number","value":"+442071838750"},"session_type":"audio","audio":{"stream":1,"sample_rate":16000},"context":{"order_id":"A-1001"},"started_at":"2026-11-30T10:00:00Z"}"#,
    r#"{"type":"user.said","session_id":"vs_7f3a","text":"I need a person"}"#,
    r#"{"type":"user.said","session_id":"vs_7f3a","text":"I need a refund","correction":true}"#,
    r#"{"type":"tool.result","session_id":"vs_7f3a","call_ref":"t1","ok":true}"#,
    r#"{"type":"tool.result","session_id":"vs_7f3a","call_ref":"t2","ok":false,"error":{"code":"some_code","message":"why"}}"#,
    r#"{"type":"session.end","session_id":"vs_7f3a","reason":"caller_hung_up","duration_ms":52310}"#,
    r#"{"type":"session.resumed","session_id":"vs_8b01","received":12,"resume":{"token":"vsr_zyxwvutsrqponmlkjihgfedcba","window_ms":15000},"audio":{"stream":3}}"#,
    r#"{"type":"session.resumed","session_id":"vs_7f3a","received":4}"#,
    r#"{"type":"agent.say","session_id":"vs_7f3a","text":"Let me check","last":false,"interruptible":false}"#,
    r#"{"type":"agent.say","session_id":"vs_7f3a","text":"that for you."}"#,
    r#"{"type":"tool.call","session_id":"vs_7f3a","call_ref":"t1","name":"transfer","arguments":{"to":{"kind":"number","value":"+14155550100"}}}"#,
    r#"{"type":"tool.call","session_id":"vs_7f3a","call_ref":"t2","name":"hangup"}"#,
    r#"{"type":"tool.call","session_id":"vs_7f3a","call_ref":"t3","name":"send_dtmf","arguments":{"digits":"12#w3"}}"#,
    r#"{"type":"tool.call","session_id":"vs_7f3a","call_ref":"t4","name":"hold","arguments":{"held":true}}"#,
    r#"{"type":"agent.clear","session_id":"vs_7f3a"}"#,
    r#"{"type":"session.resume","session_id":"vs_7f3a","token":"vsr_0123456789abcdefghijklmnop","received":3}"#,
    r#"{"type":"session.note","session_id":"vs_7f3a","x":1}"#,
];

/// The seeds of the corpus: every frame of appendix B on a call of each kind, and a few whole calls.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let text_start = APPENDIX_B[5];
    let audio_start = APPENDIX_B[6];
    let mut seeds = Vec::new();
    for (n, frame) in APPENDIX_B.iter().enumerate() {
        let start = if frame.contains("vs_8b01") {
            audio_start
        } else {
            text_start
        };
        let script = Script::new(1).open().text(0, start).text(0, frame);
        seeds.push((format!("seed-appendix-b-{n:02}"), script.bytes()));
    }
    // A text call from start to end: events, a say, a tool call and its result, the end.
    let text_call = Script::new(1)
        .open()
        .text(0, text_start)
        .guest(op::NEXT_EVENT, 0, &[])
        .text(0, APPENDIX_B[7])
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::SAY, 0, &[2, 0, 0])
        .guest(op::TOOL, 0, &[0, 0, 0])
        .text(0, APPENDIX_B[9])
        .guest(op::NEXT_EVENT, 0, &[])
        .text(0, APPENDIX_B[11])
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::NEXT_EVENT, 0, &[]);
    seeds.push(("seed-text-call".into(), text_call.bytes()));
    // An audio call: caller audio in, agent audio out.
    let audio_call = Script::new(1)
        .open()
        .text(0, audio_start)
        .guest(op::NEXT_EVENT, 0, &[])
        .audio(0, 1)
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::SEND_AUDIO, 0, &[7])
        .guest(op::CLEAR, 0, &[0]);
    seeds.push(("seed-audio-call".into(), audio_call.bytes()));
    // A call whose connection drops: it moves to the other one, and Sent resumes it there.
    let resumed = Script::new(2)
        .open()
        .open()
        .text(0, text_start)
        .guest(op::SAY, 0, &[0, 0, 0])
        .op(op::CLOSED, &[0])
        .op(op::REPLY, &[0, reply::RESUMED, 0, 0, 0])
        .guest(op::SAY, 0, &[0, 0, 0]);
    seeds.push(("seed-resumed".into(), resumed.bytes()));
    // Draining, then connection_full on the new connection, then the resume window passes.
    let full = Script::new(1)
        .open()
        .text(0, text_start)
        .text(0, APPENDIX_B[1])
        .open()
        .op(op::REPLY, &[0, reply::CONNECTION_FULL, 0, 0, 0])
        .advance(11)
        .advance(12)
        .guest(op::NEXT_EVENT, 0, &[]);
    seeds.push(("seed-connection-full".into(), full.bytes()));
    // The agent gives up on a call: the failure policy's hangup goes out, Sent ends the call.
    let give_up = Script::new(1)
        .open()
        .text(0, text_start)
        .guest(op::GIVE_UP, 0, &[])
        .op(op::REPLY, &[0, reply::TOOL_RESULT, 0, 0, 0])
        .op(op::REPLY, &[0, reply::END, 0, 0, 0]);
    seeds.push(("seed-give-up".into(), give_up.bytes()));
    // A call that sent more than Sent's replay can hold, resumed from nothing: the gap hangs up.
    let mut gap = Script::new(2).open().open().text(0, text_start);
    for _ in 0..=frames::RETAINED_FRAMES {
        gap = gap.guest(op::SAY, 0, &[0, 0, 0]);
    }
    let gap = gap
        .guest(op::SAY, 0, &[0, 0, 35])
        .op(op::CLOSED, &[0])
        .op(op::REPLY, &[0, reply::RESUMED, 2, 0, 0]);
    seeds.push(("seed-replay-gap".into(), gap.bytes()));
    // An audio call that moves: a new stream on the new connection, audio both ways there.
    let audio_resumable = audio_start.replace(
        r#""context""#,
        r#""resume":{"token":"vsr_0123456789abcdefghijklmnop","window_ms":15000},"context""#,
    );
    let audio_moves = Script::new(2)
        .open()
        .open()
        .text(0, &audio_resumable)
        .guest(op::SEND_AUDIO, 0, &[8])
        .op(op::CLOSED, &[0])
        .op(op::REPLY, &[0, reply::RESUMED, 0, 4, 0])
        .audio(0, 2)
        .guest(op::SEND_AUDIO, 0, &[9])
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::NEXT_EVENT, 0, &[]);
    seeds.push(("seed-audio-moves".into(), audio_moves.bytes()));
    // A tool call Sent never answers: timed out.
    let timed_out = Script::new(1)
        .open()
        .text(0, text_start)
        .guest(op::TOOL, 0, &[4, 5, 0])
        .advance(11);
    seeds.push(("seed-tool-times-out".into(), timed_out.bytes()));
    // Dials that fail, back off and open; a ping; an idle minute.
    let dials = Script::new(2)
        .op(op::DIAL_FAILED, &[0])
        .advance(5)
        .open()
        .open()
        .op(op::PING, &[0, 2])
        .advance(12);
    seeds.push(("seed-dials".into(), dials.bytes()));
    seeds.push(("seed-model-calls".into(), model_calls().bytes()));
    seeds
}

/// The model of Sent's calls: an audio call and a text call, speech, a tool answered, a drop, resumes
/// answered with the model's own counts and tokens, a drain that closes the emptied connection.
fn model_calls() -> Script {
    Script::new(2)
        .open()
        .open()
        .sent(sent::START, 0, 1)
        .sent(sent::START, 1, 0)
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::NEXT_EVENT, 1, &[])
        .sent(sent::SAID, 1, 0)
        .sent(sent::AUDIO, 0, 3)
        .guest(op::SAY, 1, &[0, 0, 0])
        .guest(op::TOOL, 1, &[4, 5, 0])
        .sent(sent::ANSWER, 1, 0)
        .op(op::CLOSED, &[0])
        // The calls move to the other connection: the model answers the resumes.
        .sent(sent::SAID, 1, 0)
        .sent(sent::DRAIN, 0, 0)
        .open()
        .sent(sent::SAID, 1, 0)
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::NEXT_EVENT, 1, &[])
        .sent(sent::END, 0, 0)
        .sent(sent::END, 0, 0)
        .guest(op::NEXT_EVENT, 0, &[])
        .guest(op::NEXT_EVENT, 1, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn corpus() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/intake")
    }

    fn corpus_files() -> Vec<(PathBuf, Vec<u8>)> {
        super::super::corpus::files(&corpus())
    }

    /// Runs one input; on a panic, says which.
    fn replay(name: &str, bytes: &[u8]) {
        super::super::corpus::replay("intake", name, bytes, run);
    }

    /// The short version of the fuzzing, on every `cargo test`: the kept corpus replays cleanly.
    #[test]
    fn the_fuzz_corpus_replays_cleanly() {
        let files = corpus_files();
        assert!(
            files.len() >= 10,
            "the corpus is missing: {}",
            corpus().display()
        );
        for (path, bytes) in &files {
            replay(&path.display().to_string(), bytes);
        }
    }

    /// And twice as many inputs more: the corpus's, with a few bytes changed at random (a fixed seed).
    #[test]
    fn mutated_corpus_inputs_break_no_rule() {
        let mut rng = fastrand::Rng::with_seed(0x5e47);
        for (path, bytes) in corpus_files() {
            for round in 0..2 {
                let mutated = super::super::corpus::mutate(&bytes, &mut rng);
                replay(
                    &format!("{} (mutation {round}: {mutated:?})", path.display()),
                    &mutated,
                );
            }
        }
    }

    /// The well-behaved Sent is only worth having if its calls reach the router and move as Sent moves
    /// them.
    #[test]
    fn the_model_of_sents_calls_are_served_and_resumed() {
        let bytes = model_calls().bytes();
        let mut input = Input { data: &bytes };
        let mut harness = Harness::new(&mut input, Checks::ALL);
        while !input.is_empty() {
            harness.step(&mut input);
        }
        let stats = harness.router.stats();
        let served = harness
            .calls
            .values()
            .filter(|s| s.session_id.starts_with("vs_sim-"))
            .count();
        assert_eq!(served, 2, "both of the model's calls reached a guest");
        assert!(stats.resumes >= 2, "both moved: {stats:?}");
        let ended = harness
            .sent
            .sessions()
            .filter(|(_, s)| s.ended.is_some())
            .count();
        assert_eq!(ended, 2);
        harness.finish();
    }

    #[test]
    fn the_seeds_run_cleanly() {
        for (name, bytes) in seeds() {
            replay(&name, &bytes);
        }
    }

    #[test]
    fn empty_and_short_inputs_run() {
        run(&[]);
        run(&[0]);
        run(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, op::OPEN]);
    }

    /// Every check [`Checks::KNOWN_OK`] leaves off has its reproducers in `proto/fuzz/known/` (named after
    /// the check), and each still breaks that rule with [`Checks::ALL`], and nothing else: a check is never
    /// off without the input that shows why, nor left off once the host is fixed. (None is off today, and
    /// the folder does not exist.)
    #[test]
    fn every_check_left_off_has_a_reproducer_that_still_breaks_it() {
        let known = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/known");
        let mut named = BTreeSet::new();
        for entry in std::fs::read_dir(&known).into_iter().flatten() {
            let path = entry.expect("a reproducer").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let bytes = std::fs::read(&path).expect("a reproducer");
            replay(&path.display().to_string(), &bytes);
            let check = name.split('-').next().unwrap_or_default().to_string();
            let mut only = Checks::KNOWN_OK;
            match check.as_str() {
                "deadline_moves_on" => only.deadline_moves_on = true,
                "answers_carry_the_issued_ref" => only.answers_carry_the_issued_ref = true,
                _ => panic!("{name}: name a check first"),
            }
            let outcome = std::panic::catch_unwind(|| run_with(&bytes, only));
            assert!(
                outcome.is_err(),
                "{name} no longer breaks its rule: turn `{check}` on in Checks::KNOWN_OK and delete {}",
                path.display()
            );
            named.insert(check);
        }
        let Checks {
            deadline_moves_on,
            answers_carry_the_issued_ref,
        } = Checks::KNOWN_OK;
        for (check, on) in [
            ("deadline_moves_on", deadline_moves_on),
            ("answers_carry_the_issued_ref", answers_carry_the_issued_ref),
        ] {
            assert!(
                on || named.contains(check),
                "`{check}` is off in Checks::KNOWN_OK with no reproducer in {}",
                known.display()
            );
        }
    }

    /// Runs the input in the file `FUZZ_INPUT` with every check, on stable: `FUZZ_INPUT=crash-… cargo test -p
    /// voicehost-proto --lib fuzzing::intake::tests::replay_input -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn replay_input() {
        let path =
            PathBuf::from(std::env::var("FUZZ_INPUT").expect("FUZZ_INPUT: the file of an input"));
        // Tests run in host/: a relative path is taken from the repository's root.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let bytes = std::fs::read(root.join(&path)).expect("the input");
        run_with(&bytes, Checks::ALL);
    }

    /// Writes the seeds into the corpus: `cargo test -p voicehost-proto --lib fuzzing::intake::tests::write_seeds --
    /// --ignored`, before `scripts/fuzz` minimises it.
    #[test]
    #[ignore]
    fn write_seeds() {
        std::fs::create_dir_all(corpus()).expect("the corpus folder");
        for (name, bytes) in seeds() {
            std::fs::write(corpus().join(name), bytes).expect("a seed");
        }
    }
}
