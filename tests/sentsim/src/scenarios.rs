//! The conformance scenarios: one behaviour each, for the conformance agent of the protocol (`protocol.md`
//! §9.2), run from Sent's side. Each runs on whatever agent is connected and leaves it connected (except the
//! last, which refuses it).

use crate::record::{Dir, What};
use crate::sim::{Call, ConnHandle, ConnPlan, SessionSpec, ToolPlan, DEADLINE};
use crate::suite::Ctx;
use anyhow::{bail, ensure, Context as _, Result};
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// What the conformance agent says first in a text session.
pub const GREETING: &str = "Hello from the conformance agent.";

/// One named behaviour.
pub struct Scenario {
    /// Its name: the name of the function that runs it, and what a filter matches.
    pub name: &'static str,
    /// The behaviour it checks, in a sentence.
    pub meaning: &'static str,
    /// What it needs of the agent and of whoever serves it.
    pub needs: Needs,
    /// Runs it against the agent connected to the context's simulator; `Err` says what went wrong.
    pub run: for<'a> fn(&'a Ctx) -> BoxFuture<'a, Result<()>>,
}

/// What a scenario needs of the agent under test and of whoever serves it, so that a test can start them
/// to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// The agent it must talk to.
    pub agent: AgentKind,
    /// `resume.window_ms` that Sent gives every session (`None`: the [`crate::SimConfig`]'s).
    pub window_ms: Option<u64>,
    /// Settings of voicehost's: a scenario that needs any of them runs against voicehost only.
    pub host: HostSettings,
}

impl Needs {
    /// The conformance agent, whoever implements it, and nothing else: every conformance scenario.
    pub const CONFORMANCE: Needs = Needs {
        agent: AgentKind::Conformance,
        window_ms: None,
        host: HostSettings::DEFAULT,
    };

    /// Whether any conformance agent (the official SDK's too) can run the scenario: it needs no guest of
    /// voicehost's and no setting of voicehost's (a setting of Sent's, such as `window_ms`, is fine).
    pub fn any_conformance_agent(&self) -> bool {
        self.agent == AgentKind::Conformance && self.host == HostSettings::DEFAULT
    }
}

/// The agent a scenario talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// The conformance agent of `protocol.md` §9.2, whoever implements it.
    Conformance,
    /// voicehost's Rust conformance component (`examples/conformance`): §9.2 plus `panic`, which traps
    /// its instance.
    VoicehostConformance,
    /// voicehost's test guest `tests/programs/guests/prober`: audio of its own, floods, oversized sends.
    Prober,
}

/// What a scenario needs voicehost to be started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSettings {
    /// How long a tool call waits for Sent's answer (`CallLimits::tool_timeout`); `None`: the default.
    pub tool_timeout_ms: Option<u64>,
    /// The failure policy transfers the call to this party (kind, value), e.g. `("number",
    /// "+14155550100")`; `None`: it hangs up.
    pub transfer_to: Option<(&'static str, &'static str)>,
    /// Connections to Sent the agent holds at once.
    pub connections: usize,
}

impl HostSettings {
    /// voicehost as it starts with no settings: the default tool timeout, a failure policy that hangs up,
    /// and one connection to Sent.
    pub const DEFAULT: HostSettings = HostSettings {
        tool_timeout_ms: None,
        transfer_to: None,
        connections: 1,
    };
}

scenarios! {
    ready_ping_pong: "connection.ready carries the configured values; every ping is answered by a pong with its ts",
    greeting: "a text session starts with agent.say of the greeting, and nothing else",
    echo: "\"echo <text>\" is answered by agent.say <text>",
    stream: "\"stream <word> <rest>\" gives agent.say <word> with last false, then <rest> with last true",
    correction_clears: "a user.said with correction true gets agent.clear before the new answer",
    transfer: "\"transfer\" calls the transfer tool to user conformance-desk; its success ends the session as transferred",
    hangup: "\"hangup\" calls the hangup tool with no arguments; its success ends the session as agent_hung_up",
    dtmf: "\"dtmf <digits>\" calls send_dtmf with the digits, and the session goes on",
    hold: "\"hold\" calls hold with held true",
    failed_tool_is_spoken: "a tool.result with ok false is answered by agent.say \"Tool failed: <code>\"",
    audio_echo_8000: "audio at 8000 Hz comes back unchanged, in order, on the session's stream",
    audio_echo_16000: "audio at 16000 Hz comes back unchanged, in order, on the session's stream",
    audio_echo_24000: "audio at 24000 Hz comes back unchanged, in order, on the session's stream",
    concurrent_sessions_isolated: "two sessions on one connection, interleaved, each get only their own answers",
    drain_moves_sessions: "after connection.draining the agent opens a new connection, resumes there, and nothing is lost or doubled",
    lost_connection_resumes: "after an abrupt drop the agent reconnects and resumes; no counted frame is lost or duplicated",
    reply_across_a_drop_arrives_once: "the reply to an utterance Sent sends just before dropping the connection reaches Sent once, after session.resumed (whether the agent sent it before the drop and replays it, or said it while detached and held it)",
    connection_full_resumes_elsewhere: "a resume refused with connection_full succeeds on another connection, and no audio reaches the full one",
    resume_failed_loses_session: "a resume refused with resume_failed loses the session: its waiting tool call is dropped and nothing more is sent for it",
    ended_while_detached: "a session that ended while detached is resumed without a next token; its replay ends with session.end",
    replay_gap_hangs_up: "when Sent needs frames older than the 32 the agent keeps, the agent sends a hangup tool call",
    unknown_frames_counted: "session frames of unknown types are counted in the agent's received; unknown connection frames are ignored",
    invalid_frames_from_sent_ignored: "invalid frames from Sent are ignored and not counted",
    audio_after_end_not_delivered: "after session.end no audio for the session reaches Sent",
    silent_sent_reconnects: "when Sent sends nothing for 3 heartbeat intervals the agent closes the connection and opens another",
    refused_agent_stops: "a 401 refusal of a reconnect stops the agent: it does not try again",
}

// ----- helpers -----

/// A text session on the current connection, past its greeting.
async fn greeted(ctx: &Ctx) -> Result<(ConnHandle, Call)> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(GREETING).await?;
    Ok((conn, call))
}

/// 20 ms of recognisable samples at `sample_rate`: a ramp that starts at `seed`.
pub fn samples(sample_rate: u32, seed: u16) -> Vec<u8> {
    let count = sample_rate as usize / 50;
    (0..count)
        .flat_map(|i| (seed.wrapping_add(i as u16) as i16).to_le_bytes())
        .collect()
}

fn says(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["type"] == "agent.say")
        .map(|f| f["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The waits for a reconnect allow for the official SDK's backoff after a few failed attempts.
const RECONNECT: Duration = Duration::from_secs(20);

// ----- the scenarios -----

/// The HTTP status of a WebSocket upgrade (101 when it succeeds).
pub async fn handshake_status(url: &str, key: Option<&str>, subprotocol: bool) -> Result<u16> {
    let mut request = url.into_client_request()?;
    if let Some(key) = key {
        request.headers_mut().insert(
            "Authorization",
            HeaderValue::from_str(&format!("Bearer {key}"))?,
        );
    }
    if subprotocol {
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("sent.voice.v1"),
        );
    }
    let attempt = tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(request)).await;
    match attempt.context("the handshake did not finish")? {
        Ok(_) => Ok(101),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Ok(response.status().as_u16())
        }
        Err(error) => bail!("the handshake failed: {error}"),
    }
}

async fn ready_ping_pong(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let config = ctx.sim.config();
    let ready = ctx.sim.recorder().since(0, |r| {
        r.conn == conn.id && r.is_frame(Dir::ToAgent, "connection.ready")
    });
    let ready = ready
        .first()
        .and_then(|r| r.json().cloned())
        .context("no connection.ready")?;
    ensure!(
        ready["protocol_version"] == config.protocol_version.as_str()
            && ready["heartbeat_interval_ms"] == config.heartbeat_interval_ms
            && ready["max_sessions"].is_u64(),
        "connection.ready does not carry the configured values: {ready}"
    );
    // Two pings of our own: each pong must echo its ping's ts (a stray ts is a violation).
    conn.fence().await?;
    conn.fence().await?;
    let first = ctx
        .sim
        .recorder()
        .since(0, |r| r.conn == conn.id && r.session.is_none());
    let pings = first
        .iter()
        .filter(|r| r.is_frame(Dir::ToAgent, "ping"))
        .count();
    let pongs = first
        .iter()
        .filter(|r| r.is_frame(Dir::FromAgent, "pong"))
        .count();
    ensure!(
        pongs >= 3 && pongs + 1 >= pings,
        "{pings} pings but {pongs} pongs"
    );
    Ok(())
}

async fn greeting(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.expect_nothing(Duration::from_millis(300)).await
}

async fn echo(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("echo hello there");
    call.expect_say("hello there").await?;
    Ok(())
}

async fn stream(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("stream Let me think");
    call.expect_say_with("Let", false).await?;
    call.expect_say("me think").await?;
    Ok(())
}

async fn correction_clears(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("echo first");
    call.expect_say("first").await?;
    call.correct("echo second");
    call.expect_clear().await?;
    call.expect_say("second").await?;
    Ok(())
}

async fn transfer(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("transfer");
    let tool = call.expect_tool("transfer").await?;
    ensure!(
        tool["arguments"] == json!({"to": {"kind": "user", "value": "conformance-desk"}}),
        "transfer arguments: {}",
        tool["arguments"]
    );
    let ended = call.state().and_then(|s| s.ended);
    ensure!(
        ended.as_deref() == Some("transferred"),
        "the session did not end as transferred: {ended:?}"
    );
    call.expect_nothing(Duration::from_millis(300)).await
}

async fn hangup(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("hangup");
    let tool = call.expect_tool("hangup").await?;
    ensure!(
        tool.get("arguments").is_none(),
        "hangup has arguments: {tool}"
    );
    let ended = call.state().and_then(|s| s.ended);
    ensure!(
        ended.as_deref() == Some("agent_hung_up"),
        "the session did not end as agent_hung_up: {ended:?}"
    );
    call.expect_nothing(Duration::from_millis(300)).await
}

async fn dtmf(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("dtmf 12#w3");
    let tool = call.expect_tool("send_dtmf").await?;
    ensure!(
        tool["arguments"] == json!({"digits": "12#w3"}),
        "send_dtmf arguments: {}",
        tool["arguments"]
    );
    call.say("echo still here");
    call.expect_say("still here").await?;
    Ok(())
}

async fn hold(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.say("hold");
    let tool = call.expect_tool("hold").await?;
    ensure!(
        tool["arguments"] == json!({"held": true}),
        "hold arguments: {}",
        tool["arguments"]
    );
    Ok(())
}

async fn failed_tool_is_spoken(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.plan_tool("send_dtmf", ToolPlan::Fail("dtmf_failed".into()));
    call.say("dtmf 1");
    call.expect_tool("send_dtmf").await?;
    call.expect_say("Tool failed: dtmf_failed").await?;
    Ok(())
}

async fn audio_echo(ctx: &Ctx, sample_rate: u32) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_audio(sample_rate);
    for seed in 0..5u16 {
        let frame = samples(sample_rate, seed * 1000);
        call.send_audio(&frame);
        call.expect_audio(&frame).await?;
    }
    call.expect_nothing(Duration::from_millis(100)).await
}

async fn audio_echo_8000(ctx: &Ctx) -> Result<()> {
    audio_echo(ctx, 8000).await
}

async fn audio_echo_16000(ctx: &Ctx) -> Result<()> {
    audio_echo(ctx, 16000).await
}

async fn audio_echo_24000(ctx: &Ctx) -> Result<()> {
    audio_echo(ctx, 24000).await
}

async fn concurrent_sessions_isolated(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    if ctx.profile.concurrent_audio {
        let mut a = conn.start_audio(16000);
        let mut b = conn.start_audio(16000);
        for seed in 0..10u16 {
            let (for_a, for_b) = (samples(16000, seed), samples(16000, 30000 + seed));
            a.send_audio(&for_a);
            b.send_audio(&for_b);
            a.expect_audio(&for_a).await?;
            b.expect_audio(&for_b).await?;
        }
    } else {
        let mut a = conn.start_text();
        let mut b = conn.start_text();
        a.expect_say(GREETING).await?;
        b.expect_say(GREETING).await?;
        for n in 0..10 {
            a.say(&format!("echo a{n}"));
            b.say(&format!("echo b{n}"));
            a.expect_say(&format!("a{n}")).await?;
            b.expect_say(&format!("b{n}")).await?;
        }
    }
    Ok(())
}

async fn drain_moves_sessions(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    call.say("echo one");
    call.expect_say("one").await?;
    old.drain();
    // Said on the draining connection while the agent moves: it reaches the agent once, here or in the replay.
    call.say("echo moved");
    let new = ctx.sim.connection_after(old.id, RECONNECT).await?;
    let (conn, _) = call.expect_resumed(RECONNECT).await?;
    ensure!(
        conn == new.id,
        "resumed on connection {conn}, not the new one ({})",
        new.id
    );
    call.expect_say("moved").await?;
    call.say("echo two");
    call.expect_say("two").await?;
    let how = old.closed(DEADLINE).await?;
    ensure!(
        how.contains("Sent"),
        "the drained connection closed unexpectedly: {how}"
    );
    let said = says(&call.accepted_frames());
    ensure!(
        said == [GREETING, "one", "moved", "two"],
        "the agent said {said:?}"
    );
    Ok(())
}

async fn lost_connection_resumes(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    call.say("echo one");
    call.expect_say("one").await?;
    // Two utterances in flight when the connection dies: each is answered once, whichever side replays it.
    call.say("echo two");
    call.say("echo three");
    old.drop_abruptly();
    let (conn, resume) = call.expect_resume(RECONNECT).await?;
    ensure!(conn != old.id, "resumed on the dropped connection");
    let sent = call.state().map_or(0, |s| s.sent);
    let received = resume["received"].as_u64().unwrap_or(u64::MAX) as usize;
    ensure!(
        received <= sent,
        "the agent says it read {received} of Sent's frames, but Sent sent {sent}"
    );
    call.expect_resumed(DEADLINE).await?;
    call.expect_say("two").await?;
    call.expect_say("three").await?;
    call.say("echo four");
    call.expect_say("four").await?;
    let said = says(&call.accepted_frames());
    ensure!(
        said == [GREETING, "one", "two", "three", "four"],
        "the agent said {said:?}"
    );
    Ok(())
}

async fn reply_across_a_drop_arrives_once(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    ctx.sim.plan(ConnPlan {
        resume_delay: Duration::from_millis(400),
        ..ConnPlan::default()
    });
    // The conformance agent speaks only when spoken to: its answer goes out just before the drop (and is
    // replayed) or just after it (and is held). Which one is not Sent's to see; voicehost's pressure
    // scenario `speech_during_a_resume_is_held` makes a guest speak inside the resume for certain.
    call.say("echo during");
    old.drop_abruptly();
    call.expect_resume(RECONNECT).await?;
    // Anything sent before session.resumed is a violation the suite reports.
    call.expect_resumed(DEADLINE).await?;
    call.expect_say("during").await?;
    call.say("echo after");
    call.expect_say("after").await?;
    let said = says(&call.accepted_frames());
    ensure!(
        said == [GREETING, "during", "after"],
        "the agent said {said:?}"
    );
    Ok(())
}

async fn connection_full_resumes_elsewhere(ctx: &Ctx) -> Result<()> {
    let old = ctx.sim.connection().await?;
    let mut call = old.start_audio(16000);
    let first = samples(16000, 1);
    call.send_audio(&first);
    call.expect_audio(&first).await?;
    // The next connection is full at once: it carries one session, started before the resume is read. Its
    // stream number is the moving session's old one, so misrouted audio would reach another caller.
    ctx.sim.plan(ConnPlan {
        max_sessions: Some(1),
        prestart: vec![SessionSpec::audio(16000)],
        ..ConnPlan::default()
    });
    ctx.sim.plan(ConnPlan {
        ready_delay: Duration::from_millis(400),
        ..ConnPlan::default()
    });
    old.drain();
    let (full, answer) = call.expect_resume_answer(RECONNECT).await?;
    ensure!(
        answer["type"] == "error" && answer["error"]["code"] == "connection_full",
        "expected connection_full, got {answer}"
    );
    // The agent opens another connection for the session; until that one is ready, the session is detached.
    ctx.sim
        .recorder()
        .wait_for(
            0,
            RECONNECT,
            "a connection after the full one",
            |_| false,
            |r| r.conn > full && r.what == What::Opened,
        )
        .await?;
    if let Some(poke) = &ctx.poke {
        // The agent has audio to play while it has no connection for the session.
        poke.send_audio(&call.id, &samples(16000, 7))
            .map_err(|e| anyhow::anyhow!("sending audio while detached failed: {e}"))?;
    }
    let (conn, resumed) = call.expect_resumed(RECONNECT).await?;
    ensure!(
        conn != full && conn != old.id,
        "resumed on connection {conn}"
    );
    ensure!(
        resumed["audio"]["stream"].is_u64(),
        "session.resumed has no stream: {resumed}"
    );
    let again = samples(16000, 2);
    call.send_audio(&again);
    call.expect_audio(&again).await?;
    let full = ctx.sim.conn(full);
    full.fence().await?;
    let misrouted = ctx.sim.recorder().since(0, |r| {
        r.conn == full.id && r.dir == Dir::FromAgent && matches!(r.what, What::Audio { .. })
    });
    ensure!(
        misrouted.is_empty(),
        "{} audio message(s) reached the full connection {} (first: {})",
        misrouted.len(),
        full.id,
        misrouted[0]
    );
    Ok(())
}

async fn resume_failed_loses_session(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    call.plan_tool("transfer", ToolPlan::Hold);
    call.say("transfer");
    call.expect_tool("transfer").await?;
    call.expire_resume();
    old.drop_abruptly();
    let (conn, answer) = call.expect_resume_answer(RECONNECT).await?;
    ensure!(
        answer["type"] == "error" && answer["error"]["code"] == "resume_failed",
        "expected resume_failed, got {answer}"
    );
    call.expect_nothing(Duration::from_millis(500)).await?;
    ensure!(
        call.state().is_some_and(|s| s.lost),
        "Sent does not count the session as lost"
    );
    // The agent itself goes on: a new call on the new connection is greeted.
    let new = ctx.sim.connection().await?;
    ensure!(new.id >= conn, "no connection after the refusal");
    let mut next = new.start_text();
    next.expect_say(GREETING).await?;
    Ok(())
}

async fn ended_while_detached(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    call.say("echo one");
    call.expect_say("one").await?;
    ctx.sim.plan(ConnPlan {
        ready_delay: Duration::from_millis(300),
        ..ConnPlan::default()
    });
    old.drop_abruptly();
    call.end("caller_hung_up");
    let (conn, resumed) = call.expect_resumed(RECONNECT).await?;
    ensure!(
        resumed.get("resume").is_none(),
        "an ended session got a next token"
    );
    ensure!(
        resumed.get("audio").is_none(),
        "an ended session got a stream"
    );
    let id = call.id.clone();
    let to_agent_here = |r: &crate::record::Record| {
        r.conn == conn && r.dir == Dir::ToAgent && r.session.as_deref() == Some(id.as_str())
    };
    ctx.sim
        .recorder()
        .wait_for(
            0,
            DEADLINE,
            "the replay's session.end",
            to_agent_here,
            |r| to_agent_here(r) && r.frame_type() == Some("session.end"),
        )
        .await?;
    call.expect_nothing(Duration::from_millis(300)).await?;
    let replay = ctx.sim.recorder().since(0, to_agent_here);
    ensure!(
        replay.last().and_then(|r| r.frame_type()) == Some("session.end"),
        "the replay does not end with session.end: {:?}",
        replay.iter().map(|r| r.to_string()).collect::<Vec<_>>()
    );
    Ok(())
}

async fn replay_gap_hangs_up(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    for n in 0..35 {
        call.say(&format!("echo n{n}"));
        call.expect_say(&format!("n{n}")).await?;
    }
    // Sent lost all but the first of the agent's 36 frames: more than the 32 the agent keeps.
    call.pretend_received(1);
    old.drop_abruptly();
    call.expect_resumed(RECONNECT).await?;
    call.expect_tool("hangup").await?;
    Ok(())
}

async fn unknown_frames_counted(ctx: &Ctx) -> Result<()> {
    let (conn, mut call) = greeted(ctx).await?;
    conn.send_raw(r#"{"type":"connection.note","note":"added in a later version"}"#);
    call.send_unknown("session.note");
    call.send_unknown("session.mood");
    call.say("echo x");
    call.expect_say("x").await?;
    conn.drop_abruptly();
    let (_, resume) = call.expect_resume(RECONNECT).await?;
    ensure!(
        resume["received"] == 3,
        "the agent read 2 unknown frames and 1 user.said, but its resume says received {}",
        resume["received"]
    );
    Ok(())
}

async fn invalid_frames_from_sent_ignored(ctx: &Ctx) -> Result<()> {
    let (conn, mut call) = greeted(ctx).await?;
    let id = &call.id;
    conn.send_raw("this is not JSON");
    conn.send_raw(&format!(
        r#"{{"type":"user.said","session_id":"{id}","text":""}}"#
    ));
    conn.send_raw(&format!(
        r#"{{"type":"user.said","session_id":"{id}","text":"echo bad","correction":"yes"}}"#
    ));
    conn.send_raw(r#"{"type":"ping","ts":1.5}"#);
    call.say("echo fine");
    call.expect_say("fine").await?;
    conn.drop_abruptly();
    let (_, resume) = call.expect_resume(RECONNECT).await?;
    ensure!(
        resume["received"] == 1,
        "only one valid counted frame was sent, but the resume says received {}",
        resume["received"]
    );
    Ok(())
}

async fn audio_after_end_not_delivered(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_audio(16000);
    let first = samples(16000, 3);
    call.send_audio(&first);
    call.expect_audio(&first).await?;
    for seed in 0..50 {
        call.send_audio(&samples(16000, seed));
    }
    call.end("caller_hung_up");
    // Everything the agent wrote before it read session.end arrives before the pong to this ping.
    let fence = conn.fence().await?;
    if let Some(poke) = &ctx.poke {
        poke.send_audio(&call.id, &samples(16000, 9))
            .map_err(|e| anyhow::anyhow!("send_audio after the end raised: {e}"))?;
    }
    conn.fence().await?;
    let late = ctx.sim.recorder().since(fence, |r| {
        r.dir == Dir::FromAgent && r.session.as_deref() == Some(call.id.as_str())
    });
    ensure!(
        late.is_empty(),
        "{} message(s) after the end, first: {}",
        late.len(),
        late[0]
    );
    Ok(())
}

async fn silent_sent_reconnects(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let interval = Duration::from_millis(ctx.sim.config().heartbeat_interval_ms);
    let muted = Instant::now();
    conn.mute();
    let how = conn.closed(interval * 3 + RECONNECT).await?;
    let after = muted.elapsed();
    ensure!(
        how.contains("agent"),
        "the silent connection was not closed by the agent: {how}"
    );
    ensure!(
        after >= interval * 2,
        "the agent gave up after {after:?}, before 3 heartbeat intervals of {interval:?}"
    );
    ctx.sim.connection_after(conn.id, RECONNECT).await?;
    Ok(())
}

async fn refused_agent_stops(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    ctx.sim.plan(ConnPlan {
        refuse: Some(401),
        ..ConnPlan::default()
    });
    let before = ctx.sim.attempts();
    conn.drop_abruptly();
    ctx.sim
        .recorder()
        .wait_for(
            0,
            RECONNECT,
            "the refused reconnect",
            |_| false,
            |r| matches!(r.what, What::Refused { status: 401 }),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let attempts = ctx.sim.attempts() - before;
    ensure!(
        attempts == 1,
        "the agent tried {attempts} times after a 401"
    );
    Ok(())
}
