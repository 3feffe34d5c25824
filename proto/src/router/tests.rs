//! The router's rules, one per test, without a socket: connection events and frames in, outputs checked.

use super::*;
use sentdm_voice_agents::frames::{
    ConnectionDraining, ErrorInfo, SessionEnd, SessionResumedAudio, UserSaid,
};

struct Test {
    router: Router,
    now: Instant,
}

fn ready(max_sessions: i64) -> ConnectionReady {
    ConnectionReady {
        protocol_version: "0.2.0".into(),
        heartbeat_interval_ms: 1000,
        max_sessions,
    }
}

fn start(id: &str, stream: Option<i64>) -> Frame {
    let token = format!("vsr_{id}0123456789abcdefghijklmnop");
    Frame::SessionStart(call::fixtures::session_start(id, stream, Some(token), 5000))
}

/// Sent refusing a resume of `id` because the connection is full.
fn full(id: &str) -> Frame {
    Frame::ErrorFrame(ErrorFrame {
        error: ErrorInfo {
            code: "connection_full".into(),
            message: "full".into(),
        },
        session_id: Some(id.into()),
        frame_type: Some("session.resume".into()),
    })
}

fn end(id: &str) -> Frame {
    Frame::SessionEnd(SessionEnd {
        session_id: id.into(),
        reason: "caller_hung_up".into(),
        duration_ms: 1,
    })
}

fn resumed(id: &str, stream: Option<i64>) -> Frame {
    Frame::SessionResumed(SessionResumed {
        session_id: id.into(),
        received: 0,
        resume: None,
        audio: stream.map(|stream| SessionResumedAudio { stream }),
    })
}

fn said(id: &str, text: &str) -> Frame {
    Frame::UserSaid(UserSaid {
        session_id: id.into(),
        text: text.into(),
        correction: false,
    })
}

impl Test {
    fn new(connections: usize) -> Test {
        let now = Instant::now();
        let config = RouterConfig {
            connections,
            limits: CallLimits::default(),
            policy: FailurePolicy::HangUp,
        };
        let mut router = Router::new(config, 7, now);
        router.start(now);
        Test { router, now }
    }

    /// The dials asked for, by connection, with their delays.
    fn dials(&mut self) -> Vec<(ConnId, Duration)> {
        self.outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Dial { conn, delay } => Some((conn, delay)),
                _ => None,
            })
            .collect()
    }

    fn outputs(&mut self) -> Vec<Output> {
        std::iter::from_fn(|| self.router.poll_output()).collect()
    }

    /// The frames written, as (connection, type, session).
    fn written(&mut self) -> Vec<(ConnId, String, String)> {
        self.outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Call(call::Output::Frame { conn, text, .. }) => {
                    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
                    Some((
                        conn,
                        json["type"].as_str().unwrap().to_string(),
                        json["session_id"].as_str().unwrap_or_default().to_string(),
                    ))
                }
                _ => None,
            })
            .collect()
    }

    fn open(&mut self, conn: ConnId) {
        self.router.handle_opened(self.now, conn, &ready(10));
    }

    fn frame(&mut self, conn: ConnId, frame: Frame) {
        self.router.handle_frame(self.now, conn, frame);
    }

    /// Time passes on healthy connections: Sent heard and reading on each, as the shell reports.
    fn later(&mut self, by: Duration) {
        self.now += by;
        for conn in 1..=32 {
            let activity = Activity {
                heard: self.now,
                written: self.now,
            };
            self.router.handle_activity(self.now, conn, activity);
        }
        self.router.handle_timeout(self.now);
    }

    fn events(&mut self, id: &str) -> Vec<GuestEvent> {
        let key = self.router.call(id).map(Call::key).unwrap();
        std::iter::from_fn(|| self.router.poll_event(key)).collect()
    }

    fn place(&self, id: &str) -> Place {
        self.router.call(id).unwrap().place()
    }
}

#[test]
fn the_connections_asked_for_are_dialled_at_once() {
    let mut t = Test::new(2);
    assert_eq!(t.dials(), [(1, Duration::ZERO), (2, Duration::ZERO)]);
}

#[test]
fn a_session_start_right_after_ready_reaches_a_new_call() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    let outputs = t.outputs();
    assert!(matches!(&outputs[0], Output::Spawn { start, .. } if start.session_id == "vs_a"));
    assert_eq!(t.events("vs_a"), [GuestEvent::Start]);
}

#[test]
fn duplicate_session_start_ignored() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.frame(1, start("vs_a", None));
    let spawns = t
        .outputs()
        .into_iter()
        .filter(|o| matches!(o, Output::Spawn { .. }))
        .count();
    assert_eq!(spawns, 1);
    assert_eq!(t.router.calls(), 1);
    assert_eq!(t.router.stats().frames_invalid, 1);
}

#[test]
fn a_session_start_for_a_call_that_finished_is_a_duplicate_too() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.frame(1, end("vs_a"));
    t.events("vs_a");
    assert_eq!(t.router.calls(), 0);
    t.frame(1, start("vs_a", None));
    assert_eq!(t.router.calls(), 0, "not a new call");
    // Remembered for a while only.
    t.later(RECENT_FOR + Duration::from_secs(1));
    t.frame(1, start("vs_b", None));
    t.frame(1, start("vs_a", None));
    assert_eq!(t.router.calls(), 2);
}

#[test]
fn a_start_on_a_taken_stream_is_hung_up() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", Some(1)));
    t.outputs();
    t.frame(1, start("vs_b", Some(1)));
    assert!(t.router.call("vs_b").is_none(), "never served");
    assert_eq!(t.written(), [(1, "tool.call".into(), "vs_b".into())]);
    assert!(t.router.call("vs_a").is_some(), "the stream's call goes on");
    // Remembered: Sent starting it again is a duplicate.
    t.frame(1, start("vs_b", None));
    assert!(t.router.call("vs_b").is_none());
}

/// Found by the one model of Sent (its rule: a `call_ref` is unique within a session): Sent resuming twice
/// a session no call serves got two hangups, both `t1`.
#[test]
fn each_hangup_of_a_session_nobody_serves_has_a_call_ref_of_its_own() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, resumed("vs_ghost", None));
    t.frame(1, resumed("vs_ghost", None));
    let refs: Vec<String> = t
        .outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Call(call::Output::Frame { text, .. }) => {
                let json: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(json["name"], "hangup");
                Some(json["call_ref"].as_str().unwrap().to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(refs, ["t1", "t2"]);
}

#[test]
fn a_start_past_the_calls_held_is_hung_up() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    for n in 0..MAX_CALLS {
        t.frame(1, start(&format!("vs_{n}"), None));
        if n % 1024 == 0 {
            t.outputs();
        }
    }
    t.outputs();
    assert_eq!(t.router.calls(), MAX_CALLS);
    t.frame(1, start("vs_over", None));
    assert_eq!(t.router.calls(), MAX_CALLS, "never served");
    assert_eq!(t.written(), [(1, "tool.call".into(), "vs_over".into())]);
    // Room again once a call ends.
    t.frame(1, end("vs_0"));
    t.events("vs_0");
    t.frame(1, start("vs_next", None));
    assert!(t.router.call("vs_next").is_some());
}

#[test]
fn close_right_after_ready_keeps_dialling() {
    let mut t = Test::new(1);
    let mut delays = Vec::new();
    for conn in 1..=8 {
        let dials = t.dials();
        assert_eq!(dials.len(), 1, "one connection is always being dialled");
        assert_eq!(dials[0].0, conn);
        delays.push(dials[0].1.as_secs_f64());
        t.open(conn);
        t.router.handle_closed(t.now, conn);
    }
    // 0, then about 1, 2, 4, 8, 16, 30, 30 s: never 0 again without a ping.
    assert_eq!(delays[0], 0.0);
    for (attempt, delay) in delays.iter().enumerate().skip(1) {
        let scheduled = backoff::scheduled(attempt as u32).as_secs_f64();
        assert!(
            *delay >= scheduled * 0.75 && *delay <= scheduled * 1.25,
            "attempt {attempt}: {delay} s"
        );
    }
}

#[test]
fn flapping_connection_backs_off() {
    // Two connections; the first is healthy (pinged), the second keeps closing right after ready.
    let mut t = Test::new(2);
    t.dials();
    t.open(1);
    t.router.handle_ping(t.now, 1, 1);
    t.open(2);
    t.router.handle_closed(t.now, 2);
    let first = t.dials()[0].1;
    t.open(3);
    t.router.handle_ping(t.now, 1, 2);
    t.router.handle_closed(t.now, 3);
    let second = t.dials()[0].1;
    assert!(first >= Duration::from_millis(750), "{first:?}");
    assert!(
        second >= Duration::from_millis(1500),
        "{second:?}: the healthy one's pings do not reset it"
    );
    // A ping on the flapping one's replacement starts its backoff over: at once, but for the spread.
    t.open(4);
    t.router.handle_ping(t.now, 4, 3);
    t.router.handle_closed(t.now, 4);
    assert!(t.dials()[0].1 <= backoff::FIRST_SPREAD);
}

#[test]
fn drain_moves_sessions() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.outputs();
    t.frame(1, Frame::ConnectionDraining(ConnectionDraining {}));
    assert_eq!(t.dials(), [(2, Duration::ZERO)], "a new connection at once");
    assert_eq!(
        t.place("vs_a"),
        Place::Live {
            conn: 1,
            stream: None
        }
    );
    t.open(2);
    assert_eq!(t.written(), [(2, "session.resume".into(), "vs_a".into())]);
    // Frames for it still arriving on the old connection are not read: Sent replays them.
    t.frame(1, said("vs_a", "late"));
    assert_eq!(t.router.call("vs_a").unwrap().counts().0, 0);
    // Until Sent reads the resume, it carries the call on the drained connection.
    assert_eq!(
        t.place("vs_a"),
        Place::Moving {
            conn: 2,
            attached: Some(1)
        }
    );
    // A drained connection is not replaced when it closes.
    t.router.handle_closed(t.now, 1);
    assert!(t.dials().is_empty());
    assert_eq!(
        t.place("vs_a"),
        Place::Moving {
            conn: 2,
            attached: None
        }
    );
}

#[test]
fn a_lost_connections_calls_go_to_another_open_one_at_once() {
    let mut t = Test::new(2);
    t.dials();
    t.open(1);
    t.open(2);
    t.frame(1, start("vs_a", None));
    t.outputs();
    t.router.handle_closed(t.now, 1);
    let written = t.written();
    assert_eq!(written, [(2, "session.resume".into(), "vs_a".into())]);
}

#[test]
fn connection_full_resumes_elsewhere() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", Some(1)));
    t.router.handle_closed(t.now, 1);
    t.dials();
    t.open(2);
    t.outputs();
    t.frame(2, full("vs_a"));
    assert_eq!(t.place("vs_a"), Place::Detached { attached: None });
    let dials = t.dials();
    assert_eq!(dials, [(3, Duration::ZERO)], "an extra connection for it");
    t.open(3);
    assert_eq!(t.written(), [(3, "session.resume".into(), "vs_a".into())]);
    t.frame(3, resumed("vs_a", Some(1)));
    assert_eq!(
        t.place("vs_a"),
        Place::Live {
            conn: 3,
            stream: Some(1)
        }
    );
}

#[test]
fn extra_connections_retired() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.router.handle_closed(t.now, 1);
    t.dials();
    t.open(2);
    t.outputs();
    t.frame(2, full("vs_a"));
    t.dials();
    t.open(3);
    t.outputs();
    t.frame(3, resumed("vs_a", None));
    t.frame(3, end("vs_a"));
    t.outputs();
    t.later(IDLE_RETIRE / 2);
    assert!(t
        .outputs()
        .iter()
        .all(|o| !matches!(o, Output::Close { .. })));
    t.later(IDLE_RETIRE);
    assert_eq!(
        t.outputs(),
        [Output::Close {
            conn: 3,
            why: Closing::Unneeded
        }],
        "the extra one, idle"
    );
    assert_eq!(t.router.ready_connections(), 1);
    // Its end does not bring a replacement.
    t.router.handle_closed(t.now, 3);
    assert!(t.dials().is_empty());
}

#[test]
fn nothing_but_its_liveness_is_due_for_a_connection_asked_for_however_long_it_is_empty() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.later(IDLE_RETIRE * 3);
    // The one thing due: to look whether Sent is still there, three heartbeat intervals on.
    assert_eq!(
        t.router.poll_timeout(),
        Some(t.now + Duration::from_secs(3)),
        "the router task would wake for nothing"
    );
    assert!(t.outputs().is_empty());
}

#[test]
fn silent_sent_reconnects() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.outputs();
    // Heard up to now, then nothing: dead three intervals on, closed as silent; the call resumes
    // elsewhere.
    let heard = t.now;
    t.now += Duration::from_millis(2999);
    let report = Activity {
        heard,
        written: t.now,
    };
    t.router.handle_activity(t.now, 1, report);
    t.router.handle_timeout(t.now);
    assert!(t.outputs().is_empty(), "not yet");
    t.now += Duration::from_millis(1);
    t.router.handle_activity(t.now, 1, report);
    t.router.handle_timeout(t.now);
    let outputs = t.outputs();
    assert_eq!(
        outputs[0],
        Output::Close {
            conn: 1,
            why: Closing::Silent
        }
    );
    assert!(
        matches!(outputs[1], Output::Dial { conn: 2, .. }),
        "replaced at once: {outputs:?}"
    );
}

#[test]
fn a_connection_whose_writer_makes_no_progress_is_dropped_as_stalled() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    let stuck = t.now;
    t.now += Duration::from_secs(3);
    let report = Activity {
        heard: t.now,
        written: stuck,
    };
    t.router.handle_activity(t.now, 1, report);
    t.router.handle_timeout(t.now);
    assert_eq!(
        t.outputs()[0],
        Output::Close {
            conn: 1,
            why: Closing::Stalled
        }
    );
}

#[test]
fn a_reader_busy_handing_frames_over_is_not_silence() {
    // The shell reports `heard` as now while its reader waits to hand a frame to the router: a router
    // that fell behind does not take Sent for silent.
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.later(Duration::from_secs(10));
    assert!(t.outputs().is_empty());
}

#[test]
fn audio_is_routed_by_stream_on_its_connection_only() {
    let mut t = Test::new(2);
    t.dials();
    t.open(1);
    t.open(2);
    t.frame(1, start("vs_a", Some(1)));
    t.frame(2, start("vs_b", Some(1)));
    t.router
        .handle_audio(t.now, 2, 1, Bytes::from_static(&[1, 0]));
    t.router
        .handle_audio(t.now, 1, 9, Bytes::from_static(&[2, 0]));
    assert_eq!(t.events("vs_a"), [GuestEvent::Start]);
    assert_eq!(
        t.events("vs_b"),
        [
            GuestEvent::Start,
            GuestEvent::Audio(Bytes::from_static(&[1, 0]))
        ]
    );
}

#[test]
fn a_ping_is_answered_with_its_ts() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.router.handle_ping(t.now, 1, 42);
    assert_eq!(
        t.outputs(),
        [Output::Pong {
            conn: 1,
            text: r#"{"type":"pong","ts":42}"#.into()
        }]
    );
}

#[test]
fn a_finished_call_is_forgotten_once_its_guest_heard_the_end() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.frame(1, end("vs_a"));
    assert_eq!(t.router.calls(), 1);
    let events = t.events("vs_a");
    assert!(matches!(events.last(), Some(GuestEvent::End { .. })));
    assert_eq!(t.router.calls(), 0);
    assert!(t.router.call("vs_a").is_none());
}

#[test]
fn stop_closes_every_connection_and_loses_every_call() {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t.frame(1, start("vs_a", None));
    t.outputs();
    t.router.stop(t.now);
    let outputs = t.outputs();
    assert!(outputs.contains(&Output::Close {
        conn: 1,
        why: Closing::Unneeded
    }));
    assert_eq!(t.events("vs_a"), [GuestEvent::Start, GuestEvent::Lost]);
    assert_eq!(t.router.stats().connections_open, 0);
    t.router.handle_closed(t.now, 1);
    assert!(t.dials().is_empty(), "a stopped router dials nothing");
}

#[test]
fn a_connection_full_refusal_is_believed_for_a_while_only() {
    // Sent refused a resume as full on a connection that, to the router, carries nothing: the flag does
    // not stick there, and the call is carried to it again once it has expired.
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    let long_window = call::fixtures::session_start(
        "vs_a",
        None,
        Some("vsr_a0123456789abcdefghijklmnop".into()),
        60_000,
    );
    t.frame(1, Frame::SessionStart(long_window));
    t.outputs();
    t.router.handle_closed(t.now, 1);
    t.dials();
    t.open(2);
    assert_eq!(t.written(), [(2, "session.resume".into(), "vs_a".into())]);
    t.frame(
        2,
        Frame::ErrorFrame(ErrorFrame {
            error: ErrorInfo {
                code: "connection_full".into(),
                message: "full".into(),
            },
            session_id: Some("vs_a".into()),
            frame_type: Some("session.resume".into()),
        }),
    );
    assert!(
        t.written().is_empty(),
        "not again on the connection that said it is full"
    );
    t.later(FULL_FOR / 2);
    assert!(t.written().is_empty());
    t.later(FULL_FOR);
    assert_eq!(t.written(), [(2, "session.resume".into(), "vs_a".into())]);
}

// ----- calls moving between hosts -----

/// The guest of `id` says `text` on router `t`.
fn guest_says(t: &mut Test, id: &str, text: &str) {
    let key = t.router.call(id).map(Call::key).unwrap();
    let frame = Frame::AgentSay(sentdm_voice_agents::frames::AgentSay {
        session_id: id.into(),
        text: text.into(),
        interruptible: None,
        last: None,
    });
    let encoded = wire::frames::encode_to_string(&frame).unwrap();
    let now = t.now;
    t.router.handle_send(now, key, &frame, encoded).unwrap();
}

/// A second host's router, with connection 1 open.
fn other_host() -> Test {
    let mut t = Test::new(1);
    t.dials();
    t.open(1);
    t
}

#[test]
fn a_call_handed_over_resumes_on_the_next_host_and_replays_what_sent_did_not_read() {
    let mut a = other_host();
    a.frame(1, start("vs_a", None));
    assert_eq!(a.events("vs_a"), [GuestEvent::Start]);
    for text in ["one", "two", "three"] {
        guest_says(&mut a, "vs_a", text);
    }
    a.frame(1, said("vs_a", "not yet heard by the guest"));
    a.outputs();
    let key = a.router.call("vs_a").unwrap().key();
    let handover = a.router.hand_over(a.now, key).unwrap();
    assert_eq!(handover.counts(), (1, 3));
    assert!(a
        .outputs()
        .contains(&Output::Call(call::Output::Retract { conn: 1, key })));
    assert!(
        a.router.call("vs_a").is_none(),
        "forgotten by the host it left"
    );
    // Sent's frames for it on the old host reach nobody there.
    a.frame(1, said("vs_a", "for the next host"));
    assert_eq!(a.router.calls(), 0);
    assert_eq!(a.router.stats().handed_over, 1);

    // The handover crosses hosts as data.
    let json = serde_json::to_string(&handover).unwrap();
    let handover: Handover = serde_json::from_str(&json).unwrap();
    let mut b = other_host();
    b.router.adopt(b.now, handover).unwrap();
    let resume = b.outputs();
    let resume: Vec<_> = resume
        .iter()
        .filter_map(|o| match o {
            Output::Call(call::Output::Frame { conn, text, .. }) => Some((*conn, text.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(resume.len(), 1, "{resume:?}");
    assert_eq!(resume[0].0, 1);
    assert!(
        resume[0].1.contains(r#""type":"session.resume""#)
            && resume[0].1.contains(r#""received":1"#)
    );
    assert!(matches!(b.place("vs_a"), Place::Moving { conn: 1, .. }));

    // Sent read "one" of the three: "two" and "three" go again, once.
    let mut resumed = resumed("vs_a", None);
    if let Frame::SessionResumed(r) = &mut resumed {
        r.received = 1;
        r.resume = Some(sentdm_voice_agents::frames::Resume {
            token: "vsr_next0123456789abcdefghijklmnop".into(),
            window_ms: 5000,
        });
    }
    b.frame(1, resumed);
    let replay: Vec<String> = b
        .outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Call(call::Output::Frame { text, .. }) => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(replay.len(), 2, "{replay:?}");
    assert!(replay[0].contains("two") && replay[1].contains("three"));
    assert!(matches!(b.place("vs_a"), Place::Live { conn: 1, .. }));
    b.frame(1, said("vs_a", "for the next host"));
    assert_eq!(
        b.events("vs_a"),
        [
            GuestEvent::Moved,
            GuestEvent::UserSaid {
                text: "not yet heard by the guest".into(),
                correction: false
            },
            GuestEvent::UserSaid {
                text: "for the next host".into(),
                correction: false
            },
        ]
    );
    assert_eq!(b.router.stats().adopted, 1);
}

#[test]
fn a_call_handed_over_before_its_guest_started_starts_on_the_next_host() {
    let mut a = other_host();
    a.frame(1, start("vs_a", None));
    let key = a.router.call("vs_a").unwrap().key();
    let handover = a.router.hand_over(a.now, key).unwrap();
    let mut b = other_host();
    b.router.adopt(b.now, handover).unwrap();
    assert_eq!(b.events("vs_a"), [GuestEvent::Start]);
}

#[test]
fn a_call_without_a_token_or_ending_stays_where_it_is() {
    let mut a = other_host();
    a.frame(
        1,
        Frame::SessionStart(call::fixtures::session_start("vs_a", None, None, 0)),
    );
    let key = a.router.call("vs_a").unwrap().key();
    assert_eq!(a.router.hand_over(a.now, key), Err(Unmovable::NoToken));
    a.frame(1, start("vs_b", None));
    a.frame(1, end("vs_b"));
    let key = a.router.call("vs_b").unwrap().key();
    assert!(
        a.router.hand_over(a.now, key).is_err(),
        "its end waits for the guest"
    );
    assert!(a.router.call("vs_b").is_some());
}

#[test]
fn a_call_handed_over_and_adopted_back_is_served_again() {
    let mut a = other_host();
    a.frame(1, start("vs_a", None));
    let key = a.router.call("vs_a").unwrap().key();
    let handover = a.router.hand_over(a.now, key).unwrap();
    let again = a.router.adopt(a.now, handover.clone()).unwrap();
    assert_ne!(again, key);
    assert_eq!(a.router.adopt(a.now, handover), Err(Unadoptable::Duplicate));
}

#[test]
fn a_handover_holding_more_than_a_call_may_is_refused() {
    let mut a = other_host();
    a.frame(1, start("vs_a", None));
    let key = a.router.call("vs_a").unwrap().key();
    let handover = a.router.hand_over(a.now, key).unwrap();
    let mut json: serde_json::Value = serde_json::to_value(&handover).unwrap();
    json["kept"] = serde_json::Value::Array(vec![
        serde_json::json!(["{}", null]);
        wire::RETAINED_FRAMES + 1
    ]);
    let tampered: Handover = serde_json::from_value(json).unwrap();
    let mut b = other_host();
    assert_eq!(b.router.adopt(b.now, tampered), Err(Unadoptable::Invalid));
    assert_eq!(b.router.calls(), 0);
}

#[test]
fn a_handover_whose_kept_frames_are_not_the_calls_own_is_refused() {
    let mut a = other_host();
    a.frame(1, start("vs_a", None));
    guest_says(&mut a, "vs_a", "one");
    let key = a.router.call("vs_a").unwrap().key();
    let handover = a.router.hand_over(a.now, key).unwrap();
    let json = serde_json::to_value(&handover).unwrap();
    let forged = [
        // Another session's frame.
        serde_json::json!([
            r#"{"type":"agent.say","session_id":"vs_b","text":"hi"}"#,
            null
        ]),
        // A transfer the call never issued.
        serde_json::json!([
            r#"{"type":"tool.call","session_id":"vs_a","call_ref":"t9","name":"transfer"}"#,
            9
        ]),
        // Not a frame.
        serde_json::json!(["not json", null]),
    ];
    let mut b = other_host();
    for kept in forged {
        let mut tampered = json.clone();
        tampered["kept"] = serde_json::Value::Array(vec![kept]);
        let tampered: Handover = serde_json::from_value(tampered).unwrap();
        assert_eq!(b.router.adopt(b.now, tampered), Err(Unadoptable::Invalid));
    }
    let mut huge = json.clone();
    huge["before"] = serde_json::json!(u64::MAX);
    let huge: Handover = serde_json::from_value(huge).unwrap();
    assert_eq!(b.router.adopt(b.now, huge), Err(Unadoptable::Invalid));
    assert_eq!(b.router.calls(), 0);
    // The call's own frames are taken.
    b.router.adopt(b.now, handover).unwrap();
}

#[test]
fn a_connection_a_call_was_handed_over_from_is_not_retired_under_it() {
    // A drained connection (Sent keeps it open), empty once its call is handed over.
    let mut a = other_host();
    a.frame(1, Frame::ConnectionDraining(ConnectionDraining {}));
    a.frame(1, start("vs_a", None));
    let key = a.router.call("vs_a").unwrap().key();
    a.router.hand_over(a.now, key).unwrap();
    a.outputs();
    a.later(IDLE_RETIRE + Duration::from_secs(1));
    let closed = |t: &mut Test| {
        t.outputs()
            .into_iter()
            .any(|o| matches!(o, Output::Close { conn: 1, .. }))
    };
    assert!(
        !closed(&mut a),
        "held while Sent may still carry the call there"
    );
    a.later(HANDED_OVER_HOLD);
    assert!(closed(&mut a), "retired once the hold is over");
}
