//! Sent and the host on loopback, for one agent: the Sent simulator (`sentsim`), and `voicehost run`'s host
//! serving the agent on it (its connection, its calls, the sandbox and its limits), nothing mocked inside
//! the host. What `voicehost call` and `voicehost test` place their calls through.

use super::transcript::say;
use crate::agent::{self, Admission, AgentConfig, CallRules, Deployment, Dial};
use crate::sandbox::budget::Budget;
use crate::sandbox::{AgentCode, Sandbox};
use crate::stats::Stats;
use anyhow::{bail, Context as _, Result};
use sentsim::model::ToolPlan;
use sentsim::{ConnHandle, Sim, SimConfig, Violation};
use serde::Deserialize;
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

    /// Stops the host and the simulator; returns the protocol violations the simulator saw.
    pub async fn stop(self) -> Vec<Violation> {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.serving).await;
        let violations = self.sim.violations_since(0);
        self.sim.shutdown();
        violations
    }
}

/// Reads and compiles the component at `path`, and says so.
pub fn compile(sandbox: &Sandbox, path: &Path) -> Result<AgentCode> {
    let wasm = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let started = Instant::now();
    let code = sandbox
        .load(&wasm)
        .with_context(|| format!("{} cannot serve as an agent", path.display()))?;
    say(&format!(
        "compiled {} ({} KiB) in {} ms",
        path.display(),
        wasm.len().div_ceil(1024),
        started.elapsed().as_millis()
    ));
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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--tools: cannot read {}", path.display()))?;
        let answers: ToolAnswers =
            toml::from_str(&text).with_context(|| format!("--tools {}", path.display()))?;
        for (name, answer) in &answers.tools {
            let code = match answer {
                ToolAnswer::Ok => continue,
                ToolAnswer::Error(code) | ToolAnswer::Refused(code) => code,
            };
            if !is_code(code) {
                bail!("--tools {}: {name}'s code {code:?} is not a protocol error code (^[a-z][a-z0-9_]*$)", path.display());
            }
        }
        Ok(answers)
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

fn is_code(code: &str) -> bool {
    let mut chars = code.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

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
