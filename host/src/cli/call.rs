//! `voicehost call --agent AGENT.wasm`: a call to one's own agent from the terminal. Sent is the embedded
//! simulator (`sentsim`) on loopback; the host is `voicehost run`'s code (the agent's connection, its calls,
//! the sandbox and its limits), nothing mocked inside it. A line typed is the caller's turn; a line that
//! starts with `/` is a command ([`HELP`]). What happens on the call comes out one line each, so a pipe
//! drives it as well as a person: lines in, lines out, and an exit code that says how the call went.

use super::limits::RunLimits;
use super::local::{
    check_caller_text, check_context, check_keys, check_output, check_party, compile, press_keys,
    Local, ToolAnswers, ANSWER_WAIT, POOL_CALLS, QUIET,
};
use super::transcript::{one_line, say};
use super::wav;
use crate::agent::{CallRules, Deployment};
use crate::sandbox::Sandbox;
use crate::stats::{Forced, Stats};
use anyhow::{Context as _, Result};
use sentdm_voice_agents::frames::Party;
use sentsim::record::Record;
use sentsim::{Dir, Kind, SessionSpec, Sim, What};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _};
use tokio::sync::watch;

/// `voicehost call`'s arguments.
#[derive(clap::Args)]
pub struct CallArgs {
    /// The agent's component (.wasm), compiled on this machine.
    #[arg(long, value_name = "AGENT.wasm")]
    pub agent: PathBuf,
    /// The agent's id on the call (what its `info` says).
    #[arg(long, default_value = "agent_local", value_parser = agent_id)]
    pub agent_id: String,
    /// An audio call: the caller's audio from this WAV file (PCM or float, any rate, any channels: mixed
    /// to mono and resampled to --rate), played in real time from the start of the call.
    #[arg(long, value_name = "WAV")]
    pub audio: Option<PathBuf>,
    /// An audio call: the agent's audio written to this WAV file (16-bit mono at --rate) when the call ends.
    #[arg(long, value_name = "WAV")]
    pub audio_out: Option<PathBuf>,
    /// The audio call's sample rate: 8000, 16000 or 24000 Hz (the rates Sent uses).
    #[arg(long, value_name = "HZ", default_value_t = 16000, value_parser = sample_rate)]
    pub rate: u32,
    /// How Sent answers the agent's tool calls: a TOML file with a `[tools]` table, each tool `"ok"`,
    /// `{ error = "CODE" }` (a failed `tool.result`) or `{ refused = "CODE" }` (an `error` frame instead).
    /// Tools it does not name succeed, as they do without the file.
    #[arg(long, value_name = "TOML")]
    pub tools: Option<PathBuf>,
    /// `session.start`'s `context`: a JSON object, as the customer's backend would pass it.
    #[arg(long, value_name = "JSON", value_parser = context)]
    pub context: Option<Map<String, Value>>,
    /// The caller: `KIND:VALUE` (Sent's party kinds: `number:+14155550100`, `user:u_1`, …) or a number.
    #[arg(long, value_name = "PARTY", default_value = "+14155550100", value_parser = party)]
    pub from: Party,
    /// Who was called: `KIND:VALUE` or a number (the agent itself when left out).
    #[arg(long, value_name = "PARTY", value_parser = party)]
    pub to: Option<Party>,
    /// Compile the component again whenever its file changes: the next call gets the new build (a build
    /// that cannot serve is shown, and the last good one kept). After a call, Enter starts the next.
    #[arg(long)]
    pub watch: bool,
    /// The limits of the call's instance, as `voicehost run` takes them.
    #[command(flatten)]
    pub limits: RunLimits,
}

/// The commands of the prompt.
pub const HELP: &str = "\
commands: /dtmf DIGITS (the caller presses keys), /correct TEXT (the caller's last turn, corrected), \
/drop (the connection drops; the host resumes the call on a new one), /restart (the agent's instance \
traps; a fresh one gets on-restart), /hangup (the caller hangs up), /help";

/// How the call (or the calls, with `--watch`) went: the exit code's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every call ended as a call should: hung up by the caller or the agent, or transferred.
    Ended,
    /// The host gave up on the agent (its failure policy), a call was lost, or the agent broke the
    /// protocol.
    AgentFailed,
}

/// The longest caller audio taken from a WAV file: Sent's longest call (`max_duration_ms`).
const MAX_AUDIO: Duration = Duration::from_secs(30 * 60);
/// When the input has ended, the caller hangs up once its audio has been played and the agent's has been
/// quiet this long.
const AUDIO_TAIL: Duration = Duration::from_secs(1);
/// The longest a piped line waits for the agent to fall quiet (an agent that never stops talking does not
/// hold the script forever).
const PACE_MOST: Duration = Duration::from_secs(10);
/// The longest line taken from the input; a longer one is skipped, and said so.
const MAX_LINE: usize = 64 * 1024;

/// Places the calls; returns how they went. An error means nothing could be tried (a flag, a file, a
/// component that cannot serve).
pub async fn call(args: CallArgs) -> Result<Verdict> {
    let rules = args.limits.rules()?;
    let answers = match &args.tools {
        Some(path) => ToolAnswers::read(path)?,
        None => ToolAnswers::default(),
    };
    let audio = match &args.audio {
        Some(path) => Some(wav::read(path, args.rate, MAX_AUDIO).context("--audio")?),
        None => None,
    };
    if let Some(path) = &args.audio_out {
        // Found now, not after the call (a file that cannot be written, or an input it would replace);
        // nothing is written before the call has been made.
        let mut inputs: Vec<&Path> = vec![&args.agent];
        inputs.extend(args.audio.as_deref());
        inputs.extend(args.tools.as_deref());
        check_output("--audio-out", path, &inputs)?;
    }
    let sandbox = Sandbox::for_calls(POOL_CALLS)?;
    let code = compile(&sandbox, &args.agent, &rules)?;
    let local = Local::start(&args.agent_id, code, rules.clone()).await?;
    let watching = args.watch.then(|| {
        let deploy = local.deploy.clone();
        tokio::spawn(watch_file(args.agent.clone(), sandbox, rules, deploy))
    });

    let mut input = Input::stdin(interrupts());
    let mut verdict = Verdict::Ended;
    let mut number = 1;
    let result = loop {
        let spec = SessionSpec {
            kind: if audio.is_some() || args.audio_out.is_some() {
                Kind::Audio {
                    sample_rate: args.rate,
                }
            } else {
                Kind::Text
            },
            resumable: true,
            context: args.context.clone(),
            from: Some(args.from.clone()),
            to: args.to.clone(),
        };
        let call = Conversation::start(&local, spec, &answers, number).await;
        let mut call = match call {
            Ok(call) => call,
            Err(error) => break Err(error),
        };
        let ended = call
            .converse(&local, &mut input, audio.as_deref(), args.rate)
            .await;
        if let Some(path) = &args.audio_out {
            call.write_audio(path, args.rate);
        }
        if ended == Verdict::AgentFailed {
            verdict = Verdict::AgentFailed;
        }
        if !args.watch || input.ended {
            break Ok(verdict);
        }
        say("Enter starts the next call (with the agent as last built); end the input to stop");
        match input.next().await {
            Some(_) => number += 1,
            None => break Ok(verdict),
        }
    };
    if let Some(watching) = watching {
        watching.abort();
    }
    let violations = local.stop().await;
    for violation in &violations {
        say(&format!("protocol violation by the host: {violation}"));
    }
    let verdict = result?;
    Ok(if violations.is_empty() {
        verdict
    } else {
        Verdict::AgentFailed
    })
}

/// `--watch`: compiles the file again when its size or modification time changes (once it has stayed
/// the same for one look), and hands a build that loads to the next call.
async fn watch_file(
    path: PathBuf,
    sandbox: Sandbox,
    rules: CallRules,
    deploy: watch::Sender<Arc<Deployment>>,
) {
    const LOOK: Duration = Duration::from_millis(250);
    let stamp = |path: &Path| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
    };
    let mut built = stamp(&path);
    let mut seen = built;
    let mut version = 1;
    let sandbox = Arc::new(sandbox);
    loop {
        tokio::time::sleep(LOOK).await;
        let now = stamp(&path);
        // A build still being written changes between two looks: wait until it stops changing.
        if now != seen {
            seen = now;
            continue;
        }
        if now == built || now.is_none() {
            continue;
        }
        built = now;
        let (sandbox, file, checked) = (sandbox.clone(), path.clone(), rules.clone());
        let compiled =
            tokio::task::spawn_blocking(move || compile(&sandbox, &file, &checked)).await;
        match compiled {
            Ok(Ok(code)) => {
                version += 1;
                deploy.send_replace(Arc::new(Deployment {
                    version,
                    code,
                    rules: rules.clone(),
                }));
                say(&format!(
                    "build {version} loaded: the next call gets it (a live call keeps its own)"
                ));
            }
            Ok(Err(error)) => say(&format!(
                "the changed file cannot serve, so the next call keeps build {version}: {error:#}"
            )),
            Err(_) => {}
        }
    }
}

/// Ctrl-C: the first ends the input (the caller hangs up, the agent's audio is written, no further call
/// starts); a second exits at once, with 130.
fn interrupts() -> watch::Receiver<bool> {
    let (interrupt, interrupted) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.send_replace(true);
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
    interrupted
}

/// The caller's lines from stdin.
struct Input {
    reader: tokio::io::BufReader<tokio::io::Stdin>,
    /// Stdin has ended (or failed), or Ctrl-C was pressed: the caller hangs up, and no further call
    /// starts.
    ended: bool,
    /// Stdin is not a terminal: a line waits for the agent's answer to the one before.
    paced: bool,
    interrupted: watch::Receiver<bool>,
}

impl Input {
    fn stdin(interrupted: watch::Receiver<bool>) -> Input {
        Input {
            reader: tokio::io::BufReader::new(tokio::io::stdin()),
            ended: false,
            paced: !std::io::stdin().is_terminal(),
            interrupted,
        }
    }

    /// The next line; `None` once the input has ended or Ctrl-C was pressed.
    async fn next(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        let mut interrupted = self.interrupted.clone();
        let line = tokio::select! {
            line = read_line(&mut self.reader) => line,
            _ = interrupted.wait_for(|pressed| *pressed) => {
                say("(interrupted: the caller hangs up; Ctrl-C again exits at once)");
                None
            }
        };
        if line.is_none() {
            self.ended = true;
        }
        line
    }
}

/// One line of at most [`MAX_LINE`] bytes (a longer one is skipped, and said so), its bytes that are not
/// UTF-8 replaced (and said so); `None` at the end of the input or when it cannot be read.
async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> Option<String> {
    loop {
        let mut line = Vec::new();
        let mut longer = false;
        loop {
            let mut part = Vec::new();
            match (&mut *reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut part)
                .await
            {
                Ok(0) | Err(_) if line.is_empty() && !longer => return None,
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let complete = part.last() == Some(&b'\n');
            if line.len() + part.len() > MAX_LINE + 1 {
                longer = true;
                line.clear();
            } else if !longer {
                line.extend_from_slice(&part);
            }
            if complete {
                break;
            }
        }
        if longer {
            say(&format!(
                "(a line longer than {} KiB was skipped)",
                MAX_LINE / 1024
            ));
            continue;
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        return Some(match String::from_utf8(line) {
            Ok(line) => line,
            Err(error) => {
                say("(the line is not UTF-8: what is not is taken as U+FFFD)");
                String::from_utf8_lossy(error.as_bytes()).into_owned()
            }
        });
    }
}

/// One call, from Sent's side.
struct Conversation {
    sim: Sim,
    call: sentsim::Call,
    /// The next record of the simulator's not yet read: those before it are forgotten.
    cursor: usize,
    /// The caller's last turn, not yet answered: when it was taken.
    turn: Option<Instant>,
    /// When the last line was taken.
    line_at: Instant,
    /// When the agent last sent a frame (its audio aside).
    last_heard: Instant,
    /// When the agent last sent audio.
    last_audio: Instant,
    /// The caller has hung up.
    hung_up: bool,
    /// Tool calls waiting for Sent's answer, by `call_ref`: their names.
    tools: HashMap<String, String>,
    /// Failure policies applied before the call, and since shown: the tool call that follows one is the
    /// host's, not the agent's.
    policies_shown: u64,
    /// The agent's audio, 16-bit samples as they arrived.
    heard: Vec<u8>,
    /// The agent's audio past [`MAX_AUDIO`], not kept.
    heard_dropped: usize,
    /// `/dtmf` was explained already.
    dtmf_explained: bool,
}

impl Conversation {
    async fn start(
        local: &Local,
        spec: SessionSpec,
        answers: &ToolAnswers,
        number: u32,
    ) -> Result<Conversation> {
        let conn = local.connection().await?;
        let sim = &local.sim;
        let cursor = sim.recorder().len();
        let kind = match spec.kind {
            Kind::Text => "a text call".to_string(),
            Kind::Audio { sample_rate } => format!("an audio call at {sample_rate} Hz"),
        };
        let call = conn.start(spec);
        for (name, plan) in answers.plans() {
            call.plan_tool(name, plan);
        }
        say(&format!(
            "call {number}: {kind}, session {}. Type as the caller; /help for commands.",
            call.id
        ));
        Ok(Conversation {
            sim: sim.clone(),
            call,
            cursor,
            turn: Some(Instant::now()),
            line_at: Instant::now(),
            last_heard: Instant::now(),
            last_audio: Instant::now(),
            hung_up: false,
            tools: HashMap::new(),
            policies_shown: local.stats.policies_applied.get(),
            heard: Vec::new(),
            heard_dropped: 0,
            dtmf_explained: false,
        })
    }

    /// The call, until it ends: the caller's lines and audio in, what happens out. Once the input has
    /// ended, the caller hangs up as soon as the agent has answered and fallen quiet (and the caller's
    /// audio has been played).
    async fn converse(
        &mut self,
        local: &Local,
        input: &mut Input,
        audio: Option<&[u8]>,
        rate: u32,
    ) -> Verdict {
        let stats = &local.stats;
        let policies = stats.policies_applied.get();
        let frame = rate as usize / 50 * 2;
        let mut played = 0;
        let mut played_at: Option<Instant> = None;
        let mut pace = tokio::time::interval(Duration::from_millis(20));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut look = tokio::time::interval(Duration::from_millis(50));
        let recorder = self.sim.recorder().clone();
        let mut interrupted = input.interrupted.clone();
        let session = self.call.id.clone();
        let ended = 'call: loop {
            let audio_left = audio.is_some_and(|a| played < a.len());
            // Piped in, the next line waits for the agent's answer to the turn before, and for it to
            // fall quiet: a script then reads as the conversation it is. A person at a terminal paces
            // their own turns.
            let waiting = input.paced
                && self.line_at.elapsed() < PACE_MOST
                && (self.turn.is_some_and(|at| at.elapsed() < ANSWER_WAIT)
                    || self.last_heard.elapsed() < QUIET);
            tokio::select! {
                biased;
                _ = recorder.wait_for(self.cursor, Duration::from_secs(3600), "", |_| false, |_| true) => {
                    // Everything new at once, then forgotten: the simulator's memory stays what one
                    // batch holds, however long the call.
                    let fresh = recorder.since(self.cursor, |_| true);
                    self.cursor = fresh.last().map_or(self.cursor, |r| r.seq + 1);
                    recorder.forget_before(self.cursor);
                    for record in fresh.iter().filter(|r| shown(r, &session)) {
                        if let Some(reason) = self.show(record, stats) {
                            break 'call Some(reason);
                        }
                    }
                }
                _ = interrupted.wait_for(|pressed| *pressed), if !self.hung_up => {
                    say("(interrupted: the caller hangs up; Ctrl-C again exits at once)");
                    input.ended = true;
                    self.hang_up();
                }
                _ = pace.tick(), if audio_left => {
                    let audio = audio.unwrap_or_default();
                    let end = (played + frame).min(audio.len());
                    if played == 0 {
                        self.turn = Some(Instant::now());
                    }
                    self.call.send_audio(&audio[played..end]);
                    played = end;
                    if played == audio.len() {
                        played_at = Some(Instant::now());
                        say(&format!(
                            "caller: (the audio has been played: {:.2} s)",
                            audio.len() as f64 / 2.0 / f64::from(rate)
                        ));
                    }
                }
                line = input.next(), if !input.ended && !waiting => {
                    if let Some(line) = line {
                        self.line_at = Instant::now();
                        self.command(line.trim(), local, audio.is_some());
                    }
                }
                _ = look.tick() => {
                    // The agent's answer to the last of the caller's audio has come back too.
                    let audio_done = audio.is_none()
                        || (played_at.is_some_and(|at| at.elapsed() >= AUDIO_TAIL)
                            && self.last_audio.elapsed() >= AUDIO_TAIL);
                    if input.ended && !self.hung_up && !waiting && audio_done {
                        self.hang_up();
                    }
                    if self.call.state().is_some_and(|s| s.lost) {
                        say("call lost: Sent can no longer resume it (its caller went to the fallback)");
                        break None;
                    }
                }
            }
        };
        // The host's side of the end: the guest's on-session-end, and what it logs.
        local.settled().await;
        let gave_up = stats.policies_applied.get() > policies;
        if gave_up {
            say("the host gave up on the agent for this call: it applied the failure policy");
        }
        match ended {
            Some(_) if !gave_up => Verdict::Ended,
            _ => Verdict::AgentFailed,
        }
    }

    /// The caller hangs up (once).
    fn hang_up(&mut self) {
        if self.hung_up {
            return;
        }
        self.hung_up = true;
        say("caller: (hangs up)");
        self.call.end("caller_hung_up");
    }

    /// A line typed as the caller: a turn, or a command.
    fn command(&mut self, line: &str, local: &Local, audio: bool) {
        let (command, rest) = match line.strip_prefix('/') {
            Some(command) => command
                .split_once(' ')
                .map_or((command, ""), |(c, r)| (c, r.trim())),
            None if line.is_empty() => return,
            None if audio => {
                say(
                    "an audio call: the caller speaks through --audio (commands still work; /help)",
                );
                return;
            }
            None => return self.caller_says(line, false),
        };
        match (command, rest) {
            ("help", _) => say(HELP),
            ("hangup", _) if self.hung_up => say("the caller has hung up already"),
            ("hangup", _) => self.hang_up(),
            ("correct", text) if !text.is_empty() && !audio => self.caller_says(text, true),
            ("dtmf", digits) => match check_keys(digits) {
                Ok(()) => {
                    if !self.dtmf_explained {
                        self.dtmf_explained = true;
                        say("note: protocol 0.2.0 has no frame for the caller's keys; the agent gets them \
                             as a `user.dtmf` frame of a later version, through on-frame");
                    }
                    self.turn = Some(Instant::now());
                    press_keys(&self.call, digits);
                }
                Err(why) => say(&format!("/dtmf DIGITS: {why}")),
            },
            ("drop", _) => match local.drop_connection(&self.call) {
                Some(conn) => say(&format!("(connection {conn} drops)")),
                None => say("the call is on no connection now (it is being resumed)"),
            },
            ("restart", _) => match local.restart(&self.call) {
                Forced::Asked => {
                    // A piped script's next line waits for the fresh instance's first words.
                    self.turn = Some(Instant::now());
                    say("(the agent's instance is made to trap)");
                }
                Forced::AlreadyAsked => say("a restart is on its way already: this one adds none"),
                Forced::NoInstance => say(
                    "the call has no instance to restart (it is ending, or the host gave up on the agent)",
                ),
            },
            ("correct", _) => say("/correct TEXT, on a text call"),
            _ => say(&format!("unknown command /{}; {HELP}", one_line(command))),
        }
    }

    /// The caller's turn (or its correction), when Sent could send it.
    fn caller_says(&mut self, text: &str, correction: bool) {
        if let Err(why) = check_caller_text(text) {
            return say(&format!("not sent: {why}"));
        }
        self.turn = Some(Instant::now());
        if correction {
            self.call.correct(text);
        } else {
            self.call.say(text);
        }
    }

    /// Shows one record of the session or of a connection; returns the end's reason once Sent has ended
    /// the call.
    fn show(&mut self, record: &Record, stats: &Stats) -> Option<String> {
        if record.is_frame(Dir::FromAgent, "tool.call") {
            // The failure policy's hangup or transfer is the host's tool call, not the agent's reply.
            let applied = stats.policies_applied.get();
            if applied > self.policies_shown {
                self.policies_shown += 1;
                let json = record.json().cloned().unwrap_or_default();
                let name = one_line(json["name"].as_str().unwrap_or_default());
                say(&format!(
                    "host: tool {name} (the failure policy, sent for the agent)"
                ));
                self.tools.insert(
                    json["call_ref"].as_str().unwrap_or_default().to_string(),
                    name,
                );
                return None;
            }
        }
        let reply = record.dir == Dir::FromAgent
            && (matches!(record.what, What::Audio { .. })
                || matches!(
                    record.frame_type(),
                    Some("agent.say" | "agent.clear" | "tool.call")
                ));
        if reply && !matches!(record.what, What::Audio { .. }) {
            self.last_heard = Instant::now();
        }
        if reply {
            if let Some(at) = self.turn.take() {
                say(&format!(
                    "turn: {} ms to the agent's first reply",
                    record.at.saturating_duration_since(at).as_millis()
                ));
            }
        }
        match &record.what {
            What::Audio { samples, .. } if record.dir == Dir::FromAgent => {
                self.last_audio = Instant::now();
                let room = MAX_AUDIO.as_secs() as usize * 48_000;
                if self.heard.len() + samples.len() <= room {
                    self.heard.extend_from_slice(samples);
                } else {
                    self.heard_dropped += samples.len();
                }
            }
            What::Frame { json, .. } => return self.show_frame(record, json),
            What::Closed { how } => say(&format!("(connection {} closed: {how})", record.conn)),
            _ => {}
        }
        None
    }

    fn show_frame(&mut self, record: &Record, json: &Value) -> Option<String> {
        let text = |key: &str| json[key].as_str().unwrap_or_default().to_string();
        match (record.dir, record.frame_type().unwrap_or_default()) {
            (Dir::FromAgent, "agent.say") => {
                let last = json["last"].as_bool().unwrap_or(true);
                say(&format!(
                    "agent{} {}",
                    if last { ":" } else { "…" },
                    one_line(&text("text"))
                ));
            }
            (Dir::FromAgent, "agent.clear") => say("agent: (clears its speech not yet played)"),
            (Dir::FromAgent, "tool.call") => {
                let name = one_line(&text("name"));
                let arguments = json
                    .get("arguments")
                    .map_or(String::new(), |a| format!(" {a}"));
                say(&format!("tool: {name}{arguments}"));
                self.tools.insert(text("call_ref"), name);
            }
            (Dir::FromAgent, "session.resume") => {
                say(&format!(
                    "(the host resumes the call on connection {})",
                    record.conn
                ));
            }
            (Dir::ToAgent, "tool.result") => {
                let name = self.tools.remove(&text("call_ref")).unwrap_or_default();
                let outcome = if json["ok"].as_bool() == Some(true) {
                    "ok".to_string()
                } else {
                    format!(
                        "error {}",
                        one_line(json["error"]["code"].as_str().unwrap_or("?"))
                    )
                };
                say(&format!("tool: {name} → {outcome}"));
            }
            (Dir::ToAgent, "error") => say(&format!(
                "sent: error {} refusing {}: {}",
                json["error"]["code"].as_str().unwrap_or("?"),
                json["frame_type"].as_str().unwrap_or("a frame"),
                one_line(json["error"]["message"].as_str().unwrap_or_default())
            )),
            (Dir::ToAgent, "session.resumed") => say(&format!(
                "(the call is resumed on connection {})",
                record.conn
            )),
            (Dir::ToAgent, "connection.ready") => {
                say(&format!("(connection {} is ready)", record.conn));
            }
            (Dir::ToAgent, "session.end") => {
                let reason = text("reason");
                say(&format!("call ended: {reason}"));
                return Some(reason);
            }
            _ => {}
        }
        None
    }

    /// `--audio-out`: what the agent said, as a WAV file.
    fn write_audio(&self, path: &Path, rate: u32) {
        match wav::write(path, rate, &self.heard) {
            Ok(()) => say(&format!(
                "the agent's audio: {:.2} s written to {}{}",
                self.heard.len() as f64 / 2.0 / rate as f64,
                path.display(),
                if self.heard_dropped > 0 {
                    format!(
                        " (the rest, past {} minutes, not kept)",
                        MAX_AUDIO.as_secs() / 60
                    )
                } else {
                    String::new()
                }
            )),
            Err(error) => say(&format!("cannot write {}: {error:#}", path.display())),
        }
    }
}

/// Whether a record is the call's to show: the session's frames and audio, and what happens to the
/// connections (one drops, a new one is ready).
fn shown(record: &Record, session: &str) -> bool {
    match record.session.as_deref() {
        Some(id) => id == session,
        None => {
            matches!(record.what, What::Closed { .. })
                || record.is_frame(Dir::ToAgent, "connection.ready")
        }
    }
}

fn agent_id(arg: &str) -> Result<String, String> {
    crate::tenancy::check_agent_id(arg)
        .map(|()| arg.to_string())
        .map_err(|e| e.to_string())
}

fn sample_rate(arg: &str) -> Result<u32, String> {
    match arg.parse() {
        Ok(rate @ (8000 | 16000 | 24000)) => Ok(rate),
        _ => Err("8000, 16000 or 24000 (Hz)".into()),
    }
}

fn context(arg: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(arg) {
        Ok(Value::Object(map)) => {
            check_context(&map)?;
            Ok(map)
        }
        Ok(_) => Err("a JSON object, e.g. '{\"order\":\"A-17\"}'".into()),
        Err(error) => Err(format!("not JSON: {error}")),
    }
}

fn party(arg: &str) -> Result<Party, String> {
    let (kind, value) = match arg.split_once(':') {
        Some((kind, value)) => (kind, value),
        None => ("number", arg),
    };
    if kind.is_empty() || value.is_empty() {
        return Err("KIND:VALUE (e.g. number:+14155550100), or a number".into());
    }
    let party = Party {
        kind: kind.into(),
        value: Some(value.into()),
    };
    check_party(&party)?;
    Ok(party)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_party_is_kind_and_value_or_a_number() {
        assert_eq!(party("user:u_1").unwrap().kind, "user");
        assert_eq!(party("+14155550100").unwrap().kind, "number");
        assert!(party("user:").is_err());
        assert!(party("12345").is_err(), "not E.164");
        assert!(party("Pigeon:coo").is_err(), "not a party kind");
    }

    #[tokio::test]
    async fn a_line_too_long_is_skipped_and_one_not_utf8_is_taken_lossily() {
        let mut input = Vec::new();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        input.extend_from_slice(b"\nhello \xff\r\nlast");
        let mut reader = &input[..];
        assert_eq!(
            read_line(&mut reader).await.as_deref(),
            Some("hello \u{fffd}")
        );
        assert_eq!(read_line(&mut reader).await.as_deref(), Some("last"));
        assert_eq!(read_line(&mut reader).await, None);
    }
}
