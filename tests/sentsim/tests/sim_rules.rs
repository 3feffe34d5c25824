//! The simulator's own rules, checked with a raw WebSocket client that plays a (sometimes misbehaving)
//! agent: what Sent refuses, how it counts, keeps and replays, and when it drops an agent.

use futures_util::{SinkExt, StreamExt};
use sentdm_voice_agents::frames::SESSION_END_REASONS;
use sentsim::sim::{CONFORMANCE_AGENT, CONFORMANCE_KEY};
use sentsim::{CloseAfterReady, ConnHandle, ConnPlan, SessionSpec, Sim, SimConfig, ToolPlan};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// An agent written by hand, frame by frame.
struct RawAgent {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Answer pings without being asked.
    pong: bool,
}

impl RawAgent {
    async fn connect(sim: &Sim) -> RawAgent {
        let url = format!("{}?agent_id={CONFORMANCE_AGENT}", sim.url());
        let mut request = url.into_client_request().unwrap();
        let headers = request.headers_mut();
        let bearer = format!("Bearer {CONFORMANCE_KEY}");
        headers.insert("Authorization", HeaderValue::from_str(&bearer).unwrap());
        headers.insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("sent.voice.v1"),
        );
        let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
        let subprotocol = response.headers().get("Sec-WebSocket-Protocol").unwrap();
        assert_eq!(subprotocol, "sent.voice.v1");
        let mut agent = RawAgent { ws, pong: true };
        let ready = agent.next().await;
        assert_eq!(ready["type"], "connection.ready", "{ready}");
        agent
    }

    async fn send(&mut self, frame: Value) {
        self.ws
            .send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
    }

    async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::Text(text.into())).await.unwrap();
    }

    /// The next text frame (pings answered and skipped while `pong` is on); audio is skipped.
    async fn next(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(5), self.ws.next())
                .await
                .expect("nothing arrived within 5 s")
                .expect("the connection closed")
                .expect("the connection failed");
            if let Message::Text(text) = message {
                let frame: Value = serde_json::from_str(&text).unwrap();
                if frame["type"] == "ping" && self.pong {
                    self.send(json!({"type": "pong", "ts": frame["ts"]})).await;
                    continue;
                }
                return frame;
            }
        }
    }

    /// The next binary message.
    async fn next_audio(&mut self) -> Vec<u8> {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(5), self.ws.next())
                .await
                .expect("nothing arrived within 5 s")
                .expect("the connection closed")
                .expect("the connection failed");
            if let Message::Binary(data) = message {
                return data.to_vec();
            }
        }
    }

    /// Waits for an `error` frame and returns it.
    async fn error(&mut self) -> Value {
        let frame = self.next().await;
        assert_eq!(frame["type"], "error", "expected an error, got {frame}");
        frame
    }
}

async fn sim() -> Sim {
    Sim::start_local(SimConfig::default()).await.unwrap()
}

async fn sim_with(config: SimConfig) -> Sim {
    Sim::start_local(config).await.unwrap()
}

/// Waits until Sent has read a frame of this type from the agent.
async fn arrived(sim: &Sim, frame_type: &str) {
    sim.recorder()
        .wait_for(
            0,
            Duration::from_secs(5),
            frame_type,
            |_| true,
            |r| r.is_frame(sentsim::Dir::FromAgent, frame_type),
        )
        .await
        .unwrap();
}

/// The connection the raw agent just opened.
async fn latest(sim: &Sim) -> ConnHandle {
    sim.connection_after(0, Duration::from_secs(5))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_frame_in_the_wrong_direction_is_refused_and_recorded_as_a_violation() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    agent.send(json!({"type": "ping", "ts": 5})).await;
    let error = agent.error().await;
    assert_eq!(error["error"]["code"], "frame_not_allowed");
    assert_eq!(error["frame_type"], "ping");
    let violations = sim.violations_since(0);
    assert_eq!(violations.len(), 1, "{violations:?}");
}

#[tokio::test]
async fn text_that_is_not_a_frame_is_refused_as_invalid() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    agent.send_text("{not json").await;
    assert_eq!(agent.error().await["error"]["code"], "invalid_frame");
    agent
        .send(json!({"type": "agent.say", "session_id": "vs_x", "text": ""}))
        .await;
    let error = agent.error().await;
    assert_eq!(error["error"]["code"], "invalid_frame");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shorter than 1"),
        "{error}"
    );
}

#[tokio::test]
async fn a_refused_frame_has_no_effect_and_is_not_counted() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_audio(16000);
    let start = agent.next().await;
    assert_eq!(start["type"], "session.start");
    // agent.say is for text sessions only.
    agent
        .send(json!({"type": "agent.say", "session_id": call.id, "text": "hi"}))
        .await;
    let error = agent.error().await;
    assert_eq!(error["error"]["code"], "frame_not_allowed");
    assert_eq!(error["session_id"], call.id.as_str());
    agent
        .send(json!({"type": "agent.clear", "session_id": call.id}))
        .await;
    arrived(&sim, "agent.clear").await;
    assert_eq!(
        call.state().unwrap().received,
        1,
        "only the agent.clear counts"
    );
}

#[tokio::test]
async fn a_frame_for_a_session_on_another_connection_is_refused() {
    let sim = sim().await;
    let mut first = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_text();
    first.next().await;
    let mut second = RawAgent::connect(&sim).await;
    second
        .send(json!({"type": "agent.say", "session_id": call.id, "text": "hi"}))
        .await;
    let error = second.error().await;
    assert_eq!(error["error"]["code"], "frame_not_allowed");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not on this connection"));
}

#[tokio::test]
async fn a_call_ref_used_twice_in_a_session_is_refused() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_text();
    agent.next().await;
    let dtmf = json!({"type": "tool.call", "session_id": call.id, "call_ref": "t1",
        "name": "send_dtmf", "arguments": {"digits": "1"}});
    agent.send(dtmf.clone()).await;
    let result = agent.next().await;
    assert_eq!(
        (result["type"].as_str(), result["ok"].as_bool()),
        (Some("tool.result"), Some(true))
    );
    agent.send(dtmf).await;
    assert_eq!(agent.error().await["error"]["code"], "frame_not_allowed");
}

#[tokio::test]
async fn pings_come_at_the_heartbeat_interval_and_an_agent_without_pongs_is_dropped() {
    let sim = sim_with(SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    })
    .await;
    let mut agent = RawAgent::connect(&sim).await;
    agent.pong = false;
    let first = agent.next().await;
    assert_eq!(first["type"], "ping");
    let second = agent.next().await;
    assert_eq!(second["type"], "ping");
    let gap = second["ts"].as_i64().unwrap() - first["ts"].as_i64().unwrap();
    assert!(gap >= 900, "pings {gap} ms apart with a 1000 ms interval");
    let how = latest(&sim)
        .await
        .closed(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(how.contains("Sent"), "{how}");
}

#[tokio::test]
async fn stream_numbers_are_unique_on_a_connection_and_audio_goes_both_ways() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let a = conn.start_audio(8000);
    let b = conn.start_audio(24000);
    let (start_a, start_b) = (agent.next().await, agent.next().await);
    let (stream_a, stream_b) = (
        start_a["audio"]["stream"].clone(),
        start_b["audio"]["stream"].clone(),
    );
    assert_ne!(stream_a, stream_b);
    assert_eq!(start_b["audio"]["sample_rate"], 24000);
    b.send_audio(&[1, 0, 2, 0]);
    let audio = agent.next_audio().await;
    assert_eq!(
        u16::from_be_bytes([audio[0], audio[1]]) as u64,
        stream_b.as_u64().unwrap()
    );
    assert_eq!(&audio[2..], &[1, 0, 2, 0]);
    let mut b_again = sim.call(&b.id);
    let mut message = (stream_b.as_u64().unwrap() as u16).to_be_bytes().to_vec();
    message.extend_from_slice(&[9, 0]);
    agent
        .ws
        .send(Message::Binary(message.into()))
        .await
        .unwrap();
    b_again.expect_audio(&[9, 0]).await.unwrap();
    assert!(a.state().unwrap().stream != b.state().unwrap().stream);
}

#[tokio::test]
async fn a_resume_replays_what_the_agent_did_not_read_and_the_token_works_once() {
    let sim = sim().await;
    let mut first = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let call = conn.start_text();
    let start = first.next().await;
    let token = start["resume"]["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("vsr_") && token.len() >= 26);
    call.say("one");
    call.say("two");
    call.say("three");
    first.next().await;
    first
        .send(json!({"type": "agent.say", "session_id": call.id, "text": "heard one"}))
        .await;
    arrived(&sim, "agent.say").await;
    conn.drop_abruptly();
    let mut second = RawAgent::connect(&sim).await;
    second
        .send(
            json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 1}),
        )
        .await;
    let resumed = second.next().await;
    assert_eq!(resumed["type"], "session.resumed");
    assert_eq!(resumed["received"], 1);
    let next_token = resumed["resume"]["token"].as_str().unwrap();
    assert_ne!(next_token, token);
    assert_eq!(second.next().await["text"], "two");
    assert_eq!(second.next().await["text"], "three");
    // The old token is used up.
    let mut third = RawAgent::connect(&sim).await;
    third
        .send(
            json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 3}),
        )
        .await;
    let error = third.error().await;
    assert_eq!(error["error"]["code"], "resume_failed");
    assert_eq!(error["frame_type"], "session.resume");
}

#[tokio::test]
async fn a_resume_onto_a_full_connection_is_refused_and_its_token_stays_good() {
    let sim = sim_with(SimConfig {
        max_sessions: 1,
        ..SimConfig::default()
    })
    .await;
    let mut first = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_text();
    let token = first.next().await["resume"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut second = RawAgent::connect(&sim).await;
    sim.conn(2).start_text();
    second.next().await;
    let resume =
        json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 0});
    second.send(resume.clone()).await;
    assert_eq!(second.error().await["error"]["code"], "connection_full");
    let mut third = RawAgent::connect(&sim).await;
    third.send(resume).await;
    assert_eq!(third.next().await["type"], "session.resumed");
}

#[tokio::test]
async fn a_resume_of_an_unknown_session_fails() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    agent
        .send(json!({"type": "session.resume", "session_id": "vs_nobody",
            "token": "vsr_0123456789abcdefghijklmnop", "received": 0}))
        .await;
    let error = agent.error().await;
    assert_eq!(error["error"]["code"], "resume_failed");
    assert_eq!(error["session_id"], "vs_nobody");
}

#[tokio::test]
async fn a_resume_past_the_32_kept_frames_fails() {
    let sim = sim().await;
    let mut first = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let call = conn.start_text();
    let token = first.next().await["resume"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    for n in 0..40 {
        call.say(&format!("utterance {n}"));
    }
    conn.drop_abruptly();
    let mut second = RawAgent::connect(&sim).await;
    second
        .send(
            json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 2}),
        )
        .await;
    assert_eq!(second.error().await["error"]["code"], "resume_failed");
    assert!(call.state().unwrap().lost);
}

#[tokio::test]
async fn every_end_reason_is_sent_as_a_valid_frame() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    for reason in SESSION_END_REASONS {
        let call = conn.start_text();
        agent.next().await;
        call.end(reason);
        let end = agent.next().await;
        assert_eq!(
            (end["type"].as_str(), end["reason"].as_str()),
            (Some("session.end"), Some(*reason))
        );
        let decoded = sentdm_voice_agents::frames::decode(&end.to_string());
        assert!(decoded.is_ok(), "{decoded:?}");
    }
}

#[tokio::test]
async fn a_clean_close_by_the_agent_sends_its_calls_to_their_fallback() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_text();
    agent.next().await;
    agent.ws.close(None).await.unwrap();
    latest(&sim)
        .await
        .closed(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        !call.state().unwrap().lost,
        "a close without 1000 is a loss to resume from"
    );
    let mut agent = RawAgent::connect(&sim).await;
    let call = sim.conn(2).start_text();
    agent.next().await;
    let normal = tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
        reason: "".into(),
    };
    agent.ws.close(Some(normal)).await.unwrap();
    sim.conn(2).closed(Duration::from_secs(5)).await.unwrap();
    assert!(call.state().unwrap().lost);
}

#[tokio::test]
async fn planned_starts_follow_connection_ready_in_one_write_and_a_close_after_ready_ends_it() {
    let sim = sim().await;
    sim.plan(ConnPlan {
        one_write: true,
        prestart: vec![SessionSpec::text(), SessionSpec::audio(16000)],
        close_after_ready: Some(CloseAfterReady::Close(1001)),
        ..ConnPlan::default()
    });
    let mut agent = RawAgent::connect(&sim).await;
    assert_eq!(agent.next().await["session_type"], "text");
    assert_eq!(agent.next().await["session_type"], "audio");
    let end = tokio::time::timeout(Duration::from_secs(5), agent.ws.next())
        .await
        .expect("the close came")
        .expect("a message");
    match end {
        Ok(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected a close with 1001, got {other:?}"),
    }
    let how = sim.conn(1).closed(Duration::from_secs(5)).await.unwrap();
    assert_eq!(how, "closed by Sent with 1001");
    // Both sessions were started on the connection, and are detached with it.
    let started = sim.conn(1).started();
    assert_eq!(started.len(), 2);
    assert!(started.iter().all(|c| c.state().unwrap().conn.is_none()));
}

#[tokio::test]
async fn a_tool_call_sent_refuses_by_plan_gets_an_error_and_counts_as_read() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let call = latest(&sim).await.start_text();
    agent.next().await;
    call.plan_tool("hangup", ToolPlan::Refuse("tool_not_allowed".into()));
    let hangup =
        json!({"type": "tool.call", "session_id": call.id, "call_ref": "t1", "name": "hangup"});
    agent.send(hangup).await;
    let error = agent.error().await;
    assert_eq!(error["error"]["code"], "tool_not_allowed");
    assert_eq!(error["session_id"], call.id.as_str());
    assert_eq!(error["frame_type"], "tool.call");
    let state = call.state().unwrap();
    // Read on the session's own connection: counted; no other effect.
    assert_eq!((state.received, state.ended), (1, None));
    assert!(sim.violations_since(0).is_empty(), "not the agent's fault");
    // The next call, allowed now, is answered.
    call.plan_tool("hangup", ToolPlan::Ok);
    let next =
        json!({"type": "tool.call", "session_id": call.id, "call_ref": "t2", "name": "hangup"});
    agent.send(next).await;
    assert_eq!(agent.next().await["type"], "tool.result");
    assert_eq!(call.state().unwrap().received, 2);
}

#[tokio::test]
async fn a_paused_reader_leaves_pongs_unread_without_dropping_the_agent() {
    let sim = sim_with(SimConfig {
        heartbeat_interval_ms: 1000,
        ..SimConfig::default()
    })
    .await;
    let mut agent = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let call = conn.start_text();
    agent.next().await;
    conn.pause_reading();
    let answer = json!({"type": "agent.say", "session_id": call.id, "text": "unread"});
    agent.send(answer).await;
    // Five intervals: the pongs the agent sends meanwhile are not read, and Sent does not mind.
    let mut pings = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        if let Ok(Some(Ok(Message::Text(text)))) =
            tokio::time::timeout_at(until, agent.ws.next()).await
        {
            let frame: Value = serde_json::from_str(&text).unwrap();
            if frame["type"] == "ping" {
                pings += 1;
                agent.send(json!({"type": "pong", "ts": frame["ts"]})).await;
            }
        }
    }
    assert!(pings >= 4, "Sent pings while it does not read: {pings}");
    assert!(conn.is_open());
    assert_eq!(call.state().unwrap().received, 0, "nothing read");
    conn.resume_reading();
    arrived(&sim, "agent.say").await;
    assert_eq!(call.state().unwrap().received, 1);
    assert!(sim.violations_since(0).is_empty());
}

#[tokio::test]
async fn an_ended_sessions_stream_is_given_again_only_when_the_connection_reuses_streams() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let first = conn.start_audio(16000);
    let stream = first.state().unwrap().stream;
    first.end("caller_hung_up");
    assert_ne!(conn.start_audio(16000).state().unwrap().stream, stream);
    conn.reuse_ended_streams();
    let third = conn.start_audio(16000);
    let third_stream = third.state().unwrap().stream;
    third.end("caller_hung_up");
    assert_eq!(
        conn.start_audio(16000).state().unwrap().stream,
        third_stream
    );
    agent.next().await;
}

#[tokio::test]
async fn a_claim_of_i64_max_received_leaves_sents_own_count_as_it_is() {
    let sim = sim().await;
    let mut first = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let call = conn.start_text();
    let token = first.next().await["resume"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    first
        .send(json!({"type": "agent.say", "session_id": call.id, "text": "one"}))
        .await;
    arrived(&sim, "agent.say").await;
    call.pretend_received(i64::MAX as u64);
    conn.drop_abruptly();
    let mut second = RawAgent::connect(&sim).await;
    second
        .send(
            json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 0}),
        )
        .await;
    let resumed = second.next().await;
    assert_eq!(resumed["received"], i64::MAX);
    assert_eq!(call.state().unwrap().received, 1, "the true count");
    second
        .send(json!({"type": "agent.say", "session_id": call.id, "text": "two"}))
        .await;
    sim.recorder()
        .wait_for(
            0,
            Duration::from_secs(5),
            "two",
            |_| false,
            |r| r.json().is_some_and(|j| j["text"] == "two"),
        )
        .await
        .unwrap();
    assert_eq!(call.state().unwrap().received, 2);
}

#[tokio::test]
async fn a_resume_on_a_connection_planned_without_audio_leaves_the_session_without_a_stream() {
    let sim = sim().await;
    let mut first = RawAgent::connect(&sim).await;
    let conn = latest(&sim).await;
    let call = conn.start_audio(16000);
    let token = first.next().await["resume"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    sim.plan(ConnPlan {
        resume_without_audio: true,
        ..ConnPlan::default()
    });
    conn.drop_abruptly();
    let mut second = RawAgent::connect(&sim).await;
    second
        .send(
            json!({"type": "session.resume", "session_id": call.id, "token": token, "received": 0}),
        )
        .await;
    let resumed = second.next().await;
    assert_eq!(resumed["type"], "session.resumed");
    assert!(resumed.get("audio").is_none(), "{resumed}");
    assert_eq!(call.state().unwrap().stream, None);
}

/// The upgrades Sent refuses, and with what status (a check of the simulator: an agent under test has no
/// part in it, so it is not one of the agent's scenarios).
#[tokio::test]
async fn bad_upgrades_are_refused_with_400_401_403_and_404() {
    let sim = sim().await;
    let base = sim.url();
    let with_agent = format!("{base}?agent_id={CONFORMANCE_AGENT}");
    let cases: [(&str, String, &str, bool, u16); 6] = [
        ("no agent_id", base.clone(), CONFORMANCE_KEY, true, 400),
        (
            "no subprotocol",
            with_agent.clone(),
            CONFORMANCE_KEY,
            false,
            400,
        ),
        (
            "a key that is not valid",
            with_agent.clone(),
            "not-a-key",
            true,
            401,
        ),
        (
            "a key of another account",
            with_agent.clone(),
            "other-account",
            true,
            403,
        ),
        (
            "an unknown agent",
            format!("{base}?agent_id=agent_nobody"),
            CONFORMANCE_KEY,
            true,
            404,
        ),
        ("all of it right", with_agent, CONFORMANCE_KEY, true, 101),
    ];
    for (what, url, key, subprotocol, status) in cases {
        let got = sentsim::scenarios::handshake_status(&url, Some(key), subprotocol)
            .await
            .unwrap();
        assert_eq!(got, status, "{what}");
    }
}

#[tokio::test]
async fn refuse_all_refuses_every_handshake_until_lifted() {
    let sim = sim().await;
    let url = format!("{}?agent_id={CONFORMANCE_AGENT}", sim.url());
    sim.refuse_all(Some(503));
    for _ in 0..3 {
        let status = sentsim::scenarios::handshake_status(&url, Some(CONFORMANCE_KEY), true)
            .await
            .unwrap();
        assert_eq!(status, 503);
    }
    sim.refuse_all(None);
    RawAgent::connect(&sim).await;
    assert_eq!(sim.attempts(), 4);
    assert_eq!(sim.open_connections(Some(CONFORMANCE_AGENT)).len(), 1);
}

#[tokio::test]
async fn a_sized_raw_message_has_exactly_that_size() {
    let sim = sim().await;
    let mut agent = RawAgent::connect(&sim).await;
    latest(&sim).await.send_raw_sized(1000);
    let message = tokio::time::timeout(Duration::from_secs(5), agent.ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Message::Text(text) = message else {
        panic!("not text: {message:?}");
    };
    assert_eq!(text.len(), 1000);
    let frame: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(frame["type"], "connection.note");
}
