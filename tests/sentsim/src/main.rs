//! `sentsim`: the Sent simulator as a program.
//!
//! `sentsim conformance --listen 127.0.0.1:8765` waits for any agent process to connect (the official SDK's
//! `conformance` program connects to `SENT_CONFORMANCE_URL`, by default `ws://localhost:8765/v1/agents/connect`)
//! and runs the scenario suite against it, printing a table.

use anyhow::Result;
use clap::{Parser, Subcommand};
use sentsim::scenarios::SCENARIOS;
use sentsim::suite::{self, Ctx, Profile};
use sentsim::{Sim, SimConfig};

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
    /// List the scenarios with their one-line meaning.
    Scenarios,
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
        Command::Scenarios => {
            for scenario in SCENARIOS {
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
    }
}
