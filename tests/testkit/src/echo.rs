//! Echo timing from Sent's side, for the neighbour bench and the fairness test: paced audio frames, a
//! `prober` call told what to do on every frame, and each echo's latency as the simulator's recorder saw it.

use sentsim::{Call, ConnHandle, Dir, Recorder, SessionSpec, What};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// 20 ms of 16 kHz samples, different for every `number`.
pub fn audio_frame(number: usize) -> Vec<u8> {
    (0..320)
        .flat_map(|i| ((number * 400 + i) as i16).to_le_bytes())
        .collect()
}

/// An audio call (16 kHz, resumable) on `conn` whose `prober` guest runs `command` on every caller frame
/// (its context's `prober`); its audio is counted, not recorded.
pub fn prober_call(conn: &ConnHandle, command: &str) -> Call {
    let mut context = serde_json::Map::new();
    context.insert("prober".into(), command.into());
    let call = conn.start(SessionSpec {
        context: Some(context),
        ..SessionSpec::audio(16_000)
    });
    call.count_audio_only();
    call
}

/// The latency of each echo of `session`'s audio since record `from`, in the order they came back: from
/// a frame queued for the socket to the same samples read back.
pub fn echo_latencies(recorder: &Recorder, from: usize, session: &str) -> Vec<Duration> {
    let records = recorder.since(from, |r| {
        r.session.as_deref() == Some(session) && matches!(r.what, What::Audio { .. })
    });
    let mut queued: HashMap<Vec<u8>, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    for record in &records {
        let What::Audio { samples, .. } = &record.what else {
            continue;
        };
        match record.dir {
            Dir::ToAgent => {
                queued.insert(samples.clone(), record.at);
            }
            Dir::FromAgent => {
                if let Some(at) = queued.remove(samples) {
                    latencies.push(record.at.duration_since(at));
                }
            }
        }
    }
    latencies
}

/// Sends `frames` caller frames 20 ms apart (numbered from 0, [`audio_frame`]) on `call`, and the same on
/// each of `beside`, as a phone line does.
pub async fn paced_frames(call: &Call, beside: &[Call], frames: usize) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for number in 0..frames {
        tick.tick().await;
        call.send_audio(&audio_frame(number));
        for other in beside {
            other.send_audio(&audio_frame(number));
        }
    }
}

/// The `q` quantile (0 to 1) of `sorted`, by rank; `Duration::MAX` when it is empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(Duration::MAX)
}
