//! What waits to be written on one connection, bounded: pongs (and the close) in a lane of their own that
//! never waits behind data; frames and audio in one queue, in order, each tagged with its call so that a
//! call that ended or moved can take back what is still queued; per call, at most a set amount of audio
//! (the oldest dropped and counted) and a count of frames the call's machine reads before it counts more.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use voicehost_proto::call::CallKey;

/// Pongs waiting at most: a Sent that pings faster than the socket takes them only needs the newest.
pub const MAX_PONGS: usize = 8;

/// At most this many messages, or this many bytes, are fed to the socket before a flush.
pub const MAX_BATCH: usize = 64;
pub const MAX_BATCH_BYTES: usize = 256 << 10;

struct Item {
    key: CallKey,
    message: Message,
    audio: bool,
}

#[derive(Default, Clone, Copy)]
struct Queued {
    frames: usize,
    audio_bytes: usize,
}

#[derive(Default)]
struct State {
    control: VecDeque<Message>,
    data: VecDeque<Item>,
    calls: HashMap<CallKey, Queued>,
    /// A close frame to send, and why (for the reader's log); nothing is taken after it.
    close: Option<(CloseCode, &'static str)>,
    /// The reader has stopped: the writer finishes and stops too.
    reader_gone: bool,
    /// The writer has stopped: nothing queued from now on is written.
    writer_gone: bool,
}

/// One connection's queue to its writer.
#[derive(Default)]
pub struct Outbox {
    state: Mutex<State>,
    wake: Notify,
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

    /// Queues a frame's text of `key`'s.
    pub fn frame(&self, key: CallKey, text: String) {
        let mut state = self.state();
        if state.writer_gone || state.close.is_some() {
            return;
        }
        state.calls.entry(key).or_default().frames += 1;
        state.data.push_back(Item {
            key,
            message: Message::Text(text.into()),
            audio: false,
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
        let mut dropped = 0;
        let mut queued = state.calls.get(&key).copied().unwrap_or_default();
        let samples = samples_of(&message);
        while queued.audio_bytes > 0 && queued.audio_bytes + samples > backlog {
            let Some(at) = state.data.iter().position(|i| i.key == key && i.audio) else {
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
            audio: true,
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

    /// [scenario: audio_of_an_ended_call_not_written] Takes back whatever of `key`'s is still queued.
    pub fn retract(&self, key: CallKey) {
        let mut state = self.state();
        if state.calls.remove(&key).is_some() {
            state.data.retain(|item| item.key != key);
        }
    }

    /// How many of `key`'s frames wait to be written.
    pub fn unwritten_frames(&self, key: CallKey) -> usize {
        self.state().calls.get(&key).map_or(0, |q| q.frames)
    }

    /// Closes cleanly with 1000 once the pongs before it are written (the queued data is not: the calls
    /// on the connection go to their fallback).
    pub fn close(&self) {
        self.close_with(CloseCode::Normal, "closed by the agent with 1000");
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
            if let Some(queued) = state.calls.get_mut(&item.key) {
                if item.audio {
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
        outbox.frame(CallKey(2), "say".into());
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
        outbox.frame(CallKey(1), "a".into());
        outbox.audio(CallKey(1), Bytes::from_static(&[0, 1, 2, 3]), 100);
        outbox.frame(CallKey(2), "b".into());
        assert_eq!(outbox.unwritten_frames(CallKey(1)), 1);
        outbox.retract(CallKey(1));
        assert_eq!(outbox.unwritten_frames(CallKey(1)), 0);
        assert_eq!(texts(&outbox.take()), ["b"]);
        assert_eq!(outbox.unwritten_frames(CallKey(2)), 0, "taken is written");
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
        outbox.frame(CallKey(1), "a".into());
        outbox.pong("p".into());
        outbox.close();
        outbox.frame(CallKey(1), "late".into());
        let batch = outbox.take();
        assert_eq!(texts(&batch), ["p"]);
        assert!(batch.close.is_some());
    }
}
