//! Sent and the host on loopback, for one agent: the Sent simulator (`sentsim`), and `voicehost run`'s host
//! serving the agent on it (its connection, its calls, the sandbox and its limits), nothing mocked inside
//! the host. What `voicehost call` and `voicehost test` place their calls through.

use super::transcript::{one_line, say};
use crate::agent::{self, Admission, AgentConfig, CallRules, Deployment, Dial};
use crate::sandbox::budget::Budget;
use crate::sandbox::{AgentCode, Sandbox};
use crate::stats::{Forced, Stats};
use anyhow::{bail, Context as _, Result};
use sentdm_voice_agents::frames::{self, Frame, Party, SessionStart, UserSaid};
use sentsim::model::{ConnId, ToolPlan};
use sentsim::{Call, ConnHandle, Sim, SimConfig, Violation};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The agent's key on the simulator.
const API_KEY: &str = "voicehost-local";
/// One live call, and room for the fresh instance of a restart while the old one is being dropped.
pub const POOL_CALLS: usize = 2;
/// How long the host may take to connect to the simulator.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long the agent has to start answering the caller.
pub const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// The agent's answer is over once it has been quiet (sent no frame) this long.
pub const QUIET: Duration = Duration::from_millis(300);
/// How long the host may take to finish a call after Sent ended it (the guest's `on-session-end`).
pub const SETTLE: Duration = Duration::from_secs(3);

/// The simulator and the host serving one agent on it.
pub struct Local {
    /// Sent.
    pub sim: Sim,
    /// What the host counts for the agent.
    pub stats: Arc<Stats>,
    agent_id: String,
    /// What new calls get: a new build replaces it.
    pub deploy: watch::Sender<Arc<Deployment>>,
    stop: watch::Sender<bool>,
    serving: tokio::task::JoinHandle<Result<(), agent::ConnectError>>,
    /// How long one handler call may take (`wall_ms`): a call can outlive its end by as much.
    wall: Duration,
}

impl Local {
    /// Starts the simulator, and the host serving `code` as `agent_id` under `rules`.
    pub async fn start(agent_id: &str, code: AgentCode, rules: CallRules) -> Result<Local> {
        let sim = Sim::start_local(SimConfig {
            accounts: vec![sentsim::sim::Account {
                api_key: API_KEY.into(),
                agents: vec![agent_id.to_string()],
            }],
            ..SimConfig::default()
        })
        .await?;
        let wall = rules.limits.wall_per_call;
        let (deploy, deployment) = watch::channel(Arc::new(Deployment {
            version: 1,
            code,
            rules,
        }));
        let config = AgentConfig {
            dial: Dial::new(sim.url(), agent_id, API_KEY),
            deployment,
            connections: 1,
            admission: Admission::new(Vec::new())
                .with_slots(Budget::new(POOL_CALLS as u64).part(agent_id)),
            moves: None,
        };
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = watch::channel(false);
        let serving = tokio::spawn(agent::serve(config, stats.clone(), stopped));
        Ok(Local {
            sim,
            stats,
            agent_id: agent_id.to_string(),
            deploy,
            stop,
            serving,
            wall,
        })
    }

    /// A connection of the agent's a call can start on: the newest ready one (Sent starts a session right
    /// after `connection.ready`, as it may).
    pub async fn connection(&self) -> Result<ConnHandle> {
        let started = Instant::now();
        loop {
            if let Some(conn) = self.sim.usable_connections(&self.agent_id).pop() {
                return Ok(conn);
            }
            if started.elapsed() > CONNECT_WAIT {
                bail!(
                    "the host did not connect to the simulator within {} s",
                    CONNECT_WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most [`SETTLE`]) until the host serves no call; whether it got there.
    pub async fn settled(&self) -> bool {
        self.settled_within(SETTLE).await
    }

    /// Waits (at most `within`) until the host serves no call; whether it got there.
    pub async fn settled_within(&self, within: Duration) -> bool {
        let started = Instant::now();
        while self.stats.live_count() > 0 {
            if started.elapsed() >= within {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// How long a call may still be served after it ended: a handler running to its wall-clock bound,
    /// then [`SETTLE`].
    pub fn drain_bound(&self) -> Duration {
        self.wall + SETTLE
    }

    /// The connection `call` is on drops without a close; which one it was, or `None` when the call is
    /// on none (it is being resumed).
    pub fn drop_connection(&self, call: &Call) -> Option<ConnId> {
        let conn = call.state().and_then(|s| s.conn)?;
        self.sim.conn(conn).drop_abruptly();
        Some(conn)
    }

    /// Replaces the call's instance as if it had trapped.
    pub fn restart(&self, call: &Call) -> Forced {
        self.stats.force_trap(&call.id)
    }

    /// Stops the host and the simulator; returns the protocol violations the simulator saw.
    pub async fn stop(self) -> Vec<Violation> {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.serving).await;
        let violations = self.sim.violations_since(0);
        self.sim.shutdown();
        violations
    }
}

/// The caller presses keys. Protocol 0.2.0 has no frame for them: the agent gets a `user.dtmf` frame of
/// a later version, through `on-frame`.
pub fn press_keys(call: &Call, digits: &str) {
    let mut fields = Map::new();
    fields.insert("digits".into(), Value::String(digits.into()));
    call.send_frame("user.dtmf", fields);
}

/// Keys a caller can press: 0-9, `*`, `#` and A-D.
pub fn check_keys(digits: &str) -> Result<(), String> {
    let key = |c: char| c.is_ascii_digit() || matches!(c, '*' | '#' | 'A'..='D');
    if digits.is_empty() || !digits.chars().all(key) || digits.len() > 64 {
        return Err(format!(
            "{digits:?} are not keys: 1 to 64 of 0-9, *, #, A-D"
        ));
    }
    Ok(())
}

/// Whether `text` can be a caller's turn as Sent sends it (`user.said`'s bounds, through the official
/// SDK's codec).
pub fn check_caller_text(text: &str) -> Result<(), String> {
    let frame = Frame::UserSaid(UserSaid {
        session_id: "vs_check".into(),
        text: text.into(),
        correction: false,
    });
    frames::encode(&frame)
        .map(drop)
        .map_err(|e| format!("Sent cannot send this as the caller's turn: {e}"))
}

/// Whether `party` can be a caller or callee in Sent's `session.start` (its kinds, an E.164 number),
/// through the official SDK's codec.
pub fn check_party(party: &Party) -> Result<(), String> {
    session_start_encodes(party.clone(), party.clone(), None)
        .map_err(|e| format!("not a party Sent sends: {e}"))
}

/// Whether a `session.start` with these parties and context passes the official codec.
fn session_start_encodes(
    from: Party,
    to: Party,
    context: Option<Map<String, Value>>,
) -> Result<(), frames::FrameError> {
    let frame = Frame::SessionStart(SessionStart {
        session_id: "vs_check".into(),
        call_id: "call_check".into(),
        agent_id: "agent_check".into(),
        direction: "inbound".into(),
        from,
        to,
        session_type: "text".into(),
        language: None,
        audio: None,
        max_duration_ms: None,
        context,
        resume: None,
        started_at: "2026-12-04T00:00:00Z".into(),
    });
    frames::encode(&frame).map(drop)
}

/// The largest scenario or tool-answer file read (a hand-written TOML file).
pub const MAX_TEXT_FILE: u64 = 4 << 20;

/// The file at `path`, refused past `most` bytes before more is read (`/dev/zero` is a file too).
pub fn read_capped(path: &Path, most: u64) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(most + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > most {
        bail!(
            "{} is larger than the {} MiB taken here",
            path.display(),
            most >> 20
        );
    }
    Ok(bytes)
}

/// A text file at `path` of at most [`MAX_TEXT_FILE`] bytes.
pub fn read_text(path: &Path) -> Result<String> {
    String::from_utf8(read_capped(path, MAX_TEXT_FILE)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// Whether `output` can be written at the end of a run, found before it starts and without changing
/// anything: it must not be one of `inputs` (the agent, a scenario or audio file), and its directory must
/// take it. An existing file is opened for writing but not truncated; a missing one is created and removed.
pub fn check_output(flag: &str, output: &Path, inputs: &[&Path]) -> Result<()> {
    let same = |input: &Path| match (output.canonicalize(), input.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if let Some(input) = inputs.iter().find(|input| same(input)) {
        bail!(
            "{flag} {} is the input {}: it would be overwritten",
            output.display(),
            input.display()
        );
    }
    let cannot = || format!("{flag}: cannot write {}", output.display());
    if output.is_dir() {
        bail!("{flag}: {} is a directory", output.display());
    }
    if output.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(output)
            .with_context(cannot)?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(output)
            .with_context(cannot)?;
        std::fs::remove_file(output).with_context(cannot)?;
    }
    Ok(())
}

/// A scenario's or `--context`'s context as Sent would send it: a JSON object of at most 4 KB
/// (protocol.md, `session.start`), which the official codec encodes.
pub fn check_context(context: &Map<String, Value>) -> Result<(), String> {
    let json = serde_json::to_string(context).unwrap_or_default();
    if json.len() > MAX_CONTEXT {
        return Err(format!(
            "the context is {} bytes as JSON; Sent passes at most {MAX_CONTEXT}",
            json.len()
        ));
    }
    let party = |kind: &str, value: &str| Party {
        kind: kind.into(),
        value: Some(value.into()),
    };
    session_start_encodes(
        party("number", "+14155550100"),
        party("agent", "agent_check"),
        Some(context.clone()),
    )
    .map_err(|e| format!("not a context Sent sends: {e}"))
}

/// The most `session.start`'s `context` holds, as JSON (protocol.md: "at most 4 KB as JSON").
const MAX_CONTEXT: usize = 4096;

/// A TOML value as JSON: a date or time as its text (RFC 3339), a float that JSON cannot hold
/// (NaN, infinity) refused.
pub fn toml_to_json(value: toml::Value) -> Result<Value, String> {
    Ok(match value {
        toml::Value::String(text) => Value::String(text),
        toml::Value::Integer(n) => Value::from(n),
        toml::Value::Float(x) => serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| format!("{x} is not a number JSON can hold"))?,
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(when) => Value::String(when.to_string()),
        toml::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(toml_to_json)
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(key, value)| Ok((key, toml_to_json(value)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// Deserializes a TOML table as a `context` (through [`toml_to_json`] and [`check_context`]).
pub fn context_from_toml<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Map<String, Value>>, D::Error> {
    let Some(table) = Option::<toml::Table>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let Value::Object(context) =
        toml_to_json(toml::Value::Table(table)).map_err(serde::de::Error::custom)?
    else {
        unreachable!("a table is an object");
    };
    check_context(&context).map_err(serde::de::Error::custom)?;
    Ok(Some(context))
}

/// Deserializes any TOML value as JSON (through [`toml_to_json`]).
pub fn json_from_toml<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Value>, D::Error> {
    Option::<toml::Value>::deserialize(deserializer)?
        .map(toml_to_json)
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// Reads and compiles the component at `path`, and says so; refused when no instance of it could start
/// under `rules`.
pub fn compile(sandbox: &Sandbox, path: &Path, rules: &CallRules) -> Result<AgentCode> {
    let wasm = read_capped(path, crate::sandbox::limits::DEFAULTS.component_bytes())?;
    let started = Instant::now();
    let code = sandbox
        .load(&wasm)
        .with_context(|| format!("{} cannot serve as an agent", path.display()))?;
    if let Some(why) = code.never_fits(&rules.limits) {
        bail!("{} cannot serve as an agent: {why}", path.display());
    }
    say(&format!(
        "compiled {} ({} KiB) in {} ms",
        path.display(),
        wasm.len().div_ceil(1024),
        started.elapsed().as_millis()
    ));
    if let Some(world) = code.world().filter(|w| w.deprecated()) {
        say(&format!(
            "(it speaks {}, deprecated: served through an adapter; rebuild it against voicehost:agent@0.3.0)",
            world.name()
        ));
    }
    Ok(code)
}

/// How Sent answers the agent's tools (`--tools`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolAnswers {
    /// By tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolAnswer>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolAnswer {
    /// `ok: true`.
    Ok,
    /// `ok: false` with this error code.
    Error(String),
    /// An `error` frame with this code instead of a `tool.result`.
    Refused(String),
}

impl ToolAnswers {
    /// Reads `--tools`' file.
    pub fn read(path: &Path) -> Result<ToolAnswers> {
        let text = read_text(path).context("--tools")?;
        let answers: ToolAnswers =
            toml::from_str(&text).with_context(|| format!("--tools {}", path.display()))?;
        answers
            .check()
            .with_context(|| format!("--tools {}", path.display()))?;
        Ok(answers)
    }

    /// Every error code given is one Sent could send.
    pub fn check(&self) -> Result<()> {
        for (name, answer) in &self.tools {
            let code = match answer {
                ToolAnswer::Ok => continue,
                ToolAnswer::Error(code) | ToolAnswer::Refused(code) => code,
            };
            if !is_code(code) {
                bail!(
                    "{}'s code {:?} is not a protocol error code (^[a-z][a-z0-9_]*$, at most {MAX_CODE} characters)",
                    one_line(name),
                    one_line(code)
                );
            }
        }
        Ok(())
    }

    /// Each tool named, and how Sent answers it.
    pub fn plans(&self) -> impl Iterator<Item = (&str, ToolPlan)> {
        self.tools.iter().map(|(name, answer)| {
            let plan = match answer {
                ToolAnswer::Ok => ToolPlan::Ok,
                ToolAnswer::Error(code) => ToolPlan::Fail(code.clone()),
                ToolAnswer::Refused(code) => ToolPlan::Refuse(code.clone()),
            };
            (name.as_str(), plan)
        })
    }
}

/// The longest error code a mocked tool answer may give.
const MAX_CODE: usize = 64;

fn is_code(code: &str) -> bool {
    let mut chars = code.chars();
    if code.len() > MAX_CODE {
        return false;
    }
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_date_reaches_the_agent_as_its_text_and_nan_is_refused() {
        let table: toml::Value =
            toml::from_str("when = 1979-05-27T07:32:00Z\nday = 1979-05-27\nn = 1.5\n").unwrap();
        assert_eq!(
            toml_to_json(table).unwrap(),
            serde_json::json!({"when": "1979-05-27T07:32:00Z", "day": "1979-05-27", "n": 1.5})
        );
        let nan: toml::Value = toml::from_str("x = nan").unwrap();
        assert!(toml_to_json(nan).is_err());
    }

    #[test]
    fn tool_answers_read_ok_errors_and_refusals() {
        let answers: ToolAnswers = toml::from_str(
            "[tools]\ntransfer = \"ok\"\nsend_dtmf = { error = \"busy\" }\nhold = { refused = \"tool_not_allowed\" }\n",
        )
        .unwrap();
        let plans: Vec<_> = answers.plans().collect();
        assert_eq!(
            plans,
            vec![
                ("hold", ToolPlan::Refuse("tool_not_allowed".into())),
                ("send_dtmf", ToolPlan::Fail("busy".into())),
                ("transfer", ToolPlan::Ok),
            ]
        );
    }
}
