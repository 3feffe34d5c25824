//! What waits to be written on one connection, bounded: pongs (and the close) in a lane of their own that
//! never waits behind data; frames and audio in one queue, in order, each tagged with its call so that a
//! call that ended or moved can take back what is still queued; per call, at most a set amount of audio
//! (the oldest dropped and counted). And what the connection's reader and writer have done, for the
//! core's rules: when Sent was last heard, when the writer last made progress, and how many of each
//! call's counted frames it has written ([`Outbox::activity`], [`Outbox::frames_written`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use voicehost_proto::call::CallKey;
use voicehost_proto::router::Activity;

/// Pongs waiting at most: a Sent that pings faster than the socket takes them only needs the newest.
pub const MAX_PONGS: usize = 8;

/// At most this many messages, or this many bytes, are fed to the socket before a flush.
pub const MAX_BATCH: usize = 64;
pub const MAX_BATCH_BYTES: usize = 256 << 10;

struct Item {
    key: CallKey,
    message: Message,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One of the call's counted frames: the writer's count of them is reported to the core.
    Counted,
    /// A frame that is not counted (a `session.resume`).
    Uncounted,
    Audio,
}

#[derive(Default, Clone, Copy)]
struct Queued {
    frames: usize,
    audio_bytes: usize,
}

struct State {
    control: VecDeque<Message>,
    data: VecDeque<Item>,
    calls: HashMap<CallKey, Queued>,
    /// Each call's counted frames written (flushed) in all, while it is on the connection; and those
    /// taken by the writer and not flushed yet.
    written: HashMap<CallKey, u64>,
    in_flight: Vec<CallKey>,
    /// When the writer last had nothing waiting, or wrote something.
    progress: Instant,
    /// Stop at once, without a close frame (the socket takes nothing: Sent stalled).
    aborted: bool,
    /// A close frame to send, and why (for the reader's log); nothing is taken after it.
    close: Option<(CloseCode, &'static str)>,
    /// The reader has stopped: the writer finishes and stops too.
    reader_gone: bool,
    /// The writer has stopped: nothing queued from now on is written.
    writer_gone: bool,
}

/// One connection's queue to its writer.
pub struct Outbox {
    state: Mutex<State>,
    wake: Notify,
    /// The writer made progress (someone waiting for room looks again).
    written: Notify,
    /// The reader's last message, in nanoseconds since `born`, and whether it is handing one over now
    /// (atomics: the reader updates them per message, off the queue's lock).
    born: Instant,
    heard: AtomicU64,
    delivering: AtomicBool,
}

impl Default for Outbox {
    fn default() -> Outbox {
        let now = Instant::now();
        Outbox {
            state: Mutex::new(State {
                control: VecDeque::new(),
                data: VecDeque::new(),
                calls: HashMap::new(),
                written: HashMap::new(),
                in_flight: Vec::new(),
                progress: now,
                aborted: false,
                close: None,
                reader_gone: false,
                writer_gone: false,
            }),
            wake: Notify::new(),
            written: Notify::new(),
            born: now,
            heard: AtomicU64::new(0),
            delivering: AtomicBool::new(false),
        }
    }
}

/// What the writer takes in one turn.
#[derive(Default)]
pub(super) struct Batch {
    pub messages: Vec<Message>,
    pub close: Option<(CloseCode, &'static str)>,
    pub reader_gone: bool,
}

impl Outbox {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a frame's text of `key`'s, one of its counted frames or not.
    pub fn frame(&self, key: CallKey, text: String, counted: bool) {
        let mut state = self.state();
        if state.writer_gone || state.close.is_some() {
            return;
        }
        if state.data.is_empty() {
            // Nothing waited: the writer is up to date until now.
            state.progress = Instant::now();
        }
        state.calls.entry(key).or_default().frames += 1;
        state.data.push_back(Item {
            key,
            message: Message::Text(text.into()),
            kind: if counted {
                Kind::Counted
            } else {
                Kind::Uncounted
            },
        });
        drop(state);
        self.wake.notify_one();
    }

    /// Queues an audio message of `key`'s (stream number, then samples); at most `backlog` bytes of its
    /// samples wait: the oldest message goes first. Returns how many messages were dropped.
    /// [scenario: audio_flood_bounded]
    pub fn audio(&self, key: CallKey, message: Bytes, backlog: usize) -> usize {
        let mut state = self.state();
        if state.writer_gone || state.close.is_some() {
            return 1;
        }
        if state.data.is_empty() {
            state.progress = Instant::now();
        }
        let mut dropped = 0;
        let mut queued = state.calls.get(&key).copied().unwrap_or_default();
        let samples = samples_of(&message);
        while queued.audio_bytes > 0 && queued.audio_bytes + samples > backlog {
            let Some(at) = state
                .data
                .iter()
                .position(|i| i.key == key && i.kind == Kind::Audio)
            else {
                break;
            };
            if let Some(item) = state.data.remove(at) {
                queued.audio_bytes -= samples_of_message(&item.message);
                dropped += 1;
            }
        }
        queued.audio_bytes += samples;
        state.calls.insert(key, queued);
        state.data.push_back(Item {
            key,
            message: Message::Binary(message),
            kind: Kind::Audio,
        });
        drop(state);
        self.wake.notify_one();
        dropped
    }

    /// Queues a pong, ahead of every frame and audio message.
    pub fn pong(&self, text: String) {
        let mut state = self.state();
        if state.writer_gone || state.close.is_some() {
            return;
        }
        if state.control.len() >= MAX_PONGS {
            state.control.pop_front();
        }
        state.control.push_back(Message::Text(text.into()));
        drop(state);
        self.wake.notify_one();
    }

    /// [scenario: audio_of_an_ended_call_not_written] Takes back whatever of `key`'s is still queued: the
    /// call has left the connection (its count of frames written here goes with it).
    pub fn retract(&self, key: CallKey) {
        let mut state = self.state();
        if state.calls.remove(&key).is_some() {
            state.data.retain(|item| item.key != key);
        }
        state.written.remove(&key);
    }

    /// How many of `key`'s counted frames the writer has written here, in all.
    pub fn frames_written(&self, key: CallKey) -> u64 {
        self.state().written.get(&key).copied().unwrap_or(0)
    }

    /// Every call's count of counted frames written here.
    pub fn all_frames_written(&self) -> Vec<(CallKey, u64)> {
        self.state()
            .written
            .iter()
            .map(|(key, n)| (*key, *n))
            .collect()
    }

    /// What the reader and the writer have done, as of `now`: Sent heard (now, while the reader is
    /// handing a message over), and the writer's progress (now, when nothing waits).
    pub fn activity(&self, now: Instant) -> Activity {
        let heard = if self.delivering.load(Ordering::Acquire) {
            now
        } else {
            self.born + std::time::Duration::from_nanos(self.heard.load(Ordering::Acquire))
        };
        let state = self.state();
        let idle = state.data.is_empty() && state.control.is_empty() && state.in_flight.is_empty();
        let written = if idle { now } else { state.progress };
        Activity { heard, written }
    }

    /// The reader read a message from Sent: `true` while it hands it over (waiting for the agent's lock),
    /// `false` once it listens again.
    pub(super) fn heard(&self, delivering: bool) {
        let since = Instant::now().saturating_duration_since(self.born);
        self.heard.store(
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        self.delivering.store(delivering, Ordering::Release);
    }

    /// Resolves once the writer writes something (or stops) after this is enabled: enable it before
    /// looking, so that a write in between is not missed.
    pub fn wrote(&self) -> tokio::sync::futures::Notified<'_> {
        self.written.notified()
    }

    /// The writer flushed what it took: those frames are written.
    pub(super) fn flushed(&self) {
        let mut state = self.state();
        for key in std::mem::take(&mut state.in_flight) {
            *state.written.entry(key).or_default() += 1;
        }
        state.progress = Instant::now();
        drop(state);
        self.written.notify_waiters();
    }

    /// Stops the writer at once, with no close frame: the socket takes nothing.
    pub fn abort(&self) {
        self.state().aborted = true;
        self.wake.notify_one();
    }

    /// Whether [`Outbox::abort`] was called.
    pub(super) fn is_aborted(&self) -> bool {
        self.state().aborted
    }

    /// Closes cleanly with 1000 once the pongs before it are written (the queued data is not: the calls
    /// on the connection go to their fallback).
    pub fn close(&self) {
        self.close_with(CloseCode::Normal, "closed by the agent with 1000");
    }

    /// Closes with 1001 (going away) once the pongs before it are written: the connection's calls stay
    /// resumable.
    pub fn close_away(&self, why: &'static str) {
        self.close_with(CloseCode::Away, why);
    }

    pub(super) fn close_with(&self, code: CloseCode, why: &'static str) {
        let mut state = self.state();
        if state.close.is_none() {
            state.close = Some((code, why));
        }
        drop(state);
        self.wake.notify_one();
    }

    pub(super) fn reader_gone(&self) {
        self.state().reader_gone = true;
        self.wake.notify_one();
    }

    pub(super) fn writer_gone(&self) {
        let mut state = self.state();
        state.writer_gone = true;
        state.data.clear();
        state.control.clear();
        state.calls.clear();
        // Taken but never flushed: not written. What was written stays, for the core's last report.
        state.in_flight.clear();
        drop(state);
        self.written.notify_waiters();
    }

    /// Whether the writer has stopped.
    pub fn is_closed(&self) -> bool {
        self.state().writer_gone
    }

    /// The next batch: pongs first, then data in order, up to [`MAX_BATCH`] messages or
    /// [`MAX_BATCH_BYTES`]; or the close.
    pub(super) fn take(&self) -> Batch {
        let mut state = self.state();
        let mut batch = Batch {
            reader_gone: state.reader_gone,
            ..Batch::default()
        };
        let mut bytes = 0;
        batch.messages.extend(state.control.drain(..));
        if let Some(close) = state.close {
            batch.close = Some(close);
            return batch;
        }
        while batch.messages.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            let Some(item) = state.data.pop_front() else {
                break;
            };
            let len = len_of(&item.message);
            bytes += len;
            if item.kind == Kind::Counted {
                state.in_flight.push(item.key);
            }
            if let Some(queued) = state.calls.get_mut(&item.key) {
                if item.kind == Kind::Audio {
                    queued.audio_bytes -= samples_of_message(&item.message);
                } else {
                    queued.frames -= 1;
                }
                if queued.frames == 0 && queued.audio_bytes == 0 {
                    state.calls.remove(&item.key);
                }
            }
            batch.messages.push(item.message);
        }
        batch
    }

    /// Waits until something may be taken.
    pub(super) async fn ready(&self) {
        loop {
            let notified = self.wake.notified();
            {
                let state = self.state();
                if !state.control.is_empty()
                    || !state.data.is_empty()
                    || state.close.is_some()
                    || state.reader_gone
                    || state.aborted
                {
                    return;
                }
            }
            notified.await;
        }
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Outbox")
            .field("control", &state.control.len())
            .field("data", &state.data.len())
            .finish()
    }
}

/// The bytes of samples in an audio message (the stream number aside).
fn samples_of(message: &[u8]) -> usize {
    message
        .len()
        .saturating_sub(voicehost_proto::wire::AUDIO_HEADER)
}

fn samples_of_message(message: &Message) -> usize {
    match message {
        Message::Binary(data) => samples_of(data),
        _ => 0,
    }
}

fn len_of(message: &Message) -> usize {
    match message {
        Message::Binary(data) => data.len(),
        Message::Text(text) => text.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(batch: &Batch) -> Vec<String> {
        batch
            .messages
            .iter()
            .map(|m| match m {
                Message::Text(t) => t.to_string(),
                Message::Binary(b) => format!("audio {}", b.len()),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_pong_is_written_before_audio_and_frames_queued_ahead_of_it() {
        let outbox = Outbox::default();
        for _ in 0..10 {
            outbox.audio(CallKey(1), Bytes::from(vec![0; 642]), 1 << 20);
        }
        outbox.frame(CallKey(2), "say".into(), true);
        outbox.pong("pong".into());
        let batch = outbox.take();
        let texts = texts(&batch);
        assert_eq!(texts[0], "pong");
        assert_eq!(texts.len(), 12);
        assert_eq!(texts[11], "say", "data stays in order behind the pong");
    }

    #[test]
    fn a_calls_audio_backlog_drops_the_oldest_and_counts_it() {
        let outbox = Outbox::default();
        let mut dropped = 0;
        for n in 0..100u8 {
            dropped += outbox.audio(CallKey(1), Bytes::from(vec![n; 642]), 640 * 50);
        }
        assert_eq!(dropped, 50);
        let batch = outbox.take();
        let first = match &batch.messages[0] {
            Message::Binary(b) => b[0],
            _ => panic!(),
        };
        assert_eq!(first, 50, "the newest 50 stay");
        assert_eq!(batch.messages.len(), 50);
    }

    #[test]
    fn oversized_audio_is_cut_into_messages_that_all_fit_the_backlog() {
        // One second at 16 kHz, as five messages of 200 ms: the backlog of one second holds them all.
        let outbox = Outbox::default();
        let dropped: usize = (0..5)
            .map(|_| outbox.audio(CallKey(1), Bytes::from(vec![0; 2 + 6400]), 32_000))
            .sum();
        assert_eq!(dropped, 0);
        assert_eq!(outbox.take().messages.len(), 5);
    }

    #[test]
    fn a_retracted_call_leaves_nothing_and_neighbours_keep_theirs() {
        let outbox = Outbox::default();
        outbox.frame(CallKey(1), "a".into(), true);
        outbox.audio(CallKey(1), Bytes::from_static(&[0, 1, 2, 3]), 100);
        outbox.frame(CallKey(2), "b".into(), true);
        outbox.retract(CallKey(1));
        assert_eq!(texts(&outbox.take()), ["b"]);
        assert_eq!(
            outbox.frames_written(CallKey(2)),
            0,
            "taken is not written yet"
        );
        outbox.flushed();
        assert_eq!(outbox.frames_written(CallKey(2)), 1, "flushed is");
        assert_eq!(outbox.frames_written(CallKey(1)), 0);
    }

    #[test]
    fn the_writers_progress_and_counts_are_what_it_flushed() {
        let outbox = Outbox::default();
        let start = Instant::now();
        assert!(outbox.activity(start).written >= start, "idle: up to date");
        outbox.frame(CallKey(1), "a".into(), true);
        outbox.frame(CallKey(1), "resume".into(), false);
        let queued = outbox.activity(Instant::now()).written;
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            outbox.activity(Instant::now()).written,
            queued,
            "waiting: no progress"
        );
        outbox.take();
        outbox.flushed();
        assert_eq!(
            outbox.frames_written(CallKey(1)),
            1,
            "the uncounted one aside"
        );
        assert!(outbox.activity(Instant::now()).written > queued);
    }

    #[test]
    fn pongs_are_bounded_to_the_newest() {
        let outbox = Outbox::default();
        for n in 0..20 {
            outbox.pong(format!("{n}"));
        }
        let texts = texts(&outbox.take());
        assert_eq!(texts.len(), MAX_PONGS);
        assert_eq!(texts.last().map(String::as_str), Some("19"));
    }

    #[test]
    fn the_close_goes_after_the_pongs_and_nothing_follows_it() {
        let outbox = Outbox::default();
        outbox.frame(CallKey(1), "a".into(), true);
        outbox.pong("p".into());
        outbox.close();
        outbox.frame(CallKey(1), "late".into(), true);
        let batch = outbox.take();
        assert_eq!(texts(&batch), ["p"]);
        assert!(batch.close.is_some());
    }
}
