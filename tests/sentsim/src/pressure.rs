//! Sent under timing pressure and at its limits: scenarios where Sent writes frames back to back, closes
//! connections right after `connection.ready`, repeats or misdirects frames, makes mistakes in its counts,
//! refuses tool calls, stops reading its socket, is unreachable for longer than a call's resume window,
//! or sends more than any message should carry. Each guards one defect a host can have (issue 9 lists the
//! ones voicehost had) and is checked from Sent's side of the wire only, with counts, never timings.
//!
//! Unlike the conformance suite, each scenario runs on an agent of its own, started for it (on a simulator
//! from [`sim_config`]): some leave the agent backing off or its connections in a state the next one should
//! not inherit. What a scenario needs beyond the conformance agent is in its [`Needs`].

use crate::record::{Dir, Record, What};
use crate::scenarios::{samples, AgentKind, HostSettings, Needs, GREETING};
use crate::sim::{
    Call, CloseAfterReady, ConnHandle, ConnPlan, SessionSpec, SimConfig, ToolPlan,
    CONFORMANCE_AGENT, DEADLINE,
};
use crate::suite::Ctx;
use anyhow::{bail, ensure, Context as _, Result};
use serde_json::{json, Value};
use std::time::Duration;

/// voicehost's conformance component (it traps on "panic"), with tool calls that time out after 300 ms.
const SHORT_TOOL_TIMEOUT: Needs = Needs {
    agent: AgentKind::VoicehostConformance,
    host: HostSettings {
        tool_timeout_ms: Some(300),
        ..HostSettings::DEFAULT
    },
    ..Needs::CONFORMANCE
};

/// The number the failure policy transfers to in `failed_policy_transfer_hangs_up`.
pub const POLICY_NUMBER: &str = "+14155550100";

/// voicehost's conformance component (it traps on "panic"), whose failure policy is a transfer.
const TRANSFER_POLICY: Needs = Needs {
    agent: AgentKind::VoicehostConformance,
    host: HostSettings {
        transfer_to: Some(("number", POLICY_NUMBER)),
        ..HostSettings::DEFAULT
    },
    ..Needs::CONFORMANCE
};

/// The agent holds several connections at once.
const CYCLED: Needs = Needs {
    host: HostSettings {
        connections: CYCLED_CONNECTIONS,
        ..HostSettings::DEFAULT
    },
    ..Needs::CONFORMANCE
};

/// Sent keeps a detached call for a resume for 2 s only.
const SHORT_WINDOW: Needs = Needs {
    window_ms: Some(2000),
    ..Needs::CONFORMANCE
};

/// voicehost's prober guest (`tests/programs/guests/prober`).
const PROBER: Needs = Needs {
    agent: AgentKind::Prober,
    ..Needs::CONFORMANCE
};

scenarios! {
    starts_behind_ready_not_dropped [CYCLED]: "session.starts written in the same write as connection.ready are never dropped: each is greeted, connection after connection",
    close_right_after_ready_keeps_dialling [CYCLED]: "a connection that Sent closes right after connection.ready is replaced; the agent keeps dialling and serves calls once Sent behaves",
    flapping_connection_backs_off: "while a healthy draining connection stays open, a replacement that keeps closing right after connection.ready is redialled with growing delays, not at once",
    duplicate_session_start_ignored: "a second session.start for a live session is ignored: one greeting, and the call goes on",
    wrong_direction_frames_not_counted: "frames only an agent sends (agent.say, tool.call, agent.clear, session.resume, pong) are dropped when Sent sends them, and not counted",
    huge_received_does_not_wrap: "session.resumed with received i64::MAX (Sent's mistake) replays nothing and wraps nothing: a later replay gap still gets a hangup",
    unknown_tool_result_ignored: "a tool.result for a call_ref the agent never issued reaches nobody",
    repeated_tool_result_reaches_nobody [VOICEHOST]: "a tool.result sent again for a tool call already answered reaches nobody: the agent's handler hears each answer once",
    refused_tool_call_answered: "an error refusing a tool.call answers the waiting tool at once (\"Tool failed: <code>\"); the refused call, read on the call's own connection, counts on both sides and is not sent again",
    timed_out_tools_leave_nothing_behind [SHORT_TOOL_TIMEOUT]: "tool calls Sent never answers time out and leave nothing behind: after 17 a new tool call still goes out, and three traps still get the failure policy's hangup",
    failed_policy_transfer_hangs_up [TRANSFER_POLICY]: "when Sent fails the failure policy's transfer, a hangup follows",
    audio_of_an_ended_call_not_written: "audio still queued for a call when the agent reads its session.end is dropped: little of it reaches the caller who gets its stream number next",
    resumed_without_stream_sends_no_audio [PROBER]: "a live audio call resumed without audio in session.resumed sends no audio on the new connection, where its old stream number is another caller's",
    unreachable_sent_loses_call_after_window [SHORT_WINDOW]: "a detached call is lost when its resume window passes while Sent refuses every handshake: it is never resumed afterwards",
    extra_connections_retired: "a connection opened after connection_full is closed once idle while more connections than asked for are open",
    oversized_message_closes_the_connection: "a message over 256 KiB from Sent closes the connection with 1009 (one under does not); the call resumes on a new connection",
    overlong_session_id_dropped: "a session.start whose session_id is longer than 128 characters is dropped (128 is fine); the next call is greeted",
    unread_frames_refused_over_limit [PROBER]: "while Sent does not read, the agent's unwritten frames per call are bounded: far fewer of a burst of utterances arrive than the guest said",
    flooded_call_gets_failure_policy: "a call whose agent cannot keep up with Sent's frames (1000 utterances while its handler waits on a tool) gets the failure policy's hangup",
    oversized_audio_is_cut [PROBER]: "one send-audio of 1 s reaches Sent as messages of at most 200 ms, all of it, in order",
    audio_flood_bounded [PROBER]: "a guest flooding send-audio while Sent does not read gets little of it through, and a neighbour call's echo on the same connection still works",
    speech_during_a_resume_is_held [PROBER]: "what the agent says while its resume is unanswered (the prober speaks a second after it heard the caller, whose connection dropped at once) is held, and sent once after session.resumed on the new connection",
    slow_reader_hears_all_speech [PROBER]: "while Sent reads everything, only slowly, a burst of speech past the bound on unwritten frames waits instead of being refused: every utterance arrives, once, in order",
    frames_lost_unwritten_stay_replayable [PROBER]: "frames still unwritten when their connection drops count as held, so the guest cannot say enough while detached to push them out of the 32 kept: the resume replays them all, with no hangup",
    full_resume_keeps_the_drained_call [VOICEHOST]: "a call whose move off a draining connection is refused with connection_full is not lost while that connection is still open: it is served there until it can move",
    unsendable_policy_transfer_hangs_up [UNSENDABLE_POLICY]: "a failure policy whose transfer the codec cannot send (a number without its +) still ends the call: Sent sees a hangup",
    late_resumed_is_not_left_silent [VOICEHOST]: "a session.resumed that comes after the host stopped waiting for it (12 s) leaves no caller unserved: the caller is answered, or the agent hangs up",
    resumed_on_a_draining_connection_moves_on [VOICEHOST]: "a call resumed on a connection that began draining while its resume was out moves on to another connection by itself, with nothing more from Sent",
    given_up_guest_stays_silent [PROBER]: "once the host has sent the failure policy's hangup for a call, its guest's handler says and calls nothing more for it, even when its waiting tool is answered",
}

/// voicehost's conformance component, for scenarios that check voicehost's own timers and choices (the
/// official SDK has none of them).
const VOICEHOST: Needs = Needs {
    agent: AgentKind::VoicehostConformance,
    ..Needs::CONFORMANCE
};

/// A number without its leading `+`: the protocol's codec refuses it as a transfer's `to`.
pub const UNSENDABLE_NUMBER: &str = "14155550100";

/// voicehost's conformance component, whose failure policy transfers to a party the codec refuses.
const UNSENDABLE_POLICY: Needs = Needs {
    agent: AgentKind::VoicehostConformance,
    host: HostSettings {
        transfer_to: Some(("number", UNSENDABLE_NUMBER)),
        ..HostSettings::DEFAULT
    },
    ..Needs::CONFORMANCE
};

/// The simulator a pressure scenario runs on: heartbeats every second (the protocol's minimum), small
/// socket buffers so that what piles up while Sent does not read stays small, and the scenario's window.
pub fn sim_config(needs: &Needs) -> SimConfig {
    let defaults = SimConfig::default();
    SimConfig {
        heartbeat_interval_ms: 1000,
        window_ms: needs.window_ms.unwrap_or(defaults.window_ms),
        recv_buffer_bytes: Some(4096),
        max_segment_bytes: Some(1200),
        ..defaults
    }
}

/// What the prober guest says first in a text call.
pub const PROBER_GREETING: &str = "Hello from the prober.";

/// The longest session id the host takes (voicehost's intake: Sent's ids are a prefix and a UUID).
pub const MAX_ID_CHARS: usize = 128;

/// Waits for a reconnect: a few rounds of backoff (1, 2, 4 s) at most.
const RECONNECT: Duration = Duration::from_secs(20);

// ----- helpers -----

/// A text session on the current connection, past its greeting.
async fn greeted(ctx: &Ctx) -> Result<(ConnHandle, Call)> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(GREETING).await?;
    Ok((conn, call))
}

/// A text session with no resume token: it can never leave its connection.
fn unmovable_text() -> SessionSpec {
    SessionSpec {
        resumable: false,
        ..SessionSpec::text()
    }
}

/// A 16 kHz audio session whose prober command (its `context`) is `command`.
fn prober(command: &str) -> SessionSpec {
    let mut context = serde_json::Map::new();
    context.insert("prober".into(), Value::String(command.into()));
    SessionSpec {
        context: Some(context),
        ..SessionSpec::audio(16000)
    }
}

/// The prober's pattern for a session: the bytes of `"<session_id>;"`, repeated.
fn pattern(session_id: &str, bytes: usize) -> Vec<u8> {
    format!("{session_id};")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(bytes)
        .collect()
}

/// Whether `record` is audio from the agent whose samples start with the prober's pattern of `session_id`.
fn prober_audio_of(record: &Record, session_id: &str) -> bool {
    let unit = format!("{session_id};");
    record.dir == Dir::FromAgent
        && matches!(&record.what, What::Audio { samples, .. } if samples.starts_with(unit.as_bytes()))
}

fn says(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["type"] == "agent.say")
        .map(|f| f["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Waits until nothing matching `matches` has arrived for `quiet` (at most `within` in all); returns how
/// many matching records there are from `from` on.
async fn settled(
    ctx: &Ctx,
    from: usize,
    quiet: Duration,
    within: Duration,
    matches: impl Fn(&Record) -> bool,
) -> Result<usize> {
    let recorder = ctx.sim.recorder();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = recorder.since(from, &matches).len();
        let last = recorder.len();
        let more = recorder
            .wait_for(last, quiet, "more", |_| false, &matches)
            .await;
        if more.is_err() {
            return Ok(seen);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("still arriving after {within:?}: {seen} so far");
        }
    }
}

// ----- connections -----

/// Connections the agent holds in the scenarios that cycle them: several reconnect at once, so the
/// agent's first frames of each race with its other connections' events.
pub const CYCLED_CONNECTIONS: usize = 8;

/// The connections open now that became ready after connection `after`, once there are `count` of them.
async fn ready_after(
    ctx: &Ctx,
    after: u32,
    count: usize,
    within: Duration,
) -> Result<Vec<ConnHandle>> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let ready: Vec<u32> = ctx
            .sim
            .recorder()
            .since(0, |r| {
                r.conn > after && r.is_frame(Dir::ToAgent, "connection.ready")
            })
            .iter()
            .map(|r| r.conn)
            .collect();
        let open: Vec<ConnHandle> = ctx
            .sim
            .open_connections(None)
            .into_iter()
            .filter(|c| ready.contains(&c.id))
            .collect();
        if open.len() >= count {
            return Ok(open);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "waited {within:?} for {count} connections after connection {after}: {} came back ({:?})",
                open.len(),
                open.iter().map(|c| c.id).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a ping on each connection and waits for its pong (the agent then counts it good: its backoff
/// starts over), then drops them all at once; returns the newest id.
async fn drop_all(conns: &[ConnHandle]) -> Result<u32> {
    for conn in conns {
        conn.fence().await?;
    }
    for conn in conns {
        conn.drop_abruptly();
    }
    Ok(conns.iter().map(|c| c.id).max().unwrap_or(0))
}

async fn starts_behind_ready_not_dropped(ctx: &Ctx) -> Result<()> {
    // Each round the agent reconnects all its connections at once, and the first bytes of each new one
    // are connection.ready and two session.starts, which the agent reads together: a host that registers
    // a connection after reading its first frames drops some.
    const ROUNDS: usize = 25;
    let mut conns = ready_after(ctx, 0, CYCLED_CONNECTIONS, RECONNECT).await?;
    for round in 1..=ROUNDS {
        for _ in 0..CYCLED_CONNECTIONS {
            ctx.sim.plan(ConnPlan {
                one_write: true,
                prestart: vec![unmovable_text(), unmovable_text()],
                ..ConnPlan::default()
            });
        }
        let after = drop_all(&conns).await?;
        conns = ready_after(ctx, after, CYCLED_CONNECTIONS, RECONNECT)
            .await
            .with_context(|| format!("round {round}"))?;
        for conn in &conns {
            let calls = conn.started();
            ensure!(
                calls.len() == 2,
                "round {round}: {} sessions started on connection {}",
                calls.len(),
                conn.id
            );
            for mut call in calls {
                call.expect_say(GREETING).await.with_context(|| {
                    format!(
                        "round {round}: connection {}, written with its connection.ready",
                        conn.id
                    )
                })?;
                call.end("caller_hung_up");
            }
        }
    }
    Ok(())
}

async fn close_right_after_ready_keeps_dialling(ctx: &Ctx) -> Result<()> {
    const ROUNDS: usize = 6;
    let mut conns = ready_after(ctx, 0, CYCLED_CONNECTIONS, RECONNECT).await?;
    for round in 1..=ROUNDS {
        // Each replacement gets connection.ready and the end of the connection in the same write, with a
        // close frame or without one; the replacements of those are left alone.
        for n in 0..CYCLED_CONNECTIONS {
            let close = if n % 2 == 0 {
                CloseAfterReady::Close(1001)
            } else {
                CloseAfterReady::Abrupt
            };
            ctx.sim.plan(ConnPlan {
                one_write: true,
                close_after_ready: Some(close),
                ..ConnPlan::default()
            });
        }
        let after = drop_all(&conns).await?;
        conns = ready_after(ctx, after, CYCLED_CONNECTIONS, RECONNECT)
            .await
            .with_context(|| {
                format!("round {round}: after connections that closed right after connection.ready")
            })?;
        for conn in &conns {
            conn.fence().await?;
            let mut call = conn.start_text();
            call.expect_say(GREETING)
                .await
                .with_context(|| format!("round {round}: connection {}", conn.id))?;
            call.end("caller_hung_up");
        }
    }
    Ok(())
}

async fn flapping_connection_backs_off(ctx: &Ctx) -> Result<()> {
    const WATCH: Duration = Duration::from_secs(6);
    let conn = ctx.sim.connection().await?;
    // A call that cannot move keeps the draining connection open, and Sent keeps pinging it.
    let mut call = conn.start(unmovable_text());
    call.expect_say(GREETING).await?;
    for _ in 0..40 {
        ctx.sim.plan(ConnPlan {
            one_write: true,
            close_after_ready: Some(CloseAfterReady::Close(1001)),
            ..ConnPlan::default()
        });
    }
    let before = ctx.sim.attempts();
    conn.drain();
    tokio::time::sleep(WATCH).await;
    let attempts = ctx.sim.attempts() - before;
    tracing::info!(attempts, "dials while the replacements flapped");
    // The schedule from the drain: 0 s, then 1, 2, 4 s (each ±25%): 3 or 4 attempts in 6 s.
    ensure!(
        attempts >= 2,
        "the agent dialled {attempts} time(s) in {WATCH:?}: it stopped dialling"
    );
    ensure!(
        attempts <= 5,
        "the agent dialled {attempts} times in {WATCH:?} while each new connection closed right after connection.ready and the draining one was pinged: no backoff (0, 1, 2, 4 s allow at most 5)"
    );
    call.say("echo still here");
    call.expect_say("still here").await?;
    Ok(())
}

async fn extra_connections_retired(ctx: &Ctx) -> Result<()> {
    const WITHIN: Duration = Duration::from_secs(25);
    let old = ctx.sim.connection().await?;
    let mut moving = old.start_text();
    moving.expect_say(GREETING).await?;
    // The drained connection's replacement is full at once: the call needs an extra connection.
    ctx.sim.plan(ConnPlan {
        max_sessions: Some(1),
        prestart: vec![SessionSpec::text()],
        ..ConnPlan::default()
    });
    old.drain();
    let (full, answer) = moving.expect_resume_answer(RECONNECT).await?;
    ensure!(
        answer["type"] == "error" && answer["error"]["code"] == "connection_full",
        "expected connection_full, got {answer}"
    );
    let (extra, _) = moving.expect_resumed(RECONNECT).await?;
    ensure!(extra != full, "resumed on the full connection");
    let full = ctx.sim.conn(full);
    let mut staying = full
        .started()
        .into_iter()
        .next()
        .context("no session on the full connection")?;
    staying.expect_say(GREETING).await?;
    // The call on the extra connection ends: one connection was asked for, two are open, one is idle.
    moving.end("caller_hung_up");
    let agent = Some(CONFORMANCE_AGENT);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while ctx.sim.open_connections(agent).len() > 1 {
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{} connections still open {WITHIN:?} after the call on the extra connection {extra} ended (one asked for)",
                ctx.sim.open_connections(agent).len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        full.is_open(),
        "the agent closed connection {}, which carries a call, and kept the idle one",
        full.id
    );
    let how = ctx.sim.conn(extra).closed(DEADLINE).await?;
    ensure!(
        how == "closed by the agent with 1000",
        "the extra connection ended: {how}"
    );
    staying.say("echo still here");
    staying.expect_say("still here").await?;
    Ok(())
}

async fn unreachable_sent_loses_call_after_window(ctx: &Ctx) -> Result<()> {
    let window = Duration::from_millis(ctx.sim.config().window_ms);
    let (old, call) = greeted(ctx).await?;
    old.fence().await?;
    ctx.sim.refuse_all(Some(503));
    let from = ctx.sim.recorder().len();
    old.drop_abruptly();
    tokio::time::sleep(window + Duration::from_secs(3)).await;
    let refused = ctx
        .sim
        .recorder()
        .since(from, |r| matches!(r.what, What::Refused { status: 503 }));
    ensure!(
        !refused.is_empty(),
        "the agent did not try to connect while Sent refused every handshake"
    );
    ctx.sim.refuse_all(None);
    let next = ctx
        .sim
        .connection_after(old.id, Duration::from_secs(40))
        .await?;
    next.fence().await?;
    // A carried call is resumed first thing on a new connection: by now it would have been.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resumes = ctx.sim.recorder().since(from, |r| {
        r.session.as_deref() == Some(call.id.as_str())
            && r.is_frame(Dir::FromAgent, "session.resume")
    });
    if let Some(resume) = resumes.first() {
        bail!(
            "the agent resumed {} after its window of {window:?} had passed while Sent was unreachable: {resume}",
            call.id
        );
    }
    let mut fresh = next.start_text();
    fresh.expect_say(GREETING).await?;
    Ok(())
}

// ----- Sent's mistakes -----

async fn duplicate_session_start_ignored(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.start_again();
    call.expect_nothing(Duration::from_millis(500)).await?;
    call.say("echo once");
    call.expect_say("once").await?;
    call.expect_nothing(Duration::from_millis(300)).await?;
    let said = says(&call.accepted_frames());
    ensure!(said == [GREETING, "once"], "the agent said {said:?}");
    Ok(())
}

async fn wrong_direction_frames_not_counted(ctx: &Ctx) -> Result<()> {
    let (conn, mut call) = greeted(ctx).await?;
    let id = &call.id;
    for text in [
        format!(r#"{{"type":"agent.say","session_id":"{id}","text":"echo from Sent"}}"#),
        format!(r#"{{"type":"tool.call","session_id":"{id}","call_ref":"s1","name":"hangup"}}"#),
        format!(r#"{{"type":"agent.clear","session_id":"{id}"}}"#),
        format!(
            r#"{{"type":"session.resume","session_id":"{id}","token":"vsr_0000000000000000000000000000","received":0}}"#
        ),
        r#"{"type":"pong","ts":1}"#.to_string(),
    ] {
        conn.send_raw(&text);
    }
    call.say("echo x");
    call.expect_say("x").await?;
    conn.drop_abruptly();
    let (_, resume) = call.expect_resume(RECONNECT).await?;
    ensure!(
        resume["received"] == 1,
        "Sent sent one counted frame of its own (and five of the agent's types), but the resume says received {}",
        resume["received"]
    );
    call.expect_resumed(DEADLINE).await?;
    call.expect_nothing(Duration::from_millis(300)).await?;
    Ok(())
}

async fn huge_received_does_not_wrap(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    call.say("echo one");
    call.expect_say("one").await?;
    old.fence().await?;
    call.pretend_received(i64::MAX as u64);
    old.drop_abruptly();
    call.expect_resumed(RECONNECT).await?;
    // Sent claims more than the agent ever sent: there is nothing to send again.
    call.expect_nothing(Duration::from_millis(500)).await?;
    // The call goes on past the 32 frames the agent keeps...
    for n in 0..35 {
        call.say(&format!("echo n{n}"));
        call.expect_say(&format!("n{n}")).await?;
    }
    // ...and when Sent needs frames the agent no longer keeps, it hangs up.
    let conn = call
        .state()
        .and_then(|s| s.conn)
        .context("the call has no connection")?;
    let conn = ctx.sim.conn(conn);
    conn.fence().await?;
    call.pretend_received(1);
    conn.drop_abruptly();
    call.expect_resumed(RECONNECT).await?;
    call.expect_tool("hangup").await?;
    Ok(())
}

async fn unknown_tool_result_ignored(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.answer("t77", "send_dtmf", Some("no_such_call"));
    call.expect_nothing(Duration::from_millis(500)).await?;
    call.say("echo after");
    call.expect_say("after").await?;
    Ok(())
}

async fn repeated_tool_result_reaches_nobody(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.plan_tool("send_dtmf", ToolPlan::Fail("dtmf_failed".into()));
    call.say("dtmf 1");
    let tool = call.expect_tool("send_dtmf").await?;
    let call_ref = tool["call_ref"].as_str().unwrap_or_default().to_string();
    // The conformance agent says "Tool failed: <code>" for each failed answer it hears.
    call.expect_say("Tool failed: dtmf_failed").await?;
    for _ in 0..3 {
        call.answer(&call_ref, "send_dtmf", Some("dtmf_failed"));
    }
    call.expect_nothing(Duration::from_millis(500)).await?;
    call.say("echo after");
    call.expect_say("after").await?;
    let said = says(&call.accepted_frames());
    ensure!(
        said == [GREETING, "Tool failed: dtmf_failed", "after"],
        "the agent said {said:?}"
    );
    Ok(())
}

async fn refused_tool_call_answered(ctx: &Ctx) -> Result<()> {
    let (conn, mut call) = greeted(ctx).await?;
    call.plan_tool("send_dtmf", ToolPlan::Refuse("tool_not_allowed".into()));
    call.say("dtmf 1");
    call.expect_tool("send_dtmf").await?;
    // Within the scenario's deadline (5 s), not after the tool's timeout.
    call.expect_say("Tool failed: tool_not_allowed").await?;
    // Sent read the refused tool.call on the call's connection: it counts on both sides, so a resume sends
    // nothing again.
    conn.fence().await?;
    conn.drop_abruptly();
    call.expect_resumed(RECONNECT).await?;
    call.expect_nothing(Duration::from_millis(500)).await?;
    call.say("echo after");
    call.expect_say("after").await?;
    let said = says(&call.accepted_frames());
    ensure!(
        said == [GREETING, "Tool failed: tool_not_allowed", "after"],
        "the agent said {said:?}"
    );
    Ok(())
}

async fn overlong_session_id_dropped(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let longest = format!("vs_{}", "a".repeat(MAX_ID_CHARS - 3));
    let mut fits = conn.start_with_id(SessionSpec::text(), &longest);
    fits.expect_say(GREETING)
        .await
        .context("a session id of 128 characters")?;
    let overlong = format!("vs_{}", "b".repeat(MAX_ID_CHARS - 2));
    let mut dropped = conn.start_with_id(SessionSpec::text(), &overlong);
    dropped
        .expect_nothing(Duration::from_millis(500))
        .await
        .context("a session id of 129 characters")?;
    let mut next = conn.start_text();
    next.expect_say(GREETING).await?;
    Ok(())
}

async fn oversized_message_closes_the_connection(ctx: &Ctx) -> Result<()> {
    let (old, mut call) = greeted(ctx).await?;
    // Under the limit: read (and ignored, a connection frame of an unknown type).
    old.send_raw_sized(200 << 10);
    old.fence().await?;
    ensure!(old.is_open(), "a message of 200 KiB closed the connection");
    old.send_raw_sized((256 << 10) + 1024);
    let how = old.closed(DEADLINE).await?;
    ensure!(
        how == "closed by the agent with 1009",
        "after a message of 257 KiB the connection {how}"
    );
    call.expect_resumed(RECONNECT).await?;
    call.say("echo after");
    call.expect_say("after").await?;
    Ok(())
}

// ----- bounds -----

async fn timed_out_tools_leave_nothing_behind(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.plan_tool("hold", ToolPlan::Hold);
    // One at a time: each waits for its answer until its timeout (300 ms), then the next utterance runs.
    for n in 1..=17 {
        call.say("hold");
        call.expect_tool("hold")
            .await
            .with_context(|| format!("tool call {n}, after {} timed out", n - 1))?;
    }
    call.say("dtmf 1");
    call.expect_tool("send_dtmf")
        .await
        .context("a new tool call after 17 timed out")?;
    // The failure policy's own tool call is not blocked by what timed out either.
    for _ in 0..3 {
        call.say("panic");
    }
    call.expect_tool("hangup")
        .await
        .context("the failure policy after three traps")?;
    Ok(())
}

async fn failed_policy_transfer_hangs_up(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.plan_tool("transfer", ToolPlan::Fail("transfer_failed".into()));
    for _ in 0..3 {
        call.say("panic");
    }
    let transfer = call.expect_tool("transfer").await?;
    ensure!(
        transfer["arguments"] == json!({"to": {"kind": "number", "value": POLICY_NUMBER}}),
        "the failure policy's transfer: {}",
        transfer["arguments"]
    );
    call.expect_tool("hangup")
        .await
        .context("after the failure policy's transfer failed")?;
    let ended = call.state().and_then(|s| s.ended);
    ensure!(
        ended.as_deref() == Some("agent_hung_up"),
        "the call did not end as agent_hung_up: {ended:?}"
    );
    Ok(())
}

async fn flooded_call_gets_failure_policy(ctx: &Ctx) -> Result<()> {
    let (_conn, mut call) = greeted(ctx).await?;
    call.plan_tool("hold", ToolPlan::Hold);
    call.say("hold");
    call.expect_tool("hold").await?;
    // The handler waits for the hold's answer; Sent talks on.
    for n in 0..1000 {
        call.say(&format!("echo n{n}"));
    }
    call.expect_tool("hangup")
        .await
        .context("1000 utterances queued behind a handler that waits")?;
    Ok(())
}

/// Frames of 20 ms Sent sends call A in `audio_of_an_ended_call_not_written`, while it does not read.
const ENDED_CALL_FRAMES: usize = 2000;
/// The most of A's echoes that may reach the caller who gets A's stream next: what the agent's socket
/// and Sent's buffer hold while Sent does not read (a fresh connection with small segments: 160-180
/// frames of 642 bytes measured here), plus the call's audio backlog (1 s, 50 frames) and a batch being
/// written (64 frames). A host that writes what it queued for an ended call sends all its echoes (about
/// 1200-1400 of the 2000 here).
const ENDED_CALL_MOST: usize = 500;

async fn audio_of_an_ended_call_not_written(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    conn.reuse_ended_streams();
    let mut first = conn.start_audio(16000);
    let hello = samples(16000, 1);
    first.send_audio(&hello);
    first.expect_audio(&hello).await?;
    let stream = first.state().and_then(|s| s.stream);
    let mark = samples(16000, 0x5a5a);
    conn.pause_reading();
    // 2000 frames in a second, so that the agent echoes most of them; what the socket does not take
    // queues.
    for _ in 0..ENDED_CALL_FRAMES / 100 {
        for _ in 0..100 {
            first.send_audio(&mark);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.end("caller_hung_up");
    let from = ctx.sim.recorder().len();
    let second = conn.start_audio(16000);
    ensure!(
        second.state().and_then(|s| s.stream) == stream,
        "the next call did not get the ended call's stream {stream:?}"
    );
    conn.resume_reading();
    let late = settled(
        ctx,
        from,
        Duration::from_secs(1),
        Duration::from_secs(20),
        |r| {
            r.dir == Dir::FromAgent
                && matches!(&r.what, What::Audio { samples, .. } if *samples == mark)
        },
    )
    .await?;
    let echoed = ctx.sim.recorder().since(0, |r| {
        r.dir == Dir::FromAgent
            && matches!(&r.what, What::Audio { samples, .. } if *samples == mark)
    });
    tracing::info!(late, echoed = echoed.len(), "audio of the ended call");
    ensure!(
        late <= ENDED_CALL_MOST,
        "{late} of the ended call's {ENDED_CALL_FRAMES} frames reached Sent after it ended, under the stream of the call {} that has it now (at most {ENDED_CALL_MOST}: what the sockets hold)",
        second.id
    );
    Ok(())
}

async fn resumed_without_stream_sends_no_audio(ctx: &Ctx) -> Result<()> {
    let old = ctx.sim.connection().await?;
    let moving = old.start(prober("echo"));
    let old_stream = moving.state().and_then(|s| s.stream);
    // The prober answers an unknown session frame with 20 ms of its own pattern.
    moving.send_unknown("session.note");
    let id = moving.id.clone();
    ctx.sim
        .recorder()
        .wait_for(
            0,
            DEADLINE,
            "the prober's own audio",
            |_| false,
            |r| prober_audio_of(r, &id) && r.session.as_deref() == Some(id.as_str()),
        )
        .await?;
    // The next connection starts another caller first, who gets stream 1 there, and resumes the moving
    // call without a stream.
    ctx.sim.plan(ConnPlan {
        prestart: vec![prober("echo")],
        resume_without_audio: true,
        ..ConnPlan::default()
    });
    old.fence().await?;
    old.drop_abruptly();
    let (conn, resumed) = moving.expect_resumed(RECONNECT).await?;
    ensure!(
        resumed.get("audio").is_none(),
        "session.resumed has audio: {resumed}"
    );
    let new = ctx.sim.conn(conn);
    let other = new
        .started()
        .into_iter()
        .next()
        .context("no caller on the new connection")?;
    ensure!(
        other.state().and_then(|s| s.stream) == old_stream,
        "the other caller does not have the moving call's old stream {old_stream:?}"
    );
    let from = ctx.sim.recorder().len();
    moving.send_unknown("session.note");
    other.send_unknown("session.note");
    let other_id = other.id.clone();
    ctx.sim
        .recorder()
        .wait_for(
            from,
            DEADLINE,
            "the other caller's own audio",
            |_| false,
            |r| prober_audio_of(r, &other_id),
        )
        .await?;
    // The moving call's guest sent audio too: none of it may reach the new connection.
    let misplaced = ctx
        .sim
        .recorder()
        .wait_for(
            from,
            Duration::from_secs(2),
            "the moving call's audio",
            |_| false,
            |r| prober_audio_of(r, &id),
        )
        .await;
    if let Ok(record) = misplaced {
        bail!(
            "the call resumed without a stream sent audio on connection {conn}, where its old stream belongs to {other_id}: {record}"
        );
    }
    Ok(())
}

/// The prober says `BURST` utterances of `BURST_CHARS` characters at once, `BURSTS` times, in
/// `unread_frames_refused_over_limit` (small enough that each handler stays well within its CPU time).
const BURSTS: usize = 3;
const BURST: usize = 200;
const BURST_CHARS: usize = 4000;
/// The most of them that may arrive: what the sockets hold while Sent does not read, a WebSocket write
/// buffer and a batch being written (about 64 of these measured here), and the 32 frames a call may have
/// waiting. A host without the bound sends all 600.
const BURST_MOST: usize = 250;

async fn unread_frames_refused_over_limit(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(PROBER_GREETING).await?;
    conn.pause_reading();
    for _ in 0..BURSTS {
        call.say(&format!("say {BURST} {BURST_CHARS}"));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    conn.resume_reading();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // A call's frames stay in order: once this answer is in, everything said before it is.
    call.say("echo done");
    let id = call.id.clone();
    ctx.sim
        .recorder()
        .wait_for(
            0,
            Duration::from_secs(20),
            "the answer to \"echo done\"",
            |_| false,
            |r| {
                r.session.as_deref() == Some(id.as_str())
                    && r.is_frame(Dir::FromAgent, "agent.say")
                    && r.json().is_some_and(|j| j["text"] == "done")
            },
        )
        .await?;
    let burst = says(&call.accepted_frames())
        .iter()
        .filter(|text| text.len() == BURST_CHARS)
        .count();
    tracing::info!(burst, "utterances of the burst that arrived");
    ensure!(
        burst <= BURST_MOST,
        "{burst} of the {} utterances the guest said while Sent did not read arrived (at most {BURST_MOST}: what the sockets hold and 32 waiting)",
        BURSTS * BURST
    );
    ensure!(burst > 0, "none of the burst arrived");
    Ok(())
}

async fn oversized_audio_is_cut(ctx: &Ctx) -> Result<()> {
    const MOST: usize = 6400; // 200 ms at 16 kHz
    const WHOLE: usize = 32000; // 1 s at 16 kHz
    let conn = ctx.sim.connection().await?;
    let call = conn.start(prober("big 1000"));
    call.send_audio(&samples(16000, 1));
    let id = call.id.clone();
    let mine = |r: &Record| {
        r.dir == Dir::FromAgent
            && r.session.as_deref() == Some(id.as_str())
            && matches!(r.what, What::Audio { .. })
    };
    ctx.sim
        .recorder()
        .wait_for(0, DEADLINE, "the prober's audio", |_| false, mine)
        .await?;
    settled(
        ctx,
        0,
        Duration::from_secs(1),
        Duration::from_secs(20),
        mine,
    )
    .await?;
    let messages: Vec<Vec<u8>> = ctx
        .sim
        .recorder()
        .since(0, mine)
        .iter()
        .filter_map(|r| match &r.what {
            What::Audio { samples, .. } => Some(samples.clone()),
            _ => None,
        })
        .collect();
    if let Some(big) = messages.iter().find(|m| m.len() > MOST) {
        bail!(
            "a message of {} bytes of samples ({} ms at 16 kHz): more than 200 ms",
            big.len(),
            big.len() / 32
        );
    }
    let all: Vec<u8> = messages.concat();
    let whole = pattern(&id, WHOLE);
    if all != whole {
        let missing = if whole.ends_with(&all) {
            format!(": its first {} bytes are missing", WHOLE - all.len())
        } else {
            String::new()
        };
        bail!(
            "{} messages ({} bytes of samples) arrived, not the 1 s ({WHOLE} bytes) the guest sent in one send-audio{missing}",
            messages.len(),
            all.len()
        );
    }
    Ok(())
}

/// `flood N`: per frame from Sent, the prober sends N frames of 20 ms; Sent sends it `FLOOD_FRAMES`
/// (small enough that each handler stays well within its CPU time).
const FLOOD: usize = 500;
const FLOOD_FRAMES: usize = 10;
/// The most of the flood that may arrive ahead of the neighbour's echo once Sent reads again: what the
/// sockets hold while Sent does not read (about 200 frames measured here), a batch being written, and the
/// flooding call's audio backlog (1 s, 50 frames). A host without a bound queues the neighbour's echo
/// behind all 5,000.
const FLOOD_MOST: usize = 1000;

async fn audio_flood_bounded(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let flood = conn.start(prober(&format!("flood {FLOOD}")));
    let mut neighbour = conn.start(prober("echo"));
    let before = samples(16000, 5);
    neighbour.send_audio(&before);
    neighbour.expect_audio(&before).await?;
    conn.pause_reading();
    for seed in 0..FLOOD_FRAMES {
        flood.send_audio(&samples(16000, 100 + seed as u16));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    conn.resume_reading();
    let after = samples(16000, 6);
    neighbour.send_audio(&after);
    neighbour
        .expect_audio(&after)
        .await
        .context("the neighbour's echo after the flood")?;
    let id = flood.id.clone();
    let neighbour_id = neighbour.id.clone();
    // Where the neighbour's echo came: everything of the flood's ahead of it was queued with it.
    let echo = ctx
        .sim
        .recorder()
        .since(0, |r| {
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(neighbour_id.as_str())
                && matches!(&r.what, What::Audio { samples, .. } if *samples == after)
        })
        .first()
        .map_or(usize::MAX, |r| r.seq);
    let ahead = ctx
        .sim
        .recorder()
        .since(0, |r| r.seq < echo && prober_audio_of(r, &id))
        .len();
    let arrived = settled(
        ctx,
        0,
        Duration::from_secs(1),
        Duration::from_secs(30),
        |r| prober_audio_of(r, &id),
    )
    .await?;
    tracing::info!(ahead, arrived, "frames of the flood that arrived");
    ensure!(
        arrived > 0,
        "none of the flood arrived: the guest did not flood"
    );
    ensure!(
        ahead <= FLOOD_MOST,
        "{ahead} of the {} frames the guest flooded arrived ahead of the neighbour's echo (at most {FLOOD_MOST}: what the sockets hold and 1 s queued); {arrived} arrived in all",
        FLOOD * FLOOD_FRAMES
    );
    Ok(())
}

async fn speech_during_a_resume_is_held(ctx: &Ctx) -> Result<()> {
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(PROBER_GREETING).await?;
    // Sent answers the resume 3 s after it comes: the guest's "held", a second after it heard the caller,
    // falls while the call has no connection or an unanswered resume.
    ctx.sim.plan(ConnPlan {
        resume_delay: Duration::from_secs(3),
        ..ConnPlan::default()
    });
    let said_at = tokio::time::Instant::now();
    call.say("later 1000 held");
    // The pong comes after the agent read the utterance (frames are read in order): it is the guest's.
    conn.fence().await?;
    conn.drop_abruptly();
    // A machine so slow that the drop came after the guest spoke cannot tell held from replayed.
    let dropped_after = said_at.elapsed();
    ensure!(
        dropped_after < Duration::from_millis(900),
        "the drop came {dropped_after:?} after the utterance: too late to tell whether anything was held"
    );
    call.expect_resume(RECONNECT).await?;
    // Anything the agent sends for the call before session.resumed is a violation the suite reports.
    let (resumed_on, _) = call.expect_resumed(RECONNECT).await?;
    call.expect_say("held").await?;
    // It came on the new connection, after session.resumed there, once.
    let id = call.id.clone();
    let records = ctx
        .sim
        .recorder()
        .since(0, |r| r.session.as_deref() == Some(id.as_str()));
    let resumed = records
        .iter()
        .find(|r| r.is_frame(Dir::ToAgent, "session.resumed"))
        .context("session.resumed is recorded")?;
    let held: Vec<_> = records
        .iter()
        .filter(|r| r.is_frame(Dir::FromAgent, "agent.say"))
        .filter(|r| r.json().is_some_and(|j| j["text"] == "held"))
        .collect();
    ensure!(
        held.len() == 1 && held[0].conn == resumed_on && held[0].seq > resumed.seq,
        "\"held\" came {} time(s), on {:?}, resumed on {resumed_on}",
        held.len(),
        held.iter().map(|r| r.conn).collect::<Vec<_>>()
    );
    call.say("echo after");
    call.expect_say("after").await?;
    let said = says(&call.accepted_frames());
    ensure!(
        said == [PROBER_GREETING, "held", "after"],
        "the agent said {said:?}"
    );
    Ok(())
}

// ----- speech under a backlog, held frames, moves that fail, timers, a guest given up on -----

/// The agent's counted frames for `call` from record `from` on, as JSON, in the order Sent read them.
fn frames_since(ctx: &Ctx, call: &Call, from: usize) -> Vec<Value> {
    let id = call.id.clone();
    ctx.sim
        .recorder()
        .since(from, |r| {
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(id.as_str())
                && matches!(r.what, What::Frame { counted: true, .. })
        })
        .iter()
        .filter_map(|r| r.json().cloned())
        .collect()
}

/// Waits up to `within` for the agent's counted frame for `call` (from record `from` on) that `wanted`
/// picks.
async fn frame_within(
    ctx: &Ctx,
    call: &Call,
    from: usize,
    within: Duration,
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let id = call.id.clone();
    let mine = |r: &Record| {
        r.dir == Dir::FromAgent
            && r.session.as_deref() == Some(id.as_str())
            && r.frame_type() != Some("session.resume")
            && !matches!(r.what, What::Audio { .. })
    };
    let record = ctx
        .sim
        .recorder()
        .wait_for(from, within, what, mine, |r| {
            mine(r) && r.json().is_some_and(&wanted)
        })
        .await
        .with_context(|| format!("session {id}"))?;
    Ok(record.json().cloned().unwrap_or_default())
}

/// The prober's "report" as Sent read it: how many utterances of each tagged "say" the host took.
fn accepted(report: &Value) -> Vec<(String, usize)> {
    report["text"]
        .as_str()
        .unwrap_or_default()
        .split(' ')
        .skip(1)
        .filter_map(|pair| {
            let (tag, took) = pair.split_once(':')?;
            Some((tag.to_string(), took.parse().ok()?))
        })
        .collect()
}

fn is_report(frame: &Value) -> bool {
    frame["type"] == "agent.say"
        && frame["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("accepted"))
}

/// The prober's utterance `n` of the "say" tagged `tag`, as its first characters read.
fn numbered(tag: &str, n: usize) -> String {
    format!("{tag}{n:06}")
}

/// A short description of what the agent said and called, for a failure's message.
fn sketch(frames: &[Value]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for frame in frames {
        let part = match frame["type"].as_str() {
            Some("agent.say") => {
                let text = frame["text"].as_str().unwrap_or_default();
                text.split(' ').next().unwrap_or_default().to_string()
            }
            Some("tool.call") => format!("tool.call {}", frame["name"]),
            other => other.unwrap_or("?").to_string(),
        };
        parts.push(part);
    }
    // Runs of consecutive numbered utterances as first..last.
    let number = |part: &str| part.get(1..).and_then(|n| n.parse::<usize>().ok());
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(String, String, usize)> = None;
    for part in parts {
        let numbered = part.len() == 7 && number(&part).is_some();
        match (&mut run, numbered) {
            (Some((first, last, count)), true)
                if first[..1] == part[..1] && number(last).map(|n| n + 1) == number(&part) =>
            {
                *last = part;
                *count += 1;
            }
            _ => {
                if let Some((first, last, count)) = run.take() {
                    out.push(format!("{first}..{last} ({count})"));
                }
                if numbered {
                    run = Some((part.clone(), part, 1));
                } else {
                    out.push(part);
                }
            }
        }
    }
    if let Some((first, last, count)) = run {
        out.push(format!("{first}..{last} ({count})"));
    }
    out.join(", ")
}

/// Utterances of the burst in `slow_reader_hears_all_speech`, and their size: far more than the 32
/// unwritten frames a call may have, and more than the sockets hold.
const SLOW_BURST: usize = 200;
const SLOW_CHARS: usize = 4000;

async fn slow_reader_hears_all_speech(ctx: &Ctx) -> Result<()> {
    // Sent reads every message, 10 ms apart (about 2 s for the burst): the guest says 200 utterances of
    // 4000 characters at once, faster than that, so they back up in the sockets and the connection's
    // queue. Sent never stops reading: a host that refuses the guest past its bound of unwritten frames
    // (instead of making it wait) loses speech the caller should hear.
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(PROBER_GREETING).await?;
    let from = ctx.sim.recorder().len();
    conn.read_slowly(Duration::from_millis(10));
    // The report comes 3 s after the burst: by then even what a host refused has drained, so that the
    // report itself is not refused.
    call.say(&format!(
        "say {SLOW_BURST} {SLOW_CHARS} a ; wait 3000 ; report"
    ));
    let report = frame_within(
        ctx,
        &call,
        from,
        Duration::from_secs(60),
        "the prober's report",
        is_report,
    )
    .await?;
    conn.read_slowly(Duration::ZERO);
    let frames = frames_since(ctx, &call, from);
    let said: Vec<String> = says(&frames)
        .iter()
        .filter(|t| t.len() == SLOW_CHARS)
        .map(|t| t[..7].to_string())
        .collect();
    let all: Vec<String> = (0..SLOW_BURST).map(|n| numbered("a", n)).collect();
    ensure!(
        said == all && accepted(&report) == [("a".to_string(), SLOW_BURST)],
        "Sent read everything, slowly, but {} of the {SLOW_BURST} utterances arrived (the guest's {}): {}",
        said.len(),
        report["text"],
        sketch(&frames)
    );
    Ok(())
}

async fn frames_lost_unwritten_stay_replayable(ctx: &Ctx) -> Result<()> {
    // Two calls on one connection. Sent stops reading; the first call (which cannot move) says enough
    // to fill the sockets and the connection's queue, so that the second call's 20 utterances ("b"),
    // said half a second later, wait unwritten behind it. Sent drops the connection: those 20 were
    // never written. While its resume is unanswered (Sent answers after 5 s), the second call's guest
    // says 40 more ("c"). Sent read none of the 60: the host must not take more of them than it can
    // keep (32) for the replay, so counting the unwritten 20 as sent lets 32 more in, pushes the 20 out
    // of what is kept, and the replay finds a gap: the host hangs up a healthy call.
    let conn = ctx.sim.connection().await?;
    let mut filler = conn.start(unmovable_text());
    filler.expect_say(PROBER_GREETING).await?;
    let mut call = conn.start_text();
    call.expect_say(PROBER_GREETING).await?;
    ctx.sim.plan(ConnPlan {
        resume_delay: Duration::from_secs(5),
        ..ConnPlan::default()
    });
    let from = ctx.sim.recorder().len();
    conn.pause_reading();
    filler.say("say 200 4000");
    call.say("wait 500 ; say 20 100 b ; wait 2500 ; say 40 100 c");
    // After the "b" utterances, well before the host would find the paused socket dead (3 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    conn.drop_abruptly();
    call.expect_resume(RECONNECT).await?;
    call.expect_resumed(RECONNECT).await?;
    // Once the replay is in (nothing more for a second), the guest reports what it was told.
    let id = call.id.clone();
    settled(
        ctx,
        from,
        Duration::from_secs(1),
        Duration::from_secs(20),
        |r| r.dir == Dir::FromAgent && r.session.as_deref() == Some(id.as_str()),
    )
    .await?;
    call.say("report");
    let last = frame_within(
        ctx,
        &call,
        from,
        Duration::from_secs(20),
        "the prober's report (or a hangup)",
        |f| is_report(f) || f["type"] == "tool.call",
    )
    .await?;
    let frames = frames_since(ctx, &call, from);
    ensure!(
        is_report(&last),
        "the host hung up a healthy call: after the resume Sent read {} (it had read none of the guest's 60 utterances, 20 of them never written)",
        sketch(&frames)
    );
    let report = accepted(&last);
    let took = |tag: &str| {
        report
            .iter()
            .find(|(t, _)| t == tag)
            .map_or(0, |(_, took)| *took)
    };
    let mut wanted: Vec<String> = (0..took("b")).map(|n| numbered("b", n)).collect();
    wanted.extend((0..took("c")).map(|n| numbered("c", n)));
    let got: Vec<String> = frames
        .iter()
        .filter(|f| f["type"] == "agent.say" && !is_report(f))
        .map(|f| {
            f["text"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(7)
                .collect()
        })
        .collect();
    ensure!(
        frames.iter().all(|f| f["type"] == "agent.say") && got == wanted,
        "after the resume Sent read {}; the guest was told {} of its utterances were taken ({})",
        sketch(&frames),
        took("b") + took("c"),
        last["text"]
    );
    ensure!(
        took("b") == 20,
        "the guest was refused \"b\" utterances: {}",
        last["text"]
    );
    Ok(())
}

async fn full_resume_keeps_the_drained_call(ctx: &Ctx) -> Result<()> {
    // Sent drains the call's connection; the replacement has room for one session and carries one
    // already, so the move is refused with connection_full, and Sent refuses every other connection
    // the agent opens. The call is still Sent's on the draining connection, which Sent keeps open: the
    // host must not close that connection (Sent would send the call to its fallback) nor give the call
    // up while it is there.
    const PAST_IDLE: Duration = Duration::from_secs(14);
    let (old, call) = greeted(ctx).await?;
    ctx.sim.plan(ConnPlan {
        max_sessions: Some(1),
        prestart: vec![unmovable_text()],
        ..ConnPlan::default()
    });
    for _ in 0..20 {
        ctx.sim.plan(ConnPlan {
            refuse: Some(503),
            ..ConnPlan::default()
        });
    }
    old.drain();
    let (_, answer) = call.expect_resume_answer(RECONNECT).await?;
    ensure!(
        answer["type"] == "error" && answer["error"]["code"] == "connection_full",
        "expected connection_full, got {answer}"
    );
    // Longer than an idle drained connection may stay open (10 s), and than the call's window would
    // allow a detached call (15 s) less a second.
    tokio::time::sleep(PAST_IDLE).await;
    let lost = call.state().is_none_or(|s| s.lost);
    let how = if old.is_open() {
        "still open".to_string()
    } else {
        old.closed(DEADLINE).await?
    };
    ensure!(
        !lost && old.is_open(),
        "{PAST_IDLE:?} after its move was refused with connection_full, the call is {} and its draining connection {} is {how}",
        if lost { "lost" } else { "not lost" },
        old.id
    );
    ctx.sim.clear_plans();
    let from = ctx.sim.recorder().len();
    call.say("echo still here");
    frame_within(
        ctx,
        &call,
        from,
        Duration::from_secs(40),
        "agent.say \"still here\"",
        |f| f["type"] == "agent.say" && f["text"] == "still here",
    )
    .await?;
    Ok(())
}

async fn unsendable_policy_transfer_hangs_up(ctx: &Ctx) -> Result<()> {
    // Three traps: the call gets its failure policy, a transfer to a number without its + that the
    // protocol's codec refuses to encode. A host that gives up on sending it, and on the call, leaves the
    // caller in silence; Sent must see a hangup (the transfer can never go out).
    let (_conn, mut call) = greeted(ctx).await?;
    for _ in 0..3 {
        call.say("panic");
    }
    call.expect_tool("hangup")
        .await
        .context("the failure policy's transfer cannot be encoded")?;
    Ok(())
}

async fn late_resumed_is_not_left_silent(ctx: &Ctx) -> Result<()> {
    // Sent answers the resume 12 s after it came: after the host stopped waiting for the answer (10 s),
    // within the call's window (15 s). Sent has the call attached again, and the caller speaks: a host
    // that ignores the late session.resumed leaves a call nobody serves and nobody ends.
    const LATE: Duration = Duration::from_secs(12);
    let (old, mut call) = greeted(ctx).await?;
    ctx.sim.plan(ConnPlan {
        resume_delay: LATE,
        ..ConnPlan::default()
    });
    old.fence().await?;
    old.drop_abruptly();
    call.expect_resume(RECONNECT).await?;
    call.expect_resumed(LATE + RECONNECT).await?;
    call.say("echo after");
    call.expect_frame("agent.say \"after\" or a hangup", |f| {
        (f["type"] == "agent.say" && f["text"] == "after")
            || (f["type"] == "tool.call" && f["name"] == "hangup")
    })
    .await
    .context("the caller spoke after a session.resumed that came 12 s after the resume")?;
    Ok(())
}

async fn resumed_on_a_draining_connection_moves_on(ctx: &Ctx) -> Result<()> {
    // The call's connection drops; the agent resumes it on a new connection, which Sent drains while the
    // resume is unanswered (a call that cannot move keeps it open); the agent opens a third. Only then
    // does Sent answer session.resumed, on the draining connection, and it sends nothing more: the agent
    // must move the call on by itself.
    let (old, mut call) = greeted(ctx).await?;
    ctx.sim.plan(ConnPlan {
        hold_resumes: true,
        prestart: vec![unmovable_text()],
        ..ConnPlan::default()
    });
    old.fence().await?;
    old.drop_abruptly();
    let (second, _) = call.expect_resume(RECONNECT).await?;
    let second = ctx.sim.conn(second);
    second.drain();
    let third = ctx.sim.connection_after(second.id, RECONNECT).await?;
    // The pong comes once the agent has taken the new connection in.
    third.fence().await?;
    let from = ctx.sim.recorder().len();
    ensure!(
        call.answer_resume(),
        "the resume on connection {} waits for no answer",
        second.id
    );
    let id = call.id.clone();
    let elsewhere = |r: &Record| {
        r.session.as_deref() == Some(id.as_str())
            && r.is_frame(Dir::FromAgent, "session.resume")
            && r.conn != second.id
    };
    ctx.sim
        .recorder()
        .wait_for(
            from,
            Duration::from_secs(10),
            "a session.resume of the call off the draining connection",
            |r| r.session.as_deref() == Some(id.as_str()),
            elsewhere,
        )
        .await
        .with_context(|| {
            format!(
                "session.resumed came on connection {}, draining since the resume went out there",
                second.id
            )
        })?;
    ctx.sim
        .recorder()
        .wait_for(
            from,
            RECONNECT,
            "session.resumed off the draining connection",
            |r| r.session.as_deref() == Some(id.as_str()),
            |r| {
                r.session.as_deref() == Some(id.as_str())
                    && r.is_frame(Dir::ToAgent, "session.resumed")
                    && r.conn != second.id
            },
        )
        .await?;
    call.say("echo moved");
    call.expect_say("moved").await?;
    Ok(())
}

async fn given_up_guest_stays_silent(ctx: &Ctx) -> Result<()> {
    // The guest waits on a tool; once it is answered it will speak and transfer. Sent talks on until the
    // host gives the call up (its failure policy, a hangup, which Sent leaves unanswered), then answers
    // the guest's tool: the host has let the caller go, so nothing more of the guest's may reach Sent.
    let conn = ctx.sim.connection().await?;
    let mut call = conn.start_text();
    call.expect_say(PROBER_GREETING).await?;
    call.plan_tool("lookup", ToolPlan::Hold);
    call.plan_tool("hangup", ToolPlan::Hold);
    call.say(&format!(
        "tool lookup ; echo late ; transfer {POLICY_NUMBER}"
    ));
    let lookup = call.expect_tool("lookup").await?;
    for n in 0..1000 {
        call.say(&format!("echo n{n}"));
    }
    call.expect_tool("hangup")
        .await
        .context("1000 utterances queued behind a handler that waits")?;
    call.answer(
        lookup["call_ref"].as_str().unwrap_or_default(),
        "lookup",
        None,
    );
    call.expect_nothing(Duration::from_secs(2))
        .await
        .context("the guest's tool answered after the failure policy's hangup went out")?;
    Ok(())
}
