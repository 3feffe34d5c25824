//! Chaos: text and audio calls on an agent while Sent misbehaves at random, and afterwards a check of every
//! call from Sent's record.
//!
//! The agent is the conformance agent (or any that answers "echo <text>" with `<text>`, "dtmf <digits>" with
//! the tool `send_dtmf`, and echoes audio). Each call says numbered lines and asks for a tool now and then
//! (text) or sends tagged audio (audio). Meanwhile, at random moments, Sent drops a connection with no close
//! frame, closes one with 1001, drains one, refuses resumes on the next connection with `connection_full`
//! (it has room for one session), lets a live call's resume window pass and drops its connection (the
//! resume is refused with `resume_failed`: the call is lost), or holds up the resume answers of the next
//! connection. The host moves calls between connections and replays what Sent did not read.
//!
//! What must hold, per call, from Sent's record ([`run`] fails with the first broken call):
//! - every line's echo reached Sent exactly once and in order: all of them on a call that was not lost,
//!   a prefix of them (no gap) on a lost one;
//! - every tool call was a new one (no `call_ref` twice, no more of them than "dtmf" lines) and Sent
//!   answered each; all of them on a call not lost;
//! - a call was lost only if a fault meant it to be (a `resume_failed`, or a connection closed or dropped
//!   while the call's resume on it was unanswered, which the protocol loses), but for a few (at most one
//!   call in twenty, or two): a host that lost calls at will would otherwise pass;
//! - every audio message the agent sent for a call carries that call's tag (no audio on another's stream)
//!   and echoes each message the caller sent at most once, in order (audio sent while a call moves is
//!   dropped, by the protocol, so audio may be missing, and is counted, not failed);
//! - every call either ended as the caller ended it or was lost, and no other way (the host's counts of
//!   ended and lost calls are for the caller to compare with [`ChaosReport`]);
//! - and Sent saw no protocol violation (checked by the caller with [`Sim::violations_since`]).

use crate::record::{Dir, What};
use crate::sim::{Call, ConnHandle, ConnPlan, SessionSpec, Sim};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a chaos run goes.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    /// Calls in all.
    pub calls: usize,
    /// Calls at once, at most.
    pub at_once: usize,
    /// Lines (and audio messages) per call.
    pub lines: usize,
    /// The pause between a call's lines.
    pub line_every: Duration,
    /// One call in this many is an audio call.
    pub audio_one_in: usize,
    /// The pause between two faults: from the first to the second, at random; `None`: no faults (the
    /// caller makes its own, a rolling restart of the hosts, say).
    pub fault_every: Option<(Duration, Duration)>,
    /// The seed of every random choice (which faults, where, when); printed in the report.
    pub seed: u64,
}

impl ChaosPlan {
    /// The short run: about a minute on a loaded 2-core machine.
    pub fn short(seed: u64) -> ChaosPlan {
        ChaosPlan {
            calls: 30,
            at_once: 6,
            lines: 80,
            line_every: Duration::from_millis(80),
            audio_one_in: 3,
            fault_every: Some((Duration::from_millis(300), Duration::from_millis(1200))),
            seed,
        }
    }
}

/// What a run did and what it checked.
#[derive(Debug, Default, Clone)]
pub struct ChaosReport {
    /// Calls placed, and of them audio calls.
    pub calls: usize,
    /// Audio calls.
    pub audio_calls: usize,
    /// Calls the caller ended (Sent counted them ended).
    pub ended: usize,
    /// Of those, calls whose `session.end` never reached the agent: it was sent while they were detached,
    /// or the agent had given them up (an unanswered resume on a connection that closed, §5.6) before the
    /// replay that carried it. The agent counts them lost.
    pub ended_unheard: usize,
    /// Calls lost: their resume was refused, and they went to their fallback.
    pub lost: usize,
    /// Of those, calls whose `session.start` the agent never heard: the connection carrying it closed
    /// before the agent answered anything of the call, so it never knew the call (and counts nothing).
    pub start_unheard: usize,
    /// Of those, calls lost that no fault meant to lose (every `resume_failed` fault dooms one call).
    pub lost_otherwise: usize,
    /// Faults, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// The agent's counted frames checked (echoes and tool calls).
    pub frames_checked: usize,
    /// The agent's audio messages checked for their call's tag.
    pub audio_checked: usize,
    /// Tool calls checked for their answer.
    pub tools_checked: usize,
    /// Echoes missing before the last one Sent read, or missing on a call not lost.
    pub frames_lost: usize,
    /// Echoes or tool calls Sent read twice.
    pub duplicated: usize,
    /// Echoes Sent read out of their order.
    pub reordered: usize,
    /// Audio messages on another call's stream.
    pub misrouted: usize,
    /// Audio echoes that came twice.
    pub audio_duplicated: usize,
    /// Audio echoes that came before one sent earlier.
    pub audio_reordered: usize,
    /// Audio messages sent but never echoed (allowed: audio is dropped while a call moves).
    pub audio_lost: usize,
    /// Each audio call's longest wait between two echoes Sent read (its audio gap: a call moving between
    /// connections or hosts has one), in the order the calls were placed.
    pub audio_gaps: Vec<Duration>,
    /// How long it took.
    pub took: Duration,
    /// The plan's seed.
    pub seed: u64,
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        write!(
            f,
            "{} calls ({} audio) in {:.0} s: {} ended ({} unheard by the agent), {} lost ({} never heard by \
             the agent, {} not by a refused resume); faults: {}; \
             checked {} frames and {} tool calls: {} lost, {} duplicated, {} out of order; {} audio \
             messages: {} misrouted, {} duplicated, {} out of order, {} not echoed (dropped while moving \
             or after a loss) \
             (seed {})",
            self.calls,
            self.audio_calls,
            self.took.as_secs_f64(),
            self.ended,
            self.ended_unheard,
            self.lost,
            self.start_unheard,
            self.lost_otherwise,
            faults.join(", "),
            self.frames_checked,
            self.tools_checked,
            self.frames_lost,
            self.duplicated,
            self.reordered,
            self.audio_checked,
            self.misrouted,
            self.audio_duplicated,
            self.audio_reordered,
            self.audio_lost,
            self.seed
        )
    }
}

/// 20 ms of 16-bit audio at 16 kHz.
const AUDIO_BYTES: usize = 640;

/// Call `n`'s audio message `i`: every sample is the call's tag, but the second, which is `i`.
fn audio(n: usize, i: usize) -> Vec<u8> {
    let tag = tag_of(n);
    (0..AUDIO_BYTES / 2)
        .flat_map(|at| if at == 1 { i as i16 } else { tag }.to_le_bytes())
        .collect()
}

fn tag_of(n: usize) -> i16 {
    1000 + (n % 30_000) as i16
}

/// One call as it was placed.
struct Placed {
    call: Call,
    n: usize,
    audio: bool,
    lines: usize,
    tools: usize,
}

/// Runs `plan` against `agent` on `sim`, and checks every call (see the module's doc).
pub async fn run(sim: &Sim, agent: &str, plan: &ChaosPlan) -> Result<ChaosReport> {
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let live: Arc<Mutex<Vec<Call>>> = Arc::default();
    let done = Arc::new(tokio::sync::Notify::new());
    let faults = tokio::spawn(chaos(
        sim.clone(),
        agent.to_string(),
        plan.clone(),
        rng.u64(..),
        live.clone(),
        done.clone(),
    ));

    let mut calls = tokio::task::JoinSet::new();
    let mut placed = Vec::new();
    for n in 0..plan.calls {
        while calls.len() >= plan.at_once {
            placed.push(calls.join_next().await.expect("a call")??);
        }
        let conn = open_connection(sim, agent, &mut rng).await?;
        let audio = plan.audio_one_in > 0 && n % plan.audio_one_in == plan.audio_one_in - 1;
        let spec = if audio {
            SessionSpec::audio(16_000)
        } else {
            SessionSpec::text()
        };
        let call = conn.start(spec);
        live.lock().unwrap().push(sim.call(&call.id));
        calls.spawn(place(call, n, audio, plan.clone(), rng.u64(..)));
    }
    while let Some(call) = calls.join_next().await {
        placed.push(call??);
    }
    done.notify_one();
    let (faults, doomed) = faults.await?;

    let mut report = ChaosReport {
        calls: placed.len(),
        audio_calls: placed.iter().filter(|p| p.audio).count(),
        faults,
        seed: plan.seed,
        ..ChaosReport::default()
    };
    for call in &placed {
        check(sim, call, &doomed, &mut report)?;
    }
    report.took = started.elapsed();
    let broken = report.frames_lost
        + report.duplicated
        + report.reordered
        + report.misrouted
        + report.audio_duplicated
        + report.audio_reordered;
    if broken > 0 {
        bail!("{report}");
    }
    // A host that lost calls no fault meant to lose would pass every other check; a few are allowed (see
    // the README's known limitations), not more.
    if report.lost_otherwise > (report.calls / 20).max(2) {
        bail!("too many calls lost that no refused resume explains: {report}");
    }
    Ok(report)
}

/// A connection a call can start on, at random; waits for the agent to have one.
async fn open_connection(sim: &Sim, agent: &str, rng: &mut fastrand::Rng) -> Result<ConnHandle> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut open = sim.usable_connections(agent);
        if !open.is_empty() {
            return Ok(open.swap_remove(rng.usize(..open.len())));
        }
        if Instant::now() > deadline {
            bail!("the agent kept no open connection for 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Says the call's lines (or sends its audio), waits for the agent to answer them all or for the call to
/// be lost, and ends it.
async fn place(call: Call, n: usize, is_audio: bool, plan: ChaosPlan, seed: u64) -> Result<Placed> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tools = 0;
    for i in 0..plan.lines {
        if call.state().is_some_and(|s| s.lost) {
            break;
        }
        if is_audio {
            call.send_audio(&audio(n, i));
        } else {
            call.say(&format!("echo {n}:{i}"));
            if rng.u8(..8) == 0 {
                call.say("dtmf 1");
                tools += 1;
            }
        }
        tokio::time::sleep(plan.line_every).await;
    }
    // Every echo (text), or the call lost; audio echoes are not kept across a move, so an audio call ends
    // once what it sent had time to come back.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = call.state();
        if state.as_ref().is_some_and(|s| s.lost) {
            break;
        }
        if is_audio {
            tokio::time::sleep(Duration::from_millis(300)).await;
            break;
        }
        if echoes(&call, n).len() >= plan.lines && tool_calls(&call).len() >= tools {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "call {} (n {n}) was not answered in 60 s: {} of {} echoes, state {state:?}",
                call.id,
                echoes(&call, n).len(),
                plan.lines
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !call.state().is_some_and(|s| s.lost) {
        call.end("completed");
    }
    Ok(Placed {
        call,
        n,
        audio: is_audio,
        lines: plan.lines,
        tools,
    })
}

/// The line numbers of the call's echoes Sent accepted, in order.
fn echoes(call: &Call, n: usize) -> Vec<usize> {
    let prefix = format!("{n}:");
    call.accepted_frames()
        .iter()
        .filter(|j| j["type"] == "agent.say")
        .filter_map(|j| j["text"].as_str()?.strip_prefix(&prefix)?.parse().ok())
        .collect()
}

/// The `call_ref`s of the call's tool calls Sent accepted, in order.
fn tool_calls(call: &Call) -> Vec<String> {
    call.accepted_frames()
        .iter()
        .filter(|j| j["type"] == "tool.call")
        .filter_map(|j| j["call_ref"].as_str().map(str::to_string))
        .collect()
}

fn check(
    sim: &Sim,
    placed: &Placed,
    doomed: &BTreeSet<String>,
    report: &mut ChaosReport,
) -> Result<()> {
    let call = &placed.call;
    let state = call.state();
    let lost = state.as_ref().is_some_and(|s| s.lost);
    let ended = state.as_ref().and_then(|s| s.ended.clone());
    match (lost, ended.as_deref()) {
        (true, _) => {
            report.lost += 1;
            let start_unheard = start_cut_short(sim, &call.id);
            report.start_unheard += usize::from(start_unheard);
            if !doomed.contains(&call.id) && !start_unheard && !resume_cut_short(sim, &call.id) {
                report.lost_otherwise += 1;
                eprintln!(
                    "call {} was lost, and no fault meant it to be; its record:\n{}",
                    call.id,
                    story(sim, &call.id)
                );
            }
        }
        (false, Some("completed")) => {
            report.ended += 1;
            let sent = !sim
                .recorder()
                .since(0, |r| {
                    r.session.as_deref() == Some(call.id.as_str())
                        && r.is_frame(Dir::ToAgent, "session.end")
                })
                .is_empty();
            if !sent || resume_cut_short(sim, &call.id) {
                report.ended_unheard += 1;
            }
        }
        (false, other) => bail!(
            "call {} ended as {other:?}, neither completed nor lost",
            call.id
        ),
    }
    if !placed.audio {
        let echoes = echoes(call, placed.n);
        report.frames_checked += echoes.len();
        let distinct: BTreeSet<usize> = echoes.iter().copied().collect();
        report.duplicated += echoes.len() - distinct.len();
        let expected = if lost { distinct.len() } else { placed.lines };
        let in_order = echoes.windows(2).all(|w| w[0] < w[1]);
        let missing = (0..expected).filter(|i| !distinct.contains(i)).count();
        report.frames_lost += missing;
        report.reordered += echoes.windows(2).filter(|w| w[0] > w[1]).count();
        if missing > 0 || !in_order {
            eprintln!(
                "call {} (lost: {lost}): echoes {echoes:?}, expected 0..{expected}",
                call.id
            );
        }
        let refs = tool_calls(call);
        report.frames_checked += refs.len();
        report.tools_checked += refs.len();
        let distinct: BTreeSet<&String> = refs.iter().collect();
        report.duplicated += refs.len() - distinct.len();
        // Each "dtmf" is one tool call: fewer on a call not lost is a loss, more anywhere a repeat.
        if !lost && refs.len() < placed.tools {
            report.frames_lost += placed.tools - refs.len();
        }
        report.duplicated += refs.len().saturating_sub(placed.tools);
        let answered: BTreeSet<String> = sim
            .recorder()
            .since(0, |r| {
                r.dir == Dir::ToAgent
                    && r.session.as_deref() == Some(call.id.as_str())
                    && r.is_frame(Dir::ToAgent, "tool.result")
            })
            .iter()
            .filter_map(|r| r.json()?["call_ref"].as_str().map(str::to_string))
            .collect();
        if let Some(unanswered) = distinct.iter().find(|r| !answered.contains(r.as_str())) {
            bail!(
                "call {}: Sent never answered tool call {unanswered}",
                call.id
            );
        }
    } else {
        // Audio may be lost (what comes while a call moves is dropped, by the protocol), but never
        // misrouted, repeated or reordered: each echo carries its call's tag and its message's number.
        let tag = tag_of(placed.n).to_le_bytes();
        let mut numbers = Vec::new();
        for record in sim.recorder().since(0, |r| {
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(call.id.as_str())
                && matches!(r.what, What::Audio { .. })
        }) {
            report.audio_checked += 1;
            if let What::Audio { samples, .. } = &record.what {
                if samples.get(..2) != Some(&tag[..]) {
                    report.misrouted += 1;
                    eprintln!("call {}: audio of another call: {record}", call.id);
                } else if let Some(number) = samples.get(2..4) {
                    numbers.push(u16::from_le_bytes([number[0], number[1]]));
                }
            }
        }
        let echoed_at: Vec<Instant> = sim
            .recorder()
            .since(0, |r| {
                r.dir == Dir::FromAgent
                    && r.session.as_deref() == Some(call.id.as_str())
                    && matches!(r.what, What::Audio { .. })
            })
            .iter()
            .map(|r| r.at)
            .collect();
        let gap = echoed_at
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .max()
            .unwrap_or_default();
        report.audio_gaps.push(gap);
        let distinct: BTreeSet<u16> = numbers.iter().copied().collect();
        report.audio_duplicated += numbers.len() - distinct.len();
        report.audio_reordered += numbers.windows(2).filter(|w| w[0] > w[1]).count();
        report.audio_lost += placed.lines.saturating_sub(distinct.len());
    }
    Ok(())
}

/// Whether a `session.resume` of the session went unanswered on a connection that then closed: the
/// protocol loses such a call (§5.6: its resume token may already be spent), so a fault that closed or
/// dropped that connection meant it to be lost.
fn resume_cut_short(sim: &Sim, session: &str) -> bool {
    let records = sim.recorder().since(0, |r| {
        r.session.as_deref() == Some(session) || matches!(r.what, What::Closed { .. })
    });
    records
        .iter()
        .filter(|r| r.is_frame(Dir::FromAgent, "session.resume"))
        .any(|resume| {
            let later = || {
                records
                    .iter()
                    .filter(|r| r.seq > resume.seq && r.conn == resume.conn)
            };
            let answered = later().any(|r| {
                r.session.as_deref() == Some(session)
                    && (r.is_frame(Dir::ToAgent, "session.resumed")
                        || r.is_frame(Dir::ToAgent, "error"))
            });
            let closed = later().any(|r| matches!(r.what, What::Closed { .. }));
            !answered && closed
        })
}

/// Whether the agent never heard of the session: it sent nothing of it, and the connection that carried
/// its `session.start` closed (a fault lost the call before the agent knew it).
fn start_cut_short(sim: &Sim, session: &str) -> bool {
    let records = sim.recorder().since(0, |r| {
        r.session.as_deref() == Some(session) || matches!(r.what, What::Closed { .. })
    });
    let answered = records
        .iter()
        .any(|r| r.dir == Dir::FromAgent && r.session.as_deref() == Some(session));
    let start = records
        .iter()
        .find(|r| r.is_frame(Dir::ToAgent, "session.start"));
    !answered
        && start.is_some_and(|start| {
            records.iter().any(|r| {
                r.seq > start.seq && r.conn == start.conn && matches!(r.what, What::Closed { .. })
            })
        })
}

/// The session's frames and the closes of the connections it was on, a line each: why a call was lost.
fn story(sim: &Sim, session: &str) -> String {
    let records = sim.recorder().since(0, |r| {
        r.session.as_deref() == Some(session) || matches!(r.what, What::Closed { .. })
    });
    let conns: BTreeSet<u32> = records
        .iter()
        .filter(|r| r.session.as_deref() == Some(session))
        .map(|r| r.conn)
        .collect();
    records
        .iter()
        .filter(|r| r.session.as_deref() == Some(session) || conns.contains(&r.conn))
        .filter(|r| {
            !matches!(r.what, What::Audio { .. })
                && !r.is_frame(Dir::ToAgent, "user.said")
                && !r.is_frame(Dir::FromAgent, "agent.say")
        })
        .map(|r| format!("  {r}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Faults at random moments until `done`; returns how many of each, and the calls meant to be lost.
async fn chaos(
    sim: Sim,
    agent: String,
    plan: ChaosPlan,
    seed: u64,
    live: Arc<Mutex<Vec<Call>>>,
    done: Arc<tokio::sync::Notify>,
) -> (BTreeMap<&'static str, usize>, BTreeSet<String>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut faults = BTreeMap::new();
    let mut doomed = BTreeSet::new();
    let Some((low, high)) = plan.fault_every else {
        done.notified().await;
        return (faults, doomed);
    };
    // Only connections that have had time to answer a ping are hit: the host backs off (up to 30 s) from
    // connections that die before that, as the protocol says, and the calls would wait out their windows.
    let heartbeat = Duration::from_millis(sim.config().heartbeat_interval_ms);
    let mut first_seen: BTreeMap<u32, Instant> = BTreeMap::new();
    loop {
        let pause = low + (high.saturating_sub(low)).mul_f64(rng.f64());
        tokio::select! {
            _ = done.notified() => return (faults, doomed),
            _ = tokio::time::sleep(pause) => {}
        }
        let open: Vec<ConnHandle> = sim
            .open_connections(Some(&agent))
            .into_iter()
            .filter(|c| {
                first_seen
                    .entry(c.id)
                    .or_insert_with(Instant::now)
                    .elapsed()
                    > heartbeat * 2
            })
            .collect();
        if open.is_empty() {
            continue;
        }
        let conn = &open[rng.usize(..open.len())];
        let fault = match rng.u8(..6) {
            0 => {
                conn.drop_abruptly();
                "dropped"
            }
            1 => {
                conn.close();
                "closed"
            }
            2 => {
                conn.drain();
                "drained"
            }
            3 => {
                // The next connection has room for one session: more resumes there are `connection_full`.
                sim.plan(ConnPlan {
                    max_sessions: Some(1),
                    ..ConnPlan::default()
                });
                conn.drop_abruptly();
                "connection_full next"
            }
            4 => {
                // A live call's window has passed: its resume is refused, the call is lost.
                let mut calls = live.lock().unwrap();
                calls.retain(|c| c.state().is_some_and(|s| s.ended.is_none() && !s.lost));
                let Some(call) = calls.get(rng.usize(..calls.len().max(1))) else {
                    continue;
                };
                let Some(on) = call.state().and_then(|s| s.conn) else {
                    continue;
                };
                call.expire_resume();
                doomed.insert(call.id.clone());
                sim.conn(on).drop_abruptly();
                "resume_failed"
            }
            _ => {
                sim.plan(ConnPlan {
                    resume_delay: Duration::from_millis(rng.u64(50..400)),
                    ..ConnPlan::default()
                });
                conn.drop_abruptly();
                "resume delayed next"
            }
        };
        *faults.entry(fault).or_default() += 1;
    }
}
