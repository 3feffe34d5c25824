//! `voicehost test --agent AGENT.wasm [SCENARIOS…]`: an agent's tests, for its author's CI. First the checks
//! that hold for any agent (it starts and ends cleanly, survives a dropped connection and a forced
//! restart, keeps up with a call's audio, within the limits it runs under), then the scenarios of TOML
//! files: caller turns and what the agent must answer to each. Each runs on a call of its own, on the
//! simulator and the host of `voicehost call` (`local.rs`). One line per test, `N passed, N failed`, and
//! JUnit XML with `--junit`.

use super::limits::RunLimits;
use super::local::{
    check_caller_text, check_keys, check_output, compile, press_keys, read_text, Local, ToolAnswer,
    ToolAnswers, ANSWER_WAIT, POOL_CALLS, QUIET, SETTLE,
};
use super::mock_http::{self, HttpMock, MockOrigins};
use super::transcript::{one_line, say};
use super::wav;
use crate::sandbox::{Sandbox, TrapKind};
use crate::stats::{Forced, Stats};
use anyhow::{bail, Context as _, Result};
use sentsim::record::{Record, What};
use sentsim::{Dir, Kind, SessionSpec};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `voicehost test`'s arguments.
#[derive(clap::Args)]
pub struct TestArgs {
    /// The agent's component (.wasm), compiled on this machine.
    #[arg(long, value_name = "AGENT.wasm")]
    pub agent: PathBuf,
    /// Scenario files (TOML; see the README's "Testing your agent").
    #[arg(value_name = "SCENARIOS.toml")]
    pub scenarios: Vec<PathBuf>,
    /// Also write the results as JUnit XML to this file, for CI.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The agent's id on the calls (what its `info` says).
    #[arg(long, default_value = "agent_local")]
    pub agent_id: String,
    /// The limits of each call's instance, as `voicehost run` takes them.
    #[command(flatten)]
    pub limits: RunLimits,
}

/// How many tests passed and failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tests that passed.
    pub passed: usize,
    /// Tests that failed.
    pub failed: usize,
}

/// A scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default)]
    scenario: Vec<Scenario>,
}

/// One call: how it starts, how Sent answers tools, and the caller's turns.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    /// `text` (the default) or `audio` (16 kHz).
    #[serde(default)]
    media: Media,
    /// `session.start`'s `context` (a date as its text; at most 4 KB as JSON, as Sent sends it).
    #[serde(default, deserialize_with = "super::local::context_from_toml")]
    context: Option<Map<String, Value>>,
    /// How Sent answers tools, as `voicehost call --tools` takes them.
    #[serde(default)]
    tools: BTreeMap<String, ToolAnswer>,
    /// Canned answers to the agent's HTTP requests (`wasi:http`), by origin and path.
    #[serde(default)]
    http: Vec<HttpMock>,
    /// What the agent says first, before the caller's first turn.
    greeting: Option<Expect>,
    #[serde(default)]
    turn: Vec<Turn>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Media {
    #[default]
    Text,
    Audio,
}

/// One thing the caller (or the line) does, and what the agent must answer to it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    /// The caller says this (`user.said`).
    caller: Option<String>,
    /// Audio calls: the caller speaks this WAV file (any rate, resampled to the call's, played in real
    /// time; at most [`MAX_TURN_AUDIO`]). Relative to the scenario file's directory.
    audio: Option<PathBuf>,
    /// The caller corrects their last turn.
    correct: Option<String>,
    /// The caller presses keys (a `user.dtmf` frame, as `voicehost call`'s `/dtmf`).
    dtmf: Option<String>,
    /// The connection drops: the host must resume the call.
    #[serde(default)]
    drop: bool,
    /// The instance is replaced as if it had trapped.
    #[serde(default)]
    restart: bool,
    /// The caller hangs up.
    #[serde(default)]
    hangup: bool,
    #[serde(flatten)]
    expect: Expect,
}

/// What the agent's answer to a turn must be. Its speech is its `agent.say` texts, joined by spaces.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// The speech, exactly.
    says: Option<String>,
    /// The speech contains this.
    says_contains: Option<String>,
    /// The speech matches this regular expression.
    says_matches: Option<String>,
    /// The agent calls this tool.
    tool: Option<String>,
    /// Audio calls: the agent sends audio (`true`), or none (`false`).
    sends_audio: Option<bool>,
    /// The agent sends nothing: no speech, no tool call, no audio (`true`); or something (`false`).
    silent: Option<bool>,
}

/// How long a dropped connection's call may take to be resumed.
const RESUME_WAIT: Duration = Duration::from_secs(15);

/// The longest audio a turn's file may hold: a caller's turn, not a call (1.9 MB at 16 kHz).
const MAX_TURN_AUDIO: Duration = Duration::from_secs(60);

/// The sample rate of an audio scenario's call.
const AUDIO_RATE: u32 = 16_000;

/// Runs the checks and the scenarios; an error means nothing could be tested (a flag, a file, a
/// component that cannot serve, a scenario file that does not parse).
pub async fn test(args: TestArgs) -> Result<Tally> {
    let mut rules = args.limits.rules()?;
    let mut scenarios = Vec::new();
    let mut mocked = Vec::new();
    for path in &args.scenarios {
        let text = read_text(path)?;
        let file: ScenarioFile =
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for mut scenario in file.scenario {
            for turn in &mut scenario.turn {
                if let Some(audio) = &mut turn.audio {
                    *audio = dir.join(&*audio);
                }
            }
            check_scenario(&scenario).with_context(|| format!("{}", path.display()))?;
            let origins = mock_http::check(&scenario.http)
                .with_context(|| format!("{}: scenario {:?}", path.display(), scenario.name))?;
            for origin in origins {
                if !mocked.contains(&origin) {
                    mocked.push(origin);
                }
            }
            scenarios.push(scenario);
        }
    }
    if let Some(junit) = &args.junit {
        let mut inputs: Vec<&Path> = vec![&args.agent];
        inputs.extend(args.scenarios.iter().map(PathBuf::as_path));
        check_output("--junit", junit, &inputs)?;
    }
    let mocks = MockOrigins::start(&mocked).await?;
    rules.limits.http = Arc::new(mocks.policy(&rules.limits.http));
    let sandbox = Sandbox::for_calls(POOL_CALLS)?;
    let code = compile(&sandbox, &args.agent, &rules)?;
    let local = Local::start(&args.agent_id, code, rules).await?;
    let mut results = Vec::new();
    for check in BUILT_IN {
        let started = Instant::now();
        let outcome = check.scenario().run(&local, &mocks).await;
        results.push(report(check.name, started, outcome));
    }
    for scenario in &scenarios {
        let started = Instant::now();
        let outcome = scenario.run(&local, &mocks).await;
        results.push(report(&scenario.name, started, outcome));
    }
    let violations = local.stop().await;
    if !violations.is_empty() {
        let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
        results.push(report(
            "the host kept to the protocol",
            Instant::now(),
            Err(anyhow::anyhow!(listed.join("; "))),
        ));
    }
    let tally = Tally {
        passed: results.iter().filter(|r| r.failure.is_none()).count(),
        failed: results.iter().filter(|r| r.failure.is_some()).count(),
    };
    say(&format!("{} passed, {} failed", tally.passed, tally.failed));
    if let Some(path) = &args.junit {
        std::fs::write(path, junit(&args.agent, &results))
            .with_context(|| format!("--junit: cannot write {}", path.display()))?;
    }
    Ok(tally)
}

/// One test's result.
struct TestResult {
    name: String,
    took: Duration,
    failure: Option<String>,
}

fn report(name: &str, started: Instant, outcome: Result<()>) -> TestResult {
    let took = started.elapsed();
    let failure = outcome.err().map(|e| one_line(&format!("{e:#}")));
    // One line per test, whatever the name holds.
    let shown = one_line(name);
    match &failure {
        None => say(&format!("ok   {shown} ({} ms)", took.as_millis())),
        Some(why) => say(&format!("FAIL {shown}: {why}")),
    }
    TestResult {
        name: name.to_string(),
        took,
        failure,
    }
}

/// A check that holds for any agent, as a scenario.
struct BuiltIn {
    name: &'static str,
    turns: fn() -> Vec<Turn>,
    media: Media,
}

impl BuiltIn {
    fn scenario(&self) -> Scenario {
        Scenario {
            name: self.name.into(),
            media: self.media,
            context: None,
            tools: BTreeMap::new(),
            http: Vec::new(),
            greeting: None,
            turn: (self.turns)(),
        }
    }
}

fn action(set: impl FnOnce(&mut Turn)) -> Turn {
    let mut turn = Turn {
        caller: None,
        audio: None,
        correct: None,
        dtmf: None,
        drop: false,
        restart: false,
        hangup: false,
        expect: Expect::default(),
    };
    set(&mut turn);
    turn
}

/// The checks every agent must pass, whatever it does: each scenario also fails on a trap, a failure
/// policy, a lost call or caller audio the agent did not keep up with.
const BUILT_IN: [BuiltIn; 4] = [
    BuiltIn {
        name: "it starts and ends cleanly",
        turns: Vec::new,
        media: Media::Text,
    },
    BuiltIn {
        name: "it survives a dropped connection (the call is resumed)",
        turns: || vec![action(|t| t.drop = true)],
        media: Media::Text,
    },
    BuiltIn {
        name: "it survives a forced restart (on-restart on a fresh instance)",
        turns: || vec![action(|t| t.restart = true)],
        media: Media::Text,
    },
    BuiltIn {
        name: "it keeps up with a call's audio (2 s at 16 kHz)",
        turns: Vec::new,
        media: Media::Audio,
    },
];

/// A scenario Sent could play: one action per turn, texts and keys Sent could send, error codes of the
/// protocol, regular expressions that compile.
fn check_scenario(scenario: &Scenario) -> Result<()> {
    ToolAnswers {
        tools: scenario.tools.clone(),
    }
    .check()
    .with_context(|| format!("scenario {:?}: tools", scenario.name))?;
    for (n, turn) in scenario.turn.iter().enumerate() {
        let text = turn.caller.as_deref().or(turn.correct.as_deref());
        if let Some(Err(why)) = text.map(check_caller_text) {
            bail!("scenario {:?}, turn {}: {why}", scenario.name, n + 1);
        }
        if let Some(Err(why)) = turn.dtmf.as_deref().map(check_keys) {
            bail!("scenario {:?}, turn {}: dtmf: {why}", scenario.name, n + 1);
        }
        if let Some(path) = &turn.audio {
            if scenario.media != Media::Audio {
                bail!(
                    "scenario {:?}, turn {}: audio needs an audio call (media = \"audio\")",
                    scenario.name,
                    n + 1
                );
            }
            // Read now, so that a file that cannot be played is found before any test runs.
            wav::read(path, AUDIO_RATE, MAX_TURN_AUDIO)
                .with_context(|| format!("scenario {:?}, turn {}: audio", scenario.name, n + 1))?;
        }
        if turn.expect.sends_audio.is_some() && scenario.media != Media::Audio {
            bail!(
                "scenario {:?}, turn {}: sends_audio needs an audio call (media = \"audio\")",
                scenario.name,
                n + 1
            );
        }
        let actions = [
            turn.caller.is_some(),
            turn.audio.is_some(),
            turn.correct.is_some(),
            turn.dtmf.is_some(),
            turn.drop,
            turn.restart,
            turn.hangup,
        ]
        .into_iter()
        .filter(|a| *a)
        .count();
        if actions != 1 {
            bail!(
                "scenario {:?}, turn {}: one of caller, audio, correct, dtmf, drop, restart or hangup",
                scenario.name,
                n + 1
            );
        }
        if let Some(pattern) = &turn.expect.says_matches {
            regex::Regex::new(pattern).with_context(|| {
                format!("scenario {:?}, turn {}: says_matches", scenario.name, n + 1)
            })?;
        }
    }
    Ok(())
}

/// What the host counted before a test: what the test must not add to.
struct Before {
    traps: u64,
    forced: u64,
    policies: u64,
    lost: u64,
    audio_dropped: u64,
}

impl Before {
    fn of(stats: &Stats) -> Before {
        Before {
            traps: stats.traps(),
            forced: stats.trapped(TrapKind::Forced),
            policies: stats.policies_applied.get(),
            lost: stats.sessions_lost.get(),
            audio_dropped: stats.audio_dropped.get(),
        }
    }

    /// What went wrong since, if anything.
    fn check(&self, stats: &Stats) -> Result<()> {
        let traps = stats.traps() - self.traps - (stats.trapped(TrapKind::Forced) - self.forced);
        if traps > 0 {
            let kinds: Vec<String> = TrapKind::ALL
                .iter()
                .filter(|k| **k != TrapKind::Forced && stats.trapped(**k) > 0)
                .map(|k| k.as_str().to_string())
                .collect();
            bail!("the agent trapped {traps} time(s) ({})", kinds.join(", "));
        }
        if stats.policies_applied.get() > self.policies {
            bail!("the host gave up on the agent: the failure policy was applied");
        }
        if stats.sessions_lost.get() > self.lost {
            bail!("the call was lost");
        }
        let dropped = stats.audio_dropped.get() - self.audio_dropped;
        if dropped > 0 {
            bail!("{dropped} caller audio message(s) dropped: the agent did not keep up");
        }
        Ok(())
    }
}

/// What the agent sent in answer to one turn.
#[derive(Default)]
struct Answer {
    speech: Vec<String>,
    tools: Vec<String>,
    /// Audio messages.
    audio: usize,
    ended: Option<String>,
    resumed: bool,
}

impl Scenario {
    /// Plays the scenario; then what its HTTP mocks saw must hold too.
    async fn run(&self, local: &Local, mocks: &MockOrigins) -> Result<()> {
        // Each test is a call of its own: an earlier one's (a handler still running past its end) is
        // gone before this one starts, and nothing it does is counted here.
        if !local.settled_within(local.drain_bound()).await {
            bail!(
                "an earlier test's call was still being served {:?} after it ended",
                local.drain_bound()
            );
        }
        mocks.set(&self.http)?;
        self.play(local).await?;
        mocks.report().context("HTTP")
    }

    async fn play(&self, local: &Local) -> Result<()> {
        let before = Before::of(&local.stats);
        let conn = local.connection().await?;
        let mut cursor = local.sim.recorder().len();
        // What earlier tests recorded is read: memory stays one test's, however many there are.
        local.sim.recorder().forget_before(cursor);
        let call = conn.start(SessionSpec {
            kind: match self.media {
                Media::Text => Kind::Text,
                Media::Audio => Kind::Audio {
                    sample_rate: AUDIO_RATE,
                },
            },
            context: self.context.clone(),
            ..SessionSpec::text()
        });
        let answers = ToolAnswers {
            tools: self.tools.clone(),
        };
        for (name, plan) in answers.plans() {
            call.plan_tool(name, plan);
        }
        if self.media == Media::Audio {
            // 2 s of a tone: the agent must keep up, whatever it answers.
            let tone: Vec<u8> = (0..2 * AUDIO_RATE)
                .flat_map(|i| {
                    let t = f64::from(i) / f64::from(AUDIO_RATE);
                    (((t * 440.0 * std::f64::consts::TAU).sin() * 8000.0) as i16).to_le_bytes()
                })
                .collect();
            play(&call, &tone).await;
        }
        let played = self.converse(local, &call, &mut cursor, &before).await;
        if played.is_err() {
            // A failed test hangs up its call (a no-op when it has ended), so that it ends here.
            call.end("caller_hung_up");
            local.settled().await;
        }
        played
    }

    /// The greeting and the turns, on `call`; then the call ends and the host must let it go.
    async fn converse(
        &self,
        local: &Local,
        call: &sentsim::Call,
        cursor: &mut usize,
        before: &Before,
    ) -> Result<()> {
        let greeting = listen(local, &call.id, cursor, After::Turn).await;
        if let Some(expect) = &self.greeting {
            expect.check(&greeting).context("the greeting")?;
        }
        let mut ended = greeting.ended;
        for (n, turn) in self.turn.iter().enumerate() {
            if let Some(reason) = &ended {
                bail!("turn {}: the call had ended already ({reason})", n + 1);
            }
            let what = if let Some(text) = &turn.caller {
                call.say(text);
                format!("turn {} ({text:?})", n + 1)
            } else if let Some(path) = &turn.audio {
                let audio = wav::read(path, AUDIO_RATE, MAX_TURN_AUDIO)?;
                play(call, &audio).await;
                format!("turn {} (audio {})", n + 1, path.display())
            } else if let Some(text) = &turn.correct {
                call.correct(text);
                format!("turn {} (correct {text:?})", n + 1)
            } else if let Some(digits) = &turn.dtmf {
                press_keys(call, digits);
                format!("turn {} (dtmf {digits:?})", n + 1)
            } else if turn.drop {
                if local.drop_connection(call).is_none() {
                    bail!("turn {}: the call is on no connection to drop", n + 1);
                }
                format!("turn {} (drop)", n + 1)
            } else if turn.restart {
                let restarts = local.stats.restarts.get();
                if local.restart(call) != Forced::Asked {
                    bail!("turn {}: the call has no instance to restart", n + 1);
                }
                // The answer to a restart is what the fresh instance sends from its on-restart on.
                let asked = Instant::now();
                while local.stats.restarts.get() == restarts && asked.elapsed() < ANSWER_WAIT {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                format!("turn {} (restart)", n + 1)
            } else {
                call.end("caller_hung_up");
                format!("turn {} (hangup)", n + 1)
            };
            let after = if turn.drop {
                After::Drop
            } else if turn.restart {
                After::Restart
            } else {
                After::Turn
            };
            let answer = listen(local, &call.id, cursor, after).await;
            if turn.drop && !answer.resumed {
                bail!("{what}: the call was not resumed within {RESUME_WAIT:?}");
            }
            turn.expect.check(&answer).context(what)?;
            before.check(&local.stats)?;
            ended = answer.ended;
        }
        if ended.is_none() {
            call.end("caller_hung_up");
            ended = listen(local, &call.id, cursor, After::Turn).await.ended;
        }
        if ended.is_none() {
            bail!("Sent's session.end did not reach the agent");
        }
        if !local.settled().await {
            bail!("the host still serves the call {SETTLE:?} after it ended");
        }
        before.check(&local.stats)
    }
}

/// The caller speaks `audio` (16-bit little-endian samples at [`AUDIO_RATE`]), paced as a caller's:
/// 20 ms at a time, never faster. (A stall of this process, which runs the host too, is not made up for
/// with a burst: a caller cannot speak faster than real time, and the check is whether the agent keeps up.)
async fn play(call: &sentsim::Call, audio: &[u8]) {
    let frame = (AUDIO_RATE / 50 * 2) as usize;
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for chunk in audio.chunks(frame) {
        pace.tick().await;
        call.send_audio(chunk);
    }
}

/// What the agent answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The call's start, or a turn of the caller's.
    Turn,
    /// A dropped connection: the call must be resumed first.
    Drop,
    /// A forced restart, once on-restart has run.
    Restart,
}

/// Gathers what the agent sends for `session` from `cursor` on, until it has been quiet for [`QUIET`]
/// after its last frame (or [`ANSWER_WAIT`] with nothing), or the call ends; after a drop, once the call
/// is resumed and then quiet.
async fn listen(local: &Local, session: &str, cursor: &mut usize, after: After) -> Answer {
    let recorder = local.sim.recorder();
    let mut answer = Answer::default();
    let resuming = after == After::Drop;
    // A fresh instance's on-restart has run already: what it said is there, or nothing will come.
    let mut heard = after == After::Restart;
    loop {
        let within = if resuming && !answer.resumed {
            RESUME_WAIT
        } else if heard || answer.resumed {
            QUIET
        } else {
            ANSWER_WAIT
        };
        let mine = |r: &Record| {
            r.session.as_deref() == Some(session)
                && (r.json().is_some()
                    || (r.dir == Dir::FromAgent && matches!(r.what, What::Audio { .. })))
        };
        let Ok(record) = recorder
            .wait_for(*cursor, within, "", |_| false, mine)
            .await
        else {
            return answer;
        };
        *cursor = record.seq + 1;
        if matches!(record.what, What::Audio { .. }) {
            heard = true;
            answer.audio += 1;
            continue;
        }
        let json = record.json().cloned().unwrap_or_default();
        match (record.dir, record.frame_type().unwrap_or_default()) {
            (Dir::FromAgent, "agent.say") => {
                heard = true;
                answer
                    .speech
                    .push(json["text"].as_str().unwrap_or_default().to_string());
            }
            (Dir::FromAgent, "tool.call") => {
                heard = true;
                answer
                    .tools
                    .push(json["name"].as_str().unwrap_or_default().to_string());
            }
            (Dir::FromAgent, "agent.clear") => heard = true,
            (Dir::ToAgent, "session.resumed") => answer.resumed = true,
            (Dir::ToAgent, "session.end") => {
                answer.ended = Some(json["reason"].as_str().unwrap_or_default().to_string());
                return answer;
            }
            _ => {}
        }
    }
}

impl Expect {
    fn check(&self, answer: &Answer) -> Result<()> {
        let speech = answer.speech.join(" ");
        if let Some(says) = &self.says {
            if speech != *says {
                bail!("expected the agent to say {says:?}; it said {speech:?}");
            }
        }
        if let Some(part) = &self.says_contains {
            if !speech.contains(part.as_str()) {
                bail!("expected speech containing {part:?}; the agent said {speech:?}");
            }
        }
        if let Some(pattern) = &self.says_matches {
            let regex = regex::Regex::new(pattern)?;
            if !regex.is_match(&speech) {
                bail!("expected speech matching /{pattern}/; the agent said {speech:?}");
            }
        }
        if let Some(tool) = &self.tool {
            if !answer.tools.contains(tool) {
                bail!(
                    "expected a call of the tool {tool:?}; the agent called {:?}",
                    answer.tools
                );
            }
        }
        match self.sends_audio {
            Some(true) if answer.audio == 0 => bail!("expected audio from the agent; it sent none"),
            Some(false) if answer.audio > 0 => bail!(
                "expected no audio from the agent; it sent {} audio message(s)",
                answer.audio
            ),
            _ => {}
        }
        let quiet = answer.speech.is_empty() && answer.tools.is_empty() && answer.audio == 0;
        match self.silent {
            Some(true) if !quiet => bail!(
                "expected silence; the agent said {speech:?}, called {:?} and sent {} audio message(s)",
                answer.tools,
                answer.audio
            ),
            Some(false) if quiet => bail!("expected an answer; the agent sent nothing"),
            _ => {}
        }
        Ok(())
    }
}

/// The results as JUnit XML: one test suite, one test case per test.
fn junit(agent: &Path, results: &[TestResult]) -> String {
    let failed = results.iter().filter(|r| r.failure.is_some()).count();
    let seconds: f64 = results.iter().map(|r| r.took.as_secs_f64()).sum();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites tests=\"{}\" failures=\"{failed}\" time=\"{seconds:.3}\">",
        results.len()
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" time=\"{seconds:.3}\">",
        escape(&agent.display().to_string()),
        results.len()
    );
    for result in results {
        let _ = write!(
            xml,
            "    <testcase name=\"{}\" time=\"{:.3}\"",
            escape(&result.name),
            result.took.as_secs_f64()
        );
        match &result.failure {
            None => xml.push_str("/>\n"),
            Some(why) => {
                let _ = writeln!(
                    xml,
                    ">\n      <failure message=\"{}\"/>\n    </testcase>",
                    escape(why)
                );
            }
        }
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

fn escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            // XML 1.0 allows no other control character (nor U+FFFE, U+FFFF), not even as a reference.
            '\t' | '\n' | '\r' => format!("&#{};", c as u32),
            c if c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}') => {
                c.escape_unicode().to_string()
            }
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_does_exactly_one_thing() {
        let file: ScenarioFile = toml::from_str(
            "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ncaller = \"hi\"\nhangup = true\n",
        )
        .unwrap();
        let error = check_scenario(&file.scenario[0]).unwrap_err().to_string();
        assert!(error.contains("turn 1: one of"), "{error}");
    }

    #[test]
    fn silent_false_needs_an_answer_and_sends_audio_false_needs_none() {
        let nothing = Answer::default();
        let expect = |set: fn(&mut Expect)| {
            let mut expect = Expect::default();
            set(&mut expect);
            expect
        };
        assert!(expect(|e| e.silent = Some(false)).check(&nothing).is_err());
        assert!(expect(|e| e.silent = Some(true)).check(&nothing).is_ok());
        let audio = Answer {
            audio: 3,
            ..Answer::default()
        };
        assert!(expect(|e| e.sends_audio = Some(false))
            .check(&audio)
            .is_err());
        assert!(expect(|e| e.silent = Some(false)).check(&audio).is_ok());
    }

    #[test]
    fn junit_escapes_what_it_quotes() {
        let xml = junit(
            Path::new("a.wasm"),
            &[TestResult {
                name: "says <hi> & \"bye\"".into(),
                took: Duration::from_millis(5),
                failure: Some("it said \"no\"".into()),
            }],
        );
        assert!(
            xml.contains("says &lt;hi&gt; &amp; &quot;bye&quot;"),
            "{xml}"
        );
        assert!(xml.contains("failures=\"1\""), "{xml}");
    }
}
