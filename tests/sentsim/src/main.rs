//! `sentsim`: the Sent simulator as a program.
//!
//! `sentsim conformance --listen 127.0.0.1:8765` waits for any agent process to connect (the official SDK's
//! `conformance` program connects to `SENT_CONFORMANCE_URL`, by default `ws://localhost:8765/v1/agents/connect`)
//! and runs the scenario suite against it, printing a table.
//!
//! `sentsim calls --listen 127.0.0.1:8765 --account KEY=AGENT` plays Sent for the operator's own accounts and
//! places text calls on each agent they name, printing a transcript (see `calls.rs`).

use anyhow::Result;
use clap::{Parser, Subcommand};
use sentsim::calls::{self, Plan, MASKED_KEY};
use sentsim::scenarios::SCENARIOS;
use sentsim::suite::{self, Ctx, Profile};
use sentsim::{Sim, SimConfig};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "sentsim",
    about = "A simulator of Sent for Sent Voice Agents (sent.voice.v1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Wait for an agent to connect as agent_conformance (key "conformance"), run the suite, print a table.
    Conformance {
        /// Where to listen, on loopback.
        #[arg(long, default_value = "127.0.0.1:8765")]
        listen: String,
        /// Sent's heartbeat interval (the protocol's minimum, 1000, keeps the suite fast).
        #[arg(long, default_value_t = 1000)]
        heartbeat_ms: u64,
        /// Put several audio sessions on the agent at once (the official SDK 0.2.0 deadlocks under that).
        #[arg(long)]
        concurrent_audio: bool,
        /// Run only the scenarios whose name contains this.
        #[arg(long, default_value = "")]
        filter: String,
    },
    /// Play Sent for these accounts and place text calls on each of their agents, printing a transcript.
    Calls {
        /// Where to listen, on loopback.
        #[arg(long, default_value = "127.0.0.1:8765")]
        listen: String,
        /// KEY=AGENT[,AGENT...]: an API key and the agent ids it owns (repeatable). Calls go to every agent.
        #[arg(long = "account", value_name = "KEY=AGENT[,AGENT...]", required = true)]
        accounts: Vec<String>,
        /// Calls per agent.
        #[arg(long, default_value_t = 3)]
        calls: u64,
        /// A new call this often, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        every_ms: u64,
        /// How long a call stays open after the caller's last line, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        hold_ms: u64,
        /// Sent's heartbeat interval, in milliseconds (the protocol's minimum is 1000).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1000..=60_000))]
        heartbeat_ms: u64,
        /// What the caller says, in order (repeatable).
        #[arg(long = "say", value_name = "TEXT",
              default_values_t = ["echo hello".to_string(), "count".to_string()])]
        says: Vec<String>,
        /// Keep placing calls until Ctrl-C.
        #[arg(long)]
        forever: bool,
        /// How long an agent has to connect (and to come back after losing its connection), in seconds.
        #[arg(long, default_value_t = 60)]
        wait_s: u64,
    },
    /// List the scenarios with their one-line meaning (`--pressure`: the pressure scenarios instead).
    Scenarios {
        /// The pressure scenarios (Sent under timing pressure and at its limits), one agent each.
        #[arg(long)]
        pressure: bool,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Scenarios { pressure } => {
            let list = if pressure {
                sentsim::pressure::SCENARIOS
            } else {
                SCENARIOS
            };
            for scenario in list {
                println!("{}: {}", scenario.name, scenario.meaning);
            }
            Ok(())
        }
        Command::Conformance {
            listen,
            heartbeat_ms,
            concurrent_audio,
            filter,
        } => {
            let config = SimConfig {
                heartbeat_interval_ms: heartbeat_ms,
                ..SimConfig::default()
            };
            let sim = Sim::start(config, &listen).await?;
            eprintln!(
                "sentsim: waiting for an agent on {}?agent_id=agent_conformance",
                sim.url()
            );
            let ctx = Ctx {
                sim: sim.clone(),
                profile: Profile { concurrent_audio },
                poke: None,
            };
            let report = suite::run(&ctx, &filter).await;
            sim.shutdown();
            println!("{report}");
            std::process::exit(if report.failed() == 0 { 0 } else { 1 });
        }
        Command::Calls {
            listen,
            accounts,
            calls,
            every_ms,
            hold_ms,
            heartbeat_ms,
            says,
            forever,
            wait_s,
        } => {
            let plan = Plan {
                calls: (!forever).then_some(calls),
                every: Duration::from_millis(every_ms.max(1)),
                says,
                hold: Duration::from_millis(hold_ms),
                connect_within: Duration::from_secs(wait_s),
            };
            let accounts = match accounts.iter().map(|a| calls::parse_account(a)).collect() {
                Ok(accounts) => accounts,
                Err(error) => {
                    eprintln!("sentsim: {error}");
                    std::process::exit(2);
                }
            };
            std::process::exit(serve_calls(&listen, accounts, heartbeat_ms, plan).await?);
        }
    }
}

/// `sentsim calls`: returns the exit code.
async fn serve_calls(
    listen: &str,
    accounts: Vec<sentsim::sim::Account>,
    heartbeat_ms: u64,
    plan: Plan,
) -> Result<i32> {
    let agents = calls::agents_of(&accounts);
    for account in &accounts {
        println!(
            "sentsim: account {MASKED_KEY} owns {}",
            account.agents.join(", ")
        );
    }
    let config = SimConfig {
        heartbeat_interval_ms: heartbeat_ms,
        accounts,
        ..SimConfig::default()
    };
    let sim = Sim::start(config, listen).await?;
    println!(
        "sentsim: listening; in voicehost.toml, sent_url = \"{}\"",
        sim.url()
    );
    println!("sentsim: waiting for {} to connect", agents.join(", "));
    tokio::spawn(calls::report_refusals(sim.clone()));
    let mut served = tokio::task::JoinSet::new();
    for agent in agents {
        served.spawn(calls::serve_agent(sim.clone(), agent, plan.clone()));
    }
    let mut code = 0;
    tokio::select! {
        results = served.join_all() => {
            for result in results {
                if let Err(error) = result {
                    eprintln!("sentsim: {error:#}");
                    code = 1;
                }
            }
        }
        _ = tokio::signal::ctrl_c() => {
            println!("sentsim: stopping: the calls still open end with caller_hung_up");
            sim.end_all();
            // Let the session.end frames reach the agents.
            tokio::time::sleep(Duration::from_millis(300)).await;
            code = if plan.calls.is_none() { 0 } else { 130 };
        }
    }
    if let Some(line) = calls::violations_line(&sim) {
        println!("{line}");
    }
    sim.shutdown();
    Ok(code)
}
