//! One rule per test, on one call, without a socket: inputs in, outputs checked.

use super::*;
use sentdm_voice_agents::frames::{
    AgentSay, ErrorInfo, Resume, SessionEnd, SessionResumedAudio, ToolResult, UnknownFrame,
    UserSaid,
};

const CONN: ConnId = 1;
const OTHER: ConnId = 2;
const TOKEN: &str = "vsr_0123456789abcdefghijklmnop";

fn start(audio: Option<i64>, resumable: bool) -> SessionStart {
    fixtures::session_start("vs_1", audio, resumable.then(|| TOKEN.to_string()), 2000)
}

struct Test {
    call: Call,
    fx: Effects,
    now: Instant,
    /// The call's counted frames handed to each connection, and whether its writer writes each at once
    /// (and reports it), as a connection Sent reads does.
    handed: std::collections::HashMap<ConnId, u64>,
    writer_keeps_up: bool,
}

impl Test {
    fn text() -> Test {
        Test::with(
            start(None, true),
            CallLimits::default(),
            FailurePolicy::HangUp,
        )
    }

    fn audio() -> Test {
        Test::with(
            start(Some(1), true),
            CallLimits::default(),
            FailurePolicy::HangUp,
        )
    }

    fn with(start: SessionStart, limits: CallLimits, policy: FailurePolicy) -> Test {
        let mut fx = Effects::default();
        let mut test = Test {
            call: Call::new(CallKey(1), &start, CONN, limits, policy, &mut fx),
            fx,
            now: Instant::now(),
            handed: std::collections::HashMap::new(),
            writer_keeps_up: true,
        };
        assert_eq!(test.call.next_event(), Some(GuestEvent::Start));
        test
    }

    fn read(&mut self, frame: Frame) {
        self.call.read(frame, self.now, &mut self.fx);
    }

    fn said(&mut self, text: &str) {
        self.read(Frame::UserSaid(UserSaid {
            session_id: "vs_1".into(),
            text: text.into(),
            correction: false,
        }));
    }

    /// A say while Sent does not count as reading: refused past the bound, never waiting.
    fn say(&mut self, text: &str) -> Result<(), Refused> {
        self.say_reading(text, None).map_err(|not| match not {
            NotNow::Refused(refused) => refused,
            NotNow::Wait(_) => panic!("waits with Sent not reading"),
        })
    }

    fn say_reading(&mut self, text: &str, reading_until: Option<Instant>) -> Result<(), NotNow> {
        let frame = Frame::AgentSay(AgentSay {
            session_id: "vs_1".into(),
            text: text.into(),
            interruptible: None,
            last: None,
        });
        let encoded = frames::encode_to_string(&frame).unwrap();
        let from = self.fx.out.len();
        let result = self.call.send(&frame, encoded, reading_until, &mut self.fx);
        self.handed_from(from);
        result
    }

    /// Counts the counted frames handed since output `from`, and reports them written if the writer keeps
    /// up.
    fn handed_from(&mut self, from: usize) {
        for output in self.fx.out.iter().skip(from) {
            if let Output::Frame {
                conn,
                counted: true,
                ..
            } = output
            {
                *self.handed.entry(*conn).or_default() += 1;
            }
        }
        if self.writer_keeps_up {
            for (conn, frames) in &self.handed {
                self.call.written(*conn, *frames);
            }
        }
    }

    fn tool(&mut self, name: &str) -> Result<String, Refused> {
        let from = self.fx.out.len();
        let result = self
            .call
            .tool(name.into(), None, None, self.now, &mut self.fx)
            .map_err(|not| match not {
                NotNow::Refused(refused) => refused,
                NotNow::Wait(_) => panic!("waits with Sent not reading"),
            });
        self.handed_from(from);
        result
    }

    fn result(&mut self, call_ref: &str, ok: bool) {
        self.read(Frame::ToolResult(ToolResult {
            session_id: "vs_1".into(),
            call_ref: call_ref.into(),
            ok,
            error: (!ok).then(|| ErrorInfo {
                code: "failed".into(),
                message: "it failed".into(),
            }),
        }));
    }

    fn end(&mut self) {
        self.read(Frame::SessionEnd(SessionEnd {
            session_id: "vs_1".into(),
            reason: "caller_hung_up".into(),
            duration_ms: 10,
        }));
    }

    fn resumed(&mut self, conn: ConnId, received: i64, stream: Option<i64>) {
        let frame = SessionResumed {
            session_id: "vs_1".into(),
            received,
            resume: Some(Resume {
                token: "vsr_next0123456789abcdefghijk".into(),
                window_ms: 2000,
            }),
            audio: stream.map(|stream| SessionResumedAudio { stream }),
        };
        let from = self.fx.out.len();
        self.call
            .resumed(conn, &frame, |_| true, self.now, &mut self.fx);
        self.handed_from(from);
    }

    fn error(&mut self, conn: ConnId, code: &str, frame_type: &str) -> bool {
        let error = ErrorFrame {
            error: ErrorInfo {
                code: code.into(),
                message: "refused".into(),
            },
            session_id: Some("vs_1".into()),
            frame_type: Some(frame_type.into()),
        };
        self.call.refused(conn, &error, self.now, &mut self.fx)
    }

    fn move_to(&mut self, conn: ConnId) -> bool {
        self.call.move_to(conn, self.now, &mut self.fx)
    }

    /// The guest's first tool call, `t1`, unanswered past the tool timeout.
    fn first_tool_times_out(&mut self) {
        self.tool("lookup").unwrap();
        self.later(Duration::from_secs(31));
        assert_eq!(
            answers(&self.outputs()),
            [("t1".to_string(), Err(Refused::TimedOut))]
        );
    }

    fn later(&mut self, by: Duration) {
        self.now += by;
        self.call.timeout(self.now, &mut self.fx);
    }

    /// The frames written, as (connection, type, text or call_ref), and nothing else is kept.
    fn written(&mut self) -> Vec<(ConnId, String, String)> {
        let mut written = Vec::new();
        for output in self.fx.out.drain(..) {
            if let Output::Frame { conn, text, .. } = output {
                let json: Value = serde_json::from_str(&text).unwrap();
                let detail = json
                    .get("text")
                    .or(json.get("call_ref"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                written.push((conn, json["type"].as_str().unwrap().to_string(), detail));
            }
        }
        written
    }

    fn outputs(&mut self) -> Vec<Output> {
        self.fx.out.drain(..).collect()
    }

    fn events(&mut self) -> Vec<GuestEvent> {
        std::iter::from_fn(|| self.call.next_event()).collect()
    }
}

fn say(conn: ConnId, text: &str) -> (ConnId, String, String) {
    (conn, "agent.say".into(), text.into())
}

fn answers(outputs: &[Output]) -> Vec<(String, Result<bool, Refused>)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Answer {
                call_ref, answer, ..
            } => Some((
                call_ref.clone(),
                answer.as_ref().map(|a| a.ok).map_err(|e| *e),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn sents_counted_frames_are_counted_and_reach_the_guest_in_order() {
    let mut t = Test::text();
    t.said("one");
    t.read(Frame::Unknown(UnknownFrame {
        frame_type: "session.note".into(),
        session_id: Some("vs_1".into()),
        fields: Map::new(),
    }));
    t.said("two");
    assert_eq!(t.call.counts().0, 3);
    let events = t.events();
    assert!(matches!(&events[0], GuestEvent::UserSaid { text, .. } if text == "one"));
    assert!(
        matches!(&events[1], GuestEvent::Unknown { frame_type, .. } if frame_type == "session.note")
    );
    assert!(matches!(&events[2], GuestEvent::UserSaid { text, .. } if text == "two"));
}

#[test]
fn resume_holds_frames_and_sends_them_once_in_order_after_session_resumed() {
    let mut t = Test::text();
    t.say("before").unwrap();
    t.said("heard");
    assert_eq!(t.written(), [say(CONN, "before")]);
    assert!(t.move_to(OTHER));
    let resume = t.written();
    assert_eq!(resume[0].1, "session.resume");
    assert_eq!(resume[0].0, OTHER);
    t.say("held 1").unwrap();
    t.say("held 2").unwrap();
    assert!(t.written().is_empty(), "held, not written");
    // Sent read the first: the two held ones go out, once, in order, on the new connection.
    t.resumed(OTHER, 1, None);
    assert_eq!(t.written(), [say(OTHER, "held 1"), say(OTHER, "held 2")]);
    t.say("after").unwrap();
    assert_eq!(t.written(), [say(OTHER, "after")]);
    assert_eq!(t.call.counts(), (1, 4));
}

#[test]
fn moving_retracts_what_is_still_queued_on_the_old_connection() {
    let mut t = Test::text();
    t.move_to(OTHER);
    let outputs = t.outputs();
    assert_eq!(
        outputs[0],
        Output::Retract {
            conn: CONN,
            key: CallKey(1)
        }
    );
}

#[test]
fn replay_gap_hangs_up() {
    let mut t = Test::text();
    for n in 0..35 {
        t.say(&format!("n{n}")).unwrap();
    }
    t.written();
    t.move_to(OTHER);
    t.written();
    // Sent read 1 of 35: the agent keeps only the last 32.
    t.resumed(OTHER, 1, None);
    let written = t.written();
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0].1, "tool.call");
    assert_eq!(
        t.call.counts().1,
        2,
        "rebased on what Sent has, then the hangup"
    );
}

#[test]
fn huge_received_does_not_wrap() {
    let mut t = Test::text();
    t.say("one").unwrap();
    t.written();
    t.move_to(OTHER);
    t.resumed(OTHER, i64::MAX, None);
    assert!(
        t.written().iter().all(|w| w.1 == "session.resume"),
        "nothing sent again"
    );
    for n in 0..40 {
        t.say(&format!("n{n}")).unwrap();
    }
    assert_eq!(t.call.counts().1, 41);
    t.move_to(CONN);
    t.written();
    // A later gap still gets its hangup.
    t.resumed(CONN, 2, None);
    assert_eq!(t.written()[0].1, "tool.call");
}

#[test]
fn a_tool_is_answered_by_sents_result_and_the_guest_hears_it_too() {
    let mut t = Test::text();
    let call_ref = t.tool("lookup").unwrap();
    assert_eq!(call_ref, "t1");
    t.outputs();
    t.result("t1", true);
    assert_eq!(answers(&t.outputs()), [("t1".to_string(), Ok(true))]);
    assert!(matches!(&t.events()[..], [GuestEvent::ToolResult(a)] if a.call_ref == "t1"));
    // Answered once: a second result reaches the guest's handler only.
    t.result("t1", true);
    assert!(answers(&t.outputs()).is_empty());
}

#[test]
fn timed_out_tools_leave_nothing_behind() {
    let mut t = Test::text();
    for _ in 0..MAX_WAITING_TOOLS + 4 {
        t.tool("lookup").unwrap();
        t.later(Duration::from_secs(31));
        let answers = answers(&t.outputs());
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].1, Err(Refused::TimedOut));
    }
    assert!(t.tool("lookup").is_ok(), "no entry was left behind");
    // A late answer to a timed-out call still reaches the guest's handler, no waiting tool; once.
    let last = format!("t{}", MAX_WAITING_TOOLS + 4);
    t.result(&last, true);
    assert!(answers(&t.outputs()).is_empty());
    assert!(matches!(&t.events()[..], [GuestEvent::ToolResult(_)]));
    t.result(&last, true);
    assert!(t.events().is_empty(), "an answer again reaches nobody");
    // The late answers waited for are bounded: the oldest timed-out calls are forgotten.
    t.result("t1", true);
    assert!(t.events().is_empty());
    t.result(
        &format!("t{}", MAX_WAITING_TOOLS + 4 - MAX_LATE_ANSWERS + 1),
        true,
    );
    assert_eq!(t.events().len(), 1);
}

#[test]
fn an_answered_tool_call_answered_again_reaches_nobody() {
    let mut t = Test::text();
    t.tool("lookup").unwrap();
    t.result("t1", false);
    assert_eq!(answers(&t.outputs()).len(), 1);
    assert_eq!(t.events().len(), 1);
    for _ in 0..3 {
        t.result("t1", false);
    }
    assert!(answers(&t.outputs()).is_empty());
    assert!(t.events().is_empty());
}

#[test]
fn tool_results_count_against_the_backlog_in_bytes() {
    let limits = CallLimits {
        frame_backlog: 1000,
        frame_backlog_bytes: 4096,
        ..CallLimits::default()
    };
    let mut t = Test::with(start(None, true), limits, FailurePolicy::HangUp);
    // A busy guest: Sent's answers pile up unread, each with a long message.
    for _ in 0..3 {
        t.tool("lookup").unwrap();
        let call_ref = format!("t{}", t.call.tools_issued());
        t.read(Frame::ToolResult(ToolResult {
            session_id: "vs_1".into(),
            call_ref,
            ok: false,
            error: Some(ErrorInfo {
                code: "failed".into(),
                message: "x".repeat(2000),
            }),
        }));
    }
    assert_eq!(
        t.fx.stats.policies_applied, 1,
        "6 KB of answers past a 4 KiB backlog"
    );
}

#[test]
fn tiny_caller_audio_is_bounded_in_number() {
    let mut t = Test::audio();
    let cap = 16_000 * 2 * CallLimits::default().audio_backlog_ms as usize / 1000;
    for _ in 0..10 * cap / MIN_AUDIO_EVENT_BYTES {
        t.call.audio(Bytes::from_static(&[1, 0]), &mut t.fx);
    }
    assert!(t.events().len() <= cap / MIN_AUDIO_EVENT_BYTES);
}

#[test]
fn unknown_tool_result_ignored() {
    let mut t = Test::text();
    t.result("t9", false);
    t.result("x", false);
    // Found by the fuzzer: `t01` is not `t1`, whose caller would never hear its answer.
    t.tool("lookup").unwrap();
    t.outputs();
    t.result("t01", true);
    t.result("t+1", true);
    assert!(answers(&t.outputs()).is_empty());
    assert!(t.events().is_empty());
    t.result("t1", true);
    assert_eq!(answers(&t.outputs()), [("t1".to_string(), Ok(true))]);
    assert_eq!(t.call.counts().0, 5, "all still counted");
}

#[test]
fn refused_tool_call_answered() {
    let mut t = Test::text();
    t.say("first").unwrap();
    t.tool("lookup").unwrap();
    t.say("second").unwrap();
    t.outputs();
    assert!(!t.error(CONN, "tool_not_allowed", "tool.call"));
    let outputs = t.outputs();
    assert_eq!(answers(&outputs), [("t1".to_string(), Ok(false))]);
    assert!(
        matches!(&t.events()[..], [GuestEvent::ToolResult(a)] if a.error.as_ref().is_some_and(|e| e.0 == "tool_not_allowed"))
    );
    // Sent read the refused frame on the call's connection: it counts, and is not sent again.
    assert_eq!(t.call.counts().1, 3);
    t.move_to(OTHER);
    t.written();
    t.resumed(OTHER, 3, None);
    assert!(t.written().is_empty());
}

#[test]
fn refusal_of_a_timed_out_tool_is_its_own() {
    let mut t = Test::text();
    t.writer_keeps_up = false;
    t.first_tool_times_out();
    t.writer_keeps_up = true;
    t.tool("lookup").unwrap();
    t.written();
    // Sent read t1 (late) and refused it, then answered t2.
    t.error(CONN, "tool_not_allowed", "tool.call");
    assert!(answers(&t.outputs()).is_empty(), "t2 still waits");
    assert!(
        matches!(&t.events()[..], [GuestEvent::ToolResult(a)] if a.call_ref == "t1" && !a.ok),
        "the refusal reaches the guest as t1's late answer"
    );
    t.result("t2", true);
    assert_eq!(answers(&t.outputs()), [("t2".to_string(), Ok(true))]);
}

#[test]
fn refusal_after_a_held_tool_timed_out_is_the_new_ones() {
    let mut t = Test::text();
    // Written (the writer keeps up) before it timed out.
    t.first_tool_times_out();
    t.tool("lookup").unwrap();
    t.written();
    t.error(CONN, "tool_not_allowed", "tool.call");
    assert_eq!(answers(&t.outputs()), [("t2".to_string(), Ok(false))]);
}

#[test]
fn a_timed_out_tool_sent_again_by_a_resume_may_be_refused() {
    let mut t = Test::text();
    t.first_tool_times_out();
    // Written, but the connection dropped before Sent read it: the resume sends it again.
    t.move_to(OTHER);
    t.written();
    t.resumed(OTHER, 0, None);
    assert_eq!(
        t.written(),
        [(OTHER, "tool.call".to_string(), "t1".to_string())]
    );
    t.error(OTHER, "tool_not_allowed", "tool.call");
    assert!(
        matches!(&t.events()[..], [GuestEvent::ToolResult(a)] if a.call_ref == "t1" && !a.ok),
        "the refusal reaches the guest as t1's late answer"
    );
}

#[test]
fn a_timed_out_tool_read_before_a_resume_takes_no_later_refusal() {
    let mut t = Test::text();
    t.writer_keeps_up = false;
    t.first_tool_times_out();
    t.writer_keeps_up = true;
    // Sent read t1 on the old connection (its refusal, if any, was lost with it).
    t.move_to(OTHER);
    t.written();
    t.resumed(OTHER, 1, None);
    t.tool("lookup").unwrap();
    t.written();
    t.error(OTHER, "tool_not_allowed", "tool.call");
    assert_eq!(answers(&t.outputs()), [("t2".to_string(), Ok(false))]);
}

#[test]
fn an_error_about_another_frame_answers_no_tool() {
    let mut t = Test::text();
    t.tool("lookup").unwrap();
    t.outputs();
    t.error(CONN, "frame_not_allowed", "agent.say");
    t.error(OTHER, "tool_not_allowed", "tool.call");
    assert!(answers(&t.outputs()).is_empty());
}

#[test]
fn the_end_answers_waiting_tools_ended_drops_queued_audio_and_is_heard_last() {
    let mut t = Test::audio();
    t.call.audio(Bytes::from(vec![0u8; 640]), &mut t.fx);
    t.tool("lookup").unwrap();
    t.end();
    let outputs = t.outputs();
    assert!(outputs.contains(&Output::Retract {
        conn: CONN,
        key: CallKey(1)
    }));
    assert_eq!(answers(&outputs), [("t1".to_string(), Err(Refused::Ended))]);
    assert!(
        matches!(&t.events()[..], [GuestEvent::End { .. }]),
        "the queued audio is gone"
    );
    assert!(t.call.forgettable());
    assert_eq!(t.say("late"), Err(Refused::Ended));
    assert_eq!(t.tool("lookup"), Err(Refused::Ended));
    t.call.send_audio(&[0; 320], &mut t.fx);
    assert!(t.outputs().is_empty(), "no audio after the end");
    t.end();
    assert!(t.events().is_empty(), "the end is heard once");
}

#[test]
fn a_call_without_a_token_is_lost_with_its_connection() {
    let mut t = Test::with(
        start(None, false),
        CallLimits::default(),
        FailurePolicy::HangUp,
    );
    t.tool("lookup").unwrap();
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    assert!(t.call.finished());
    assert_eq!(
        answers(&t.outputs()),
        [("t1".to_string(), Err(Refused::Ended))]
    );
    assert_eq!(t.events(), [GuestEvent::Lost]);
    assert_eq!(t.fx.stats.sessions_lost, 1);
}

#[test]
fn unreachable_sent_loses_call_after_window() {
    let mut t = Test::text();
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    assert_eq!(t.call.place(), Place::Detached { attached: None });
    t.say("held").unwrap();
    t.later(Duration::from_millis(1999));
    assert!(!t.call.finished());
    t.later(Duration::from_millis(1));
    assert!(t.call.finished());
    assert_eq!(t.events(), [GuestEvent::Lost]);
}

#[test]
fn resume_failed_loses_session() {
    let mut t = Test::text();
    t.move_to(OTHER);
    t.error(OTHER, "resume_failed", "session.resume");
    assert!(t.call.finished());
    assert_eq!(t.events(), [GuestEvent::Lost]);
}

#[test]
fn an_unanswered_resume_is_lost_with_its_connection_or_its_deadline() {
    let mut t = Test::text();
    t.move_to(OTHER);
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    assert!(
        !t.call.finished(),
        "the old connection does not matter any more"
    );
    t.call.connection_lost(OTHER, t.now, &mut t.fx);
    assert!(t.call.finished());

    // The window is 2 s here: the host's floor of 10 s is the longer.
    let mut t = Test::text();
    t.move_to(OTHER);
    t.later(RESUME_ANSWER_TIMEOUT - Duration::from_millis(1));
    assert!(!t.call.finished());
    t.later(Duration::from_millis(1));
    assert!(t.call.finished());
}

#[test]
fn connection_full_resumes_elsewhere() {
    let mut t = Test::audio();
    t.move_to(OTHER);
    assert!(t.error(OTHER, "connection_full", "session.resume"));
    assert_eq!(
        t.call.place(),
        Place::Detached {
            attached: Some(CONN)
        }
    );
    t.call.send_audio(&[1; 320], &mut t.fx);
    t.outputs();
    assert!(t.move_to(3));
    t.resumed(3, 0, Some(4));
    assert_eq!(
        t.call.place(),
        Place::Live {
            conn: 3,
            stream: Some(4)
        }
    );
    t.call.send_audio(&[1; 320], &mut t.fx);
    let audio: Vec<_> = t
        .outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Audio { conn, message, .. } => Some((conn, message[..2].to_vec())),
            _ => None,
        })
        .collect();
    assert_eq!(
        audio,
        [(3, vec![0, 4])],
        "on the new connection, under the new stream"
    );
}

#[test]
fn resumed_without_stream_sends_no_audio() {
    let mut t = Test::audio();
    t.move_to(OTHER);
    t.resumed(OTHER, 0, None);
    t.outputs();
    t.call.send_audio(&[1; 320], &mut t.fx);
    assert!(t.outputs().is_empty());
    assert_eq!(t.fx.stats.audio_out_dropped, 1);
}

#[test]
fn oversized_audio_is_cut() {
    let mut t = Test::audio();
    // 2 s of 16 kHz: only the last second may wait for the writer, in messages of at most 200 ms.
    let samples: Vec<i16> = (0..32_000).map(|n| n as i16).collect();
    t.call.send_audio(&samples, &mut t.fx);
    let messages: Vec<Bytes> = t
        .outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Audio { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), 5);
    assert!(messages.iter().all(|m| m.len() == 2 + 6400));
    let first: Vec<u8> = samples[16_000..19_200]
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    assert_eq!(&messages[0][2..], &first[..]);
}

#[test]
fn caller_audio_backlog_bounded() {
    let mut t = Test::audio();
    for n in 0..60u8 {
        t.call.audio(Bytes::from(vec![n; 640]), &mut t.fx);
    }
    let events = t.events();
    assert_eq!(events.len(), 50, "one second of 20 ms frames");
    assert!(
        matches!(&events[0], GuestEvent::Audio(a) if a[0] == 10),
        "the oldest went first"
    );
    assert_eq!(t.fx.stats.audio_dropped, 10);
}

#[test]
fn unread_frames_refused_over_limit() {
    let mut t = Test::text();
    t.writer_keeps_up = false;
    for n in 0..RETAINED_FRAMES {
        t.say(&format!("unwritten {n}")).unwrap();
    }
    assert_eq!(t.say("x"), Err(Refused::OverLimit));
    assert_eq!(
        t.call.counts().1,
        RETAINED_FRAMES as u64,
        "a refused frame is not counted"
    );
    // The writer reports one written: room for one more.
    t.call.written(CONN, 1);
    assert!(t.say("x").is_ok());
    assert_eq!(t.say("y"), Err(Refused::OverLimit));
}

#[test]
fn speech_waits_while_sent_reads() {
    let mut t = Test::text();
    t.writer_keeps_up = false;
    for n in 0..RETAINED_FRAMES {
        t.say(&format!("unwritten {n}")).unwrap();
    }
    let until = t.now + Duration::from_secs(1);
    assert_eq!(t.say_reading("x", Some(until)), Err(NotNow::Wait(until)));
    assert_eq!(t.call.counts().1, RETAINED_FRAMES as u64, "nothing counted");
    t.call.written(CONN, 5);
    assert!(t.say_reading("x", Some(until)).is_ok());
}

#[test]
fn held_frames_never_outgrow_the_kept() {
    // Frames handed to a connection that then drops unwritten are held again: with the held ones, no
    // more than the 32 kept may wait, so every one can be replayed.
    let mut t = Test::text();
    t.writer_keeps_up = false;
    for n in 0..20 {
        t.say(&format!("queued {n}")).unwrap();
    }
    t.call.written(CONN, 5);
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    t.outputs();
    for n in 0..(RETAINED_FRAMES - 15) {
        t.say(&format!("held {n}")).unwrap();
    }
    assert_eq!(t.say("one too many"), Err(Refused::OverLimit));
    // Resumed with Sent having read the 5 written: every other frame comes again, none missing.
    t.move_to(OTHER);
    t.outputs();
    t.resumed(OTHER, 5, None);
    let replayed = t.written();
    assert_eq!(replayed.len(), RETAINED_FRAMES);
    assert_eq!(replayed[0], say(OTHER, "queued 5"));
    assert!(
        !replayed.iter().any(|(_, kind, _)| kind == "tool.call"),
        "no hangup"
    );
}

#[test]
fn flooded_call_gets_failure_policy() {
    let limits = CallLimits {
        frame_backlog: 4,
        ..CallLimits::default()
    };
    let mut t = Test::with(start(None, true), limits, FailurePolicy::HangUp);
    for n in 0..5 {
        t.said(&format!("u{n}"));
    }
    let written = t.written();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].1, "tool.call", "the failure policy's hangup");
    assert!(t.events().is_empty(), "the guest hears nothing more");
    assert_eq!(t.fx.stats.frames_dropped, 1);
    assert_eq!(t.fx.stats.policies_applied, 1);
    t.end();
    assert_eq!(
        t.events(),
        [GuestEvent::End {
            reason: "caller_hung_up".into(),
            duration_ms: 10
        }]
    );
}

#[test]
fn failed_policy_transfer_hangs_up() {
    let policy = FailurePolicy::transfer("number", "+14155550100").unwrap();
    let mut t = Test::with(start(None, true), CallLimits::default(), policy.clone());
    t.call.give_up(t.now, &mut t.fx);
    let written = t.written();
    assert_eq!(written, [(CONN, "tool.call".into(), "t1".into())]);
    t.result("t1", false);
    assert_eq!(t.written(), [(CONN, "tool.call".into(), "t2".into())]);
    t.give_up_again();

    // A transfer nobody answers is followed by a hangup too.
    let mut t = Test::with(start(None, true), CallLimits::default(), policy);
    t.call.give_up(t.now, &mut t.fx);
    t.written();
    t.later(Duration::from_secs(31));
    assert_eq!(t.written(), [(CONN, "tool.call".into(), "t2".into())]);
}

impl Test {
    fn give_up_again(&mut self) {
        self.call.give_up(self.now, &mut self.fx);
        assert!(self.written().is_empty(), "the policy runs once");
    }
}

#[test]
fn the_failure_policy_is_not_under_the_guests_cap() {
    let mut t = Test::text();
    for _ in 0..MAX_WAITING_TOOLS {
        t.tool("lookup").unwrap();
    }
    assert_eq!(t.tool("lookup"), Err(Refused::OverLimit));
    t.outputs();
    t.call.give_up(t.now, &mut t.fx);
    assert_eq!(t.written().len(), 1, "the hangup goes out");
}

#[test]
fn say_on_an_audio_call_is_the_wrong_media() {
    let mut t = Test::audio();
    assert_eq!(t.say("hi"), Err(Refused::WrongMedia));
}

#[test]
fn unsendable_policy_transfer_hangs_up() {
    // The config and the API refuse such a party; one that gets through anyway ends in a hangup.
    let policy = FailurePolicy::transfer_unchecked("conference", "room");
    let mut t = Test::with(start(None, true), CallLimits::default(), policy);
    t.call.give_up(t.now, &mut t.fx);
    let written = t.written();
    assert_eq!(written, [(CONN, "tool.call".into(), "t1".into())]);
    assert_eq!(t.call.counts().1, 1, "the hangup, and nothing else");
}

#[test]
fn a_guest_given_up_on_acts_no_more() {
    let mut t = Test::audio();
    t.call.give_up(t.now, &mut t.fx);
    t.outputs();
    assert_eq!(t.tool("transfer"), Err(Refused::Ended));
    t.call.send_audio(&[1; 320], &mut t.fx);
    assert!(t.outputs().is_empty(), "no audio after the policy's hangup");
}

#[test]
fn connection_full_does_not_restart_the_window() {
    let mut t = Test::text();
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    t.later(Duration::from_millis(1500));
    t.move_to(OTHER);
    assert!(t.error(OTHER, "connection_full", "session.resume"));
    // The window (2 s) ran from the loss: half a second more and the call is lost.
    t.later(Duration::from_millis(499));
    assert!(!t.call.finished());
    t.later(Duration::from_millis(1));
    assert!(t.call.finished());
}

#[test]
fn a_call_moving_off_a_live_connection_has_no_window_until_that_connection_goes() {
    let mut t = Test::text();
    t.move_to(OTHER);
    assert!(t.error(OTHER, "connection_full", "session.resume"));
    // Sent still carries it on its drained connection: no window runs.
    t.later(Duration::from_secs(60));
    assert!(!t.call.finished());
    t.call.connection_lost(CONN, t.now, &mut t.fx);
    t.later(Duration::from_millis(1999));
    assert!(!t.call.finished());
    t.later(Duration::from_millis(1));
    assert!(t.call.finished());
}

#[test]
fn the_session_type_decides_the_media() {
    let mut text = start(Some(3), true);
    text.session_type = "text".into();
    assert_eq!(Media::of(&text), Media::Text);
    assert_eq!(stream_of(&text), None, "a text call has no stream");
    let audio = start(Some(3), true);
    assert!(matches!(Media::of(&audio), Media::Audio { .. }));
    assert_eq!(stream_of(&audio), Some(3));
}
