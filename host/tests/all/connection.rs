//! One WebSocket to Sent, against the simulator (and, for what the simulator cannot send, a scripted Sent),
//! all on loopback.

use futures_util::{SinkExt, StreamExt};
use sentdm_voice_agents::frames::{encode_to_string, AgentSay, Frame};
use sentsim::sim::{CONFORMANCE_AGENT, CONFORMANCE_KEY};
use sentsim::{ConnHandle, ConnPlan, Sim, SimConfig, What};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::WebSocketStream;
use voicehost::agent::connection::{self, ConnectError, Dial, Event, EventSink, Outbox};
use voicehost::stats::Stats;
use voicehost_proto::call::CallKey;

type Events = UnboundedReceiver<(u64, Event)>;

const WAIT: Duration = Duration::from_secs(3);

/// The tag the tests write under: a call of their own.
const KEY: CallKey = CallKey(1);

fn config(heartbeat_interval_ms: u64) -> SimConfig {
    SimConfig {
        heartbeat_interval_ms,
        ..SimConfig::default()
    }
}

fn dial(sim: &Sim) -> Dial {
    Dial::new(sim.url(), CONFORMANCE_AGENT, CONFORMANCE_KEY)
}

/// A connection's events into a channel the test reads. Unbounded: each test's connection gets a handful
/// of frames from the simulator, and the test reads them all.
struct Watch(mpsc::UnboundedSender<(u64, Event)>);

impl EventSink for Watch {
    fn handle(&self, id: u64, event: Event) -> bool {
        self.0.send((id, event)).is_ok()
    }
}

/// Starts connection `id`'s task on `dial`, and returns its raw events.
fn start(id: u64, dial: &Dial) -> Events {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(connection::run(
        id,
        dial.clone(),
        Duration::ZERO,
        Arc::new(Watch(tx)),
        Arc::new(Stats::default()),
    ));
    rx
}

/// Waits for the connection to open: Sent's `connection.ready` and its outbox.
async fn opened(
    events: &mut Events,
) -> (sentdm_voice_agents::frames::ConnectionReady, Arc<Outbox>) {
    match next_event(events).await.1 {
        Event::Opened { ready, outbox } => (ready, outbox),
        other => panic!("expected the connection to open, got {other:?}"),
    }
}

/// Opens connection `id` to the simulator and returns its outbox, its events and the simulator's handle on
/// it. Pings are answered as the agent's router does: each pong once the events before it are read.
async fn open(sim: &Sim, id: u64) -> (Arc<Outbox>, Events, ConnHandle) {
    let mut raw = start(id, &dial(sim));
    let (_, outbox) = opened(&mut raw).await;
    let (forward, rx) = mpsc::unbounded_channel();
    let pongs = outbox.clone();
    tokio::spawn(async move {
        while let Some((id, event)) = raw.recv().await {
            match event {
                Event::Ping(ts) => pongs.pong(voicehost_proto::wire::pong(ts)),
                event => {
                    if forward.send((id, event)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let opened = sim
        .recorder()
        .since(0, |r| matches!(r.what, What::Opened))
        .last()
        .map(|r| r.conn)
        .expect("the simulator saw the connection open");
    (outbox, rx, sim.conn(opened))
}

async fn open_err(dial: &Dial) -> ConnectError {
    match connection::open(dial).await {
        Ok((_, ready, _)) => panic!("expected an error, got a connection ready with {ready:?}"),
        Err(error) => error,
    }
}

async fn next_event(events: &mut Events) -> (u64, Event) {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("an event in time")
        .expect("the events channel is open")
}

/// The next event must be `Closed`, and nothing may follow it: the connection's task has ended.
async fn expect_closed(events: &mut Events, within: Duration) -> String {
    let (_, event) = tokio::time::timeout(within, events.recv())
        .await
        .expect("Closed in time")
        .expect("the events channel is open");
    let Event::Closed { why } = event else {
        panic!("expected Closed, got {event:?}");
    };
    let after = tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("the connection's task ends after Closed");
    assert!(after.is_none(), "an event after Closed: {after:?}");
    why
}

fn frame_of(event: Event) -> Frame {
    match event {
        Event::Frame(frame) => *frame,
        other => panic!("expected a frame, got {other:?}"),
    }
}

fn assert_no_event(events: &mut Events) {
    if let Ok(event) = events.try_recv() {
        panic!("expected no event, got {event:?}");
    }
}

fn say(session_id: &str, text: &str, last: bool) -> String {
    encode_to_string(&Frame::AgentSay(AgentSay {
        session_id: session_id.into(),
        text: text.into(),
        interruptible: None,
        last: Some(last),
    }))
    .expect("a valid agent.say")
}

// ----- a scripted Sent, for what the simulator never sends -----

/// Accepts one WebSocket upgrade (with the subprotocol) on a loopback port and runs `script` on it.
async fn scripted_sent<F, Fut>(script: F) -> (String, tokio::task::JoinHandle<()>)
where
    F: FnOnce(WebSocketStream<TcpStream>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/agents/connect", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        #[allow(clippy::result_large_err)]
        let callback = |_: &Request, mut response: Response| -> Result<Response, ErrorResponse> {
            response.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                HeaderValue::from_static("sent.voice.v1"),
            );
            Ok(response)
        };
        let socket = tokio_tungstenite::accept_hdr_async(stream, callback)
            .await
            .unwrap();
        script(socket).await;
    });
    (url, task)
}

const READY: &str = r#"{"type":"connection.ready","protocol_version":"0.2.0","heartbeat_interval_ms":1000,"max_sessions":3}"#;

async fn send_text(socket: &mut WebSocketStream<TcpStream>, text: &str) {
    socket.send(Message::Text(text.into())).await.unwrap();
}

/// The next text the agent sends, skipping nothing else.
async fn read_text(socket: &mut WebSocketStream<TcpStream>) -> String {
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("a message from the agent in time")
            .expect("the socket is open")
            .expect("a message");
        if let Message::Text(text) = message {
            return text.to_string();
        }
    }
}

// ----- the handshake -----

#[tokio::test]
async fn refusals_400_401_403_404_are_fatal_with_their_status_and_not_retried() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    let cases = [
        (Dial::new(sim.url(), "", CONFORMANCE_KEY), 400),
        (Dial::new(sim.url(), CONFORMANCE_AGENT, "not-a-key"), 401),
        (
            Dial::new(sim.url(), CONFORMANCE_AGENT, "other-account"),
            403,
        ),
        (Dial::new(sim.url(), "agent_nobody", CONFORMANCE_KEY), 404),
    ];
    for (dial, status) in &cases {
        let error = open_err(dial).await;
        assert!(
            matches!(error, ConnectError::Refused { status: s, .. } if s == *status),
            "expected a {status} refusal, got {error:?}"
        );
        assert!(error.is_fatal());
        assert!(error.to_string().contains(&status.to_string()));
    }
    assert_eq!(sim.attempts(), cases.len(), "one attempt each, no retry");
    sim.shutdown();
}

#[tokio::test]
async fn other_refusal_statuses_are_transient() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    for status in [429, 500, 503] {
        sim.plan(ConnPlan {
            refuse: Some(status),
            ..ConnPlan::default()
        });
        let error = open_err(&dial(&sim)).await;
        assert!(
            matches!(&error, ConnectError::Transient(why) if why.contains(&status.to_string())),
            "expected a transient error for {status}, got {error:?}"
        );
        assert!(!error.is_fatal());
    }
    sim.shutdown();
}

#[tokio::test]
async fn nothing_listening_is_transient() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/agents/connect", listener.local_addr().unwrap());
    drop(listener);
    let error = open_err(&Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY)).await;
    assert!(matches!(error, ConnectError::Transient(_)), "{error:?}");
}

#[tokio::test]
async fn a_server_that_closes_mid_handshake_is_transient() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/agents/connect", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        drop(stream);
    });
    let error = open_err(&Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY)).await;
    assert!(matches!(error, ConnectError::Transient(_)), "{error:?}");
    server.await.unwrap();
}

#[tokio::test]
async fn a_handshake_that_never_completes_times_out_as_transient() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/agents/connect", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(stream);
    });
    let mut dial = Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY);
    dial.handshake_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let error = open_err(&dial).await;
    assert!(
        matches!(&error, ConnectError::Transient(why) if why.contains("handshake")),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    server.abort();
}

#[tokio::test]
async fn no_connection_ready_in_time_is_transient() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    sim.plan(ConnPlan {
        ready_delay: Duration::from_secs(2),
        ..ConnPlan::default()
    });
    let mut dial = dial(&sim);
    dial.handshake_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let error = open_err(&dial).await;
    assert!(
        matches!(&error, ConnectError::Transient(why) if why.contains("connection.ready")),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    sim.shutdown();
}

#[tokio::test]
async fn a_server_that_closes_before_connection_ready_is_transient() {
    let (url, server) = scripted_sent(|mut socket| async move {
        let _ = socket.close(None).await;
    })
    .await;
    let error = open_err(&Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY)).await;
    assert!(
        matches!(&error, ConnectError::Transient(why) if why.contains("connection.ready")),
        "{error:?}"
    );
    server.await.unwrap();
}

#[tokio::test]
async fn what_sent_sends_before_connection_ready_is_kept_within_a_bound() {
    // Frames before connection.ready wait for it; a Sent that sends more than the bound holds is not a
    // connection to keep (the early frames are not kept without end).
    let (url, server) = scripted_sent(|mut socket| async move {
        for _ in 0..=connection::MAX_EARLY {
            send_text(&mut socket, r#"{"type":"connection.draining"}"#).await;
        }
        send_text(&mut socket, READY).await;
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
    let error = open_err(&Dial::new(url, CONFORMANCE_AGENT, CONFORMANCE_KEY)).await;
    assert!(
        matches!(&error, ConnectError::Transient(why) if why.contains("before connection.ready")),
        "{error:?}"
    );
    server.await.unwrap();
}

#[tokio::test]
async fn a_url_or_key_that_cannot_work_is_invalid_not_transient() {
    let bad_scheme = Dial::new("http://127.0.0.1:1/v1/agents/connect", "a", "k");
    assert!(matches!(
        open_err(&bad_scheme).await,
        ConnectError::Invalid(_)
    ));
    let bad_key = Dial::new("ws://127.0.0.1:1/v1/agents/connect", "a", "line\nbreak");
    let error = open_err(&bad_key).await;
    assert!(matches!(error, ConnectError::Invalid(_)), "{error:?}");
    assert!(error.is_fatal());
    assert!(
        !error.to_string().contains("line"),
        "the key leaked: {error}"
    );
}

#[test]
fn the_dial_never_shows_the_api_key() {
    let dial = Dial::new("ws://x/v1/agents/connect", "agent_a", "sk_live_secret");
    assert!(!format!("{dial:?}").contains("secret"));
    assert!(!format!("{}", dial.api_key).contains("secret"));
    assert_eq!(dial.api_key.expose(), "sk_live_secret");
}

#[test]
fn the_agent_id_is_appended_with_question_mark_or_ampersand_and_escaped() {
    let plain = Dial::new("ws://x/v1/agents/connect", "agent_a", "k");
    assert_eq!(
        plain.connect_url(),
        "ws://x/v1/agents/connect?agent_id=agent_a"
    );
    let query = Dial::new("ws://x/v1/agents/connect?region=eu", "a b&c", "k");
    assert_eq!(
        query.connect_url(),
        "ws://x/v1/agents/connect?region=eu&agent_id=a%20b%26c"
    );
}

#[tokio::test]
async fn a_url_that_already_has_a_query_still_connects_as_the_agent() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    let dial = Dial::new(
        format!("{}?region=eu", sim.url()),
        CONFORMANCE_AGENT,
        CONFORMANCE_KEY,
    );
    let mut events = start(1, &dial);
    let (ready, outbox) = opened(&mut events).await;
    assert_eq!(ready.protocol_version, "0.2.0");
    outbox.close();
    expect_closed(&mut events, WAIT).await;
    sim.shutdown();
}

// ----- a ready connection -----

#[tokio::test]
async fn a_connection_becomes_ready_with_the_configured_heartbeat_and_max_sessions() {
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1500,
        max_sessions: 7,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let mut events = start(42, &dial(&sim));
    let (id, event) = next_event(&mut events).await;
    assert_eq!(id, 42);
    let Event::Opened { ready, outbox } = event else {
        panic!("expected the connection to open, got {event:?}");
    };
    assert_eq!(ready.protocol_version, "0.2.0");
    assert_eq!(ready.heartbeat_interval_ms, 1500);
    assert_eq!(ready.max_sessions, 7);
    assert!(!outbox.is_closed());
    assert_no_event(&mut events);
    sim.shutdown();
}

#[tokio::test]
async fn pings_are_answered_with_a_pong_of_the_same_ts_once_the_consumer_has_read_them() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (_conn, mut events, handle) = open(&sim, 1).await;
    for _ in 0..3 {
        handle.fence().await.expect("the pong to each ping");
    }
    assert!(
        sim.violations_since(0).is_empty(),
        "{:?}",
        sim.violations_since(0)
    );
    assert_no_event(&mut events);
    sim.shutdown();
}

#[tokio::test]
async fn session_frames_are_forwarded_as_incoming_frames_tagged_with_the_connection() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (_conn, mut events, handle) = open(&sim, 5).await;
    let call = handle.start_text();
    let (id, event) = next_event(&mut events).await;
    assert_eq!(id, 5);
    match frame_of(event) {
        Frame::SessionStart(start) => assert_eq!(start.session_id, call.id),
        other => panic!("expected session.start, got {other:?}"),
    }
    call.say("hello");
    match frame_of(next_event(&mut events).await.1) {
        Frame::UserSaid(said) => {
            assert_eq!(said.session_id, call.id);
            assert_eq!(said.text, "hello");
        }
        other => panic!("expected user.said, got {other:?}"),
    }
    sim.shutdown();
}

#[tokio::test]
async fn text_queued_on_the_outbox_reaches_sent_in_order() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    let mut call = handle.start_text();
    next_event(&mut events).await;
    outbox.frame(KEY, say(&call.id, "first", true), true);
    outbox.frame(KEY, say(&call.id, "second", true), true);
    call.expect_say("first").await.unwrap();
    call.expect_say("second").await.unwrap();
    // Many queued at once go out as batches, every one of them, in order.
    for n in 0..200 {
        outbox.frame(KEY, say(&call.id, &format!("burst {n}"), n == 199), true);
    }
    for n in 0..200 {
        call.expect_say_with(&format!("burst {n}"), n == 199)
            .await
            .unwrap();
    }
    assert!(
        sim.violations_since(0).is_empty(),
        "{:?}",
        sim.violations_since(0)
    );
    sim.shutdown();
}

#[tokio::test]
async fn audio_is_forwarded_with_its_stream_number_and_sent_back_as_is() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    let mut call = handle.start_audio(8000);
    let stream = match frame_of(next_event(&mut events).await.1) {
        Frame::SessionStart(start) => start.audio.expect("an audio session").stream,
        other => panic!("expected session.start, got {other:?}"),
    };
    let samples: Vec<u8> = (0..320).map(|n| n as u8).collect();
    call.send_audio(&samples);
    let (got_stream, got) = match next_event(&mut events).await.1 {
        Event::Audio { stream, samples } => (stream, samples),
        other => panic!("expected audio, got {other:?}"),
    };
    assert_eq!(got_stream, stream as u16);
    assert_eq!(&got[..], &samples[..]);
    let mut message = (stream as u16).to_be_bytes().to_vec();
    message.extend_from_slice(&got);
    outbox.audio(KEY, Bytes::from(message), 1 << 20);
    call.expect_audio(&samples).await.unwrap();
    sim.shutdown();
}

#[tokio::test]
async fn invalid_text_from_sent_is_dropped_and_the_connection_goes_on() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (_conn, mut events, handle) = open(&sim, 1).await;
    for raw in [
        "",
        "not json",
        "[1,2]",
        "{}",
        r#"{"type":7}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"ping","ts":"soon"}"#,
        r#"{"type":"ping","ts":-1}"#,
        r#"{"type":"ping","ts":1e400}"#,
        r#"{"type":"session.start","session_id":"vs_x"}"#,
        r#"{"type":"session.resumed","session_id":"vs_x","resume":{"token":"vsr_secret"}}"#,
    ] {
        handle.send_raw(raw);
    }
    // A connection frame of a type this version does not know is valid: it is forwarded.
    handle.send_raw(r#"{"type":"connection.future","note":"later"}"#);
    handle.fence().await.expect("still answering pings");
    match frame_of(next_event(&mut events).await.1) {
        Frame::Unknown(unknown) => {
            assert_eq!(unknown.frame_type, "connection.future")
        }
        other => panic!("expected the unknown frame, got {other:?}"),
    }
    assert_no_event(&mut events);
    sim.shutdown();
}

#[tokio::test]
async fn binary_messages_without_a_sample_are_dropped() {
    let (url, server) = scripted_sent(|mut socket| async move {
        send_text(&mut socket, READY).await;
        for size in [0usize, 1, 2, 3] {
            socket
                .send(Message::Binary(Bytes::from(vec![9u8; size])))
                .await
                .unwrap();
        }
        send_text(&mut socket, "\u{0}garbage").await;
        send_text(&mut socket, r#"{"type":"ping","ts":42}"#).await;
        assert_eq!(read_text(&mut socket).await, r#"{"type":"pong","ts":42}"#);
        let _ = socket
            .close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }))
            .await;
    })
    .await;
    let mut events = start(3, &Dial::new(url, "a", "k"));
    let (_, outbox) = opened(&mut events).await;
    // Two bytes are a stream number and no sample; a third, odd byte is not a sample either: nothing of
    // the four reaches the router, and the ping after them does.
    match next_event(&mut events).await {
        (3, Event::Ping(ts)) => outbox.pong(voicehost_proto::wire::pong(ts)),
        other => panic!("expected the ping, got {other:?}"),
    }
    let why = expect_closed(&mut events, WAIT).await;
    assert!(why.contains("closed by Sent with 1000"), "{why}");
    server.await.unwrap();
}

#[tokio::test]
async fn pings_before_connection_ready_are_answered_and_early_frames_kept() {
    let (url, server) = scripted_sent(|mut socket| async move {
        send_text(&mut socket, r#"{"type":"ping","ts":7}"#).await;
        assert_eq!(read_text(&mut socket).await, r#"{"type":"pong","ts":7}"#);
        send_text(&mut socket, r#"{"type":"connection.draining"}"#).await;
        send_text(&mut socket, READY).await;
        // Hold the socket until the agent goes.
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
    let mut events = start(1, &Dial::new(url, "a", "k"));
    let (ready, outbox) = opened(&mut events).await;
    assert_eq!(ready.max_sessions, 3);
    assert!(matches!(
        frame_of(next_event(&mut events).await.1),
        Frame::ConnectionDraining(_)
    ));
    outbox.close();
    expect_closed(&mut events, WAIT).await;
    server.await.unwrap();
}

// ----- the end of a connection -----

/// The reader records when it last heard Sent, for the core's rule on a silent Sent (three heartbeat
/// intervals: the router's, in `voicehost_proto`, and the scenario `silent_sent_reconnects`); told to close
/// as silent, the connection closes with 1001, so that its calls stay resumable.
#[tokio::test]
async fn a_muted_sent_is_not_heard_and_a_silent_close_is_1001() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    handle.mute();
    // A ping may be on its way; then nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let heard = outbox.activity(Instant::now()).heard;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = outbox.activity(Instant::now());
    assert_eq!(later.heard, heard, "nothing heard while Sent is muted");
    assert!(
        later.written > heard,
        "the writer, with nothing to write, is up to date"
    );
    outbox.close_away("silent");
    let why = expect_closed(&mut events, WAIT).await;
    assert!(why.contains("silent"), "{why}");
    let how = handle.closed(WAIT).await.unwrap();
    assert!(how.contains("1001"), "{how}");
    assert!(outbox.is_closed());
    sim.shutdown();
}

#[tokio::test]
async fn pings_keep_a_connection_alive_past_three_heartbeat_intervals() {
    let sim = Sim::start_local(config(1000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_no_event(&mut events);
    assert!(!outbox.is_closed());
    handle.fence().await.expect("still open");
    sim.shutdown();
}

#[tokio::test]
async fn an_abrupt_drop_by_sent_emits_closed_once() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    handle.drop_abruptly();
    let why = expect_closed(&mut events, WAIT).await;
    assert!(why.contains("lost"), "{why}");
    assert!(outbox.is_closed());
    sim.shutdown();
}

#[tokio::test]
async fn a_close_by_sent_emits_closed_with_its_code() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (_conn, mut events, handle) = open(&sim, 1).await;
    handle.close();
    let why = expect_closed(&mut events, WAIT).await;
    assert!(why.contains("1001"), "{why}");
    sim.shutdown();
}

#[tokio::test]
async fn close_sends_the_pongs_before_it_then_a_close_frame_with_code_1000() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let (outbox, mut events, handle) = open(&sim, 1).await;
    let call = handle.start_text();
    next_event(&mut events).await;
    // What is queued for the calls is not written: a close with 1000 sends them to their fallback.
    outbox.frame(KEY, say(&call.id, "never", true), true);
    outbox.pong(voicehost_proto::wire::pong(7));
    outbox.close();
    let how = handle.closed(WAIT).await.unwrap();
    assert!(how.contains("1000"), "{how}");
    let why = expect_closed(&mut events, WAIT).await;
    assert!(why.contains("1000"), "{why}");
    assert!(outbox.is_closed());
    sim.shutdown();
}

#[tokio::test]
async fn a_connection_whose_events_nobody_reads_closes_with_1001() {
    let sim = Sim::start_local(config(15_000)).await.unwrap();
    let mut events = start(1, &dial(&sim));
    let (_, outbox) = opened(&mut events).await;
    let handle = sim.conn(1);
    drop(events);
    let _call = handle.start_text();
    let how = handle.closed(WAIT).await.unwrap();
    assert!(how.contains("1001"), "{how}");
    tokio::time::timeout(WAIT, async {
        while !outbox.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the connection's writer stops");
    sim.shutdown();
}
