//! Runs the scenario suite against whatever agent is connected to a [`Sim`], one scenario after another on
//! the same agent, and reports a table. A scenario fails when it returns an error, when it runs past its
//! deadline, or when the agent broke a protocol rule (a [`crate::Violation`]) while it ran.

use crate::scenarios::{Scenario, SCENARIOS};
use crate::sim::Sim;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What the agent under test can take.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    /// Whether to put several audio sessions on the agent at once. The official SDK 0.2.0 deadlocks under
    /// concurrent audio (a lock-order inversion), so its runs keep audio to one session at a time.
    pub concurrent_audio: bool,
}

/// Makes the agent act on its own, outside its handlers, as a speech engine or a timer would. Only an agent
/// running in the test's own process can offer this; scenarios use it, when given, to reach windows that the
/// conformance agent's replies never fall into.
pub trait Poke: Send + Sync {
    /// The agent sends `samples` for the session now. `Err` is the agent's own error.
    fn send_audio(&self, session_id: &str, samples: &[u8]) -> Result<(), String>;
    /// The agent says `text` in the session now.
    fn say(&self, session_id: &str, text: &str) -> Result<(), String>;
}

/// What a scenario gets.
pub struct Ctx {
    /// The simulated Sent the agent under test is connected to.
    pub sim: Sim,
    /// What the agent under test can take.
    pub profile: Profile,
    /// A way to make the agent act on its own, when it runs in the test's process; `None` otherwise.
    pub poke: Option<Arc<dyn Poke>>,
}

/// One scenario's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario's name.
    pub name: &'static str,
    /// What the scenario checks, in a sentence.
    pub meaning: &'static str,
    /// Whether it passed: no error, no timeout and no protocol violation.
    pub passed: bool,
    /// What went wrong, empty when it passed.
    pub detail: String,
}

/// The suite's results, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One outcome per scenario run, in the order they ran.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// How many scenarios passed.
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.passed).count()
    }

    /// How many scenarios failed.
    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }

    /// One line per scenario: name and pass or fail, without details (the part two runs must agree on).
    pub fn verdicts(&self) -> Vec<(String, bool)> {
        self.outcomes
            .iter()
            .map(|o| (o.name.to_string(), o.passed))
            .collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| scenario | result | what went wrong |")?;
        writeln!(f, "|---|---|---|")?;
        for outcome in &self.outcomes {
            let detail = outcome.detail.replace('\n', " ").replace('|', "\\|");
            let result = if outcome.passed { "pass" } else { "FAIL" };
            writeln!(f, "| {} | {result} | {detail} |", outcome.name)?;
        }
        write!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}

/// How long one scenario may run in all.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(90);

/// Runs `future` (an agent under test) on a runtime and a thread of its own; its output comes through the
/// receiver. An agent that deadlocks on its own locks then freezes only that runtime, and the scenarios'
/// deadlines report it, instead of the test's runtime freezing with it (the official SDK 0.2.0 can: see
/// tests/README.md).
pub fn on_own_runtime<F>(future: F) -> tokio::sync::oneshot::Receiver<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (done, output) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the agent under test");
        let _ = done.send(runtime.block_on(future));
    });
    output
}

/// Runs every scenario whose name contains `filter` (all when empty); a filter that matches none is a
/// failed report, never an empty one that passes.
pub async fn run(ctx: &Ctx, filter: &str) -> Report {
    let mut report = Report::default();
    for scenario in SCENARIOS.iter().filter(|s| s.name.contains(filter)) {
        let outcome = run_one(ctx, scenario).await;
        tracing::info!(
            scenario = outcome.name,
            passed = outcome.passed,
            detail = outcome.detail,
            "scenario done"
        );
        report.outcomes.push(outcome);
    }
    if report.outcomes.is_empty() {
        // A filter that matches nothing passes nothing: it is a mistake, not a clean run.
        report.outcomes.push(Outcome {
            name: "no_scenario_matched",
            meaning: "the filter names at least one scenario",
            passed: false,
            detail: format!("no scenario's name contains {filter:?}"),
        });
    }
    report
}

/// Runs one scenario and judges it.
pub async fn run_one(ctx: &Ctx, scenario: &Scenario) -> Outcome {
    let from = ctx.sim.recorder().len();
    let result = tokio::time::timeout(SCENARIO_DEADLINE, (scenario.run)(ctx)).await;
    let mut problems = Vec::new();
    match result {
        Err(_) => problems.push(format!("did not finish within {SCENARIO_DEADLINE:?}")),
        Ok(Err(error)) => problems.push(format!("{error:#}")),
        Ok(Ok(())) => {}
    }
    for violation in ctx.sim.violations_since(from) {
        problems.push(format!("protocol violation: {violation}"));
    }
    ctx.sim.end_all();
    Outcome {
        name: scenario.name,
        meaning: scenario.meaning,
        passed: problems.is_empty(),
        detail: problems.join("; "),
    }
}
