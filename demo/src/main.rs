//! `voicehost-demo` (`scripts/demo`): the embedded Sent simulator on loopback, voicehost serving the example
//! conformance and panicker agents, a few real calls and their transcripts ([`calls`]); then `voicehost
//! serve` in-process for two tenants, managed through the admin API ([`tenants`]). It uses voicehost as a
//! library, as another program would; the agents are built by `voicehost-test-programs`.

use clap::Parser;

mod calls;
mod shared;
mod tenants;

#[derive(Parser)]
#[command(
    name = "voicehost-demo",
    version,
    about = "Start the Sent simulator on loopback, serve the example agents, place a few calls, print them"
)]
struct Cli {}

fn main() {
    if let Err(error) = start() {
        eprintln!("voicehost-demo: {error:#}");
        std::process::exit(1);
    }
}

fn start() -> anyhow::Result<()> {
    voicehost::logging::init(voicehost::logging::DEFAULT);
    Cli::parse();
    tokio::runtime::Runtime::new()?.block_on(calls::run())
}
