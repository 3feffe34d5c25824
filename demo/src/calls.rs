//! The demo's calls: the embedded Sent simulator on loopback, voicehost serving the example conformance and
//! panicker agents, a few real calls (text, audio, a panic, a dropped connection), their transcripts and a
//! summary; then `voicehost serve` for two tenants ([`crate::tenants`]).

use crate::shared::{component, transcript};
use anyhow::Result;
use sentsim::{Sim, SimConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use voicehost::agent::CallRules;
use voicehost::agent::Dial;
use voicehost::agent::{self, AgentConfig};
use voicehost::sandbox::Sandbox;
use voicehost::stats::Stats;

const KEY: &str = "demo-key";
const CONFORMANCE: &str = "agent_conformance";
const PANICKER: &str = "agent_panicker";

pub async fn run() -> Result<()> {
    let stats = Arc::new(Stats::default());
    let config = SimConfig {
        heartbeat_interval_ms: 1000,
        accounts: vec![sentsim::sim::Account {
            api_key: KEY.into(),
            agents: vec![CONFORMANCE.into(), PANICKER.into()],
        }],
        ..SimConfig::default()
    };
    let sim = Sim::start_local(config).await?;
    println!("Sent simulator listening on {}", sim.url());

    let sandbox = Sandbox::new()?;
    let (stop, stopped) = watch::channel(false);
    for (agent_id, name) in [(CONFORMANCE, "conformance"), (PANICKER, "panicker")] {
        let wasm = component(name)?;
        let started = Instant::now();
        let code = sandbox.load(&wasm)?;
        println!(
            "compiled {name}.wasm ({} KiB) in {} ms; serving it as {agent_id}",
            wasm.len() / 1024,
            started.elapsed().as_millis()
        );
        let config = AgentConfig::fixed(
            Dial::new(sim.url(), agent_id, KEY),
            code,
            CallRules::default(),
            1,
        );
        tokio::spawn(agent::serve(config, stats.clone(), stopped.clone()));
    }

    let result = calls(&sim, &stats).await;
    // Let the host read the last session.end before it stops.
    let settled = Instant::now();
    while stats.sessions_ended.get() + stats.sessions_lost.get() < stats.sessions_started.get()
        && settled.elapsed() < Duration::from_secs(2)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    sim.shutdown();
    println!("\n== summary\n{stats}");
    result?;
    crate::tenants::run().await
}

async fn calls(sim: &Sim, stats: &Stats) -> Result<()> {
    let conformance = sim.connection_for(Some(CONFORMANCE)).await?;
    let panicker = sim.connection_for(Some(PANICKER)).await?;

    println!("\n== call 1: a text call to the conformance agent");
    let mut call = conformance.start_text();
    call.expect_say("Hello from the conformance agent.").await?;
    call.say("echo Hello voicehost");
    call.expect_say("Hello voicehost").await?;
    call.say("stream Let me think about that");
    call.expect_say_with("Let", false).await?;
    call.expect_say("me think about that").await?;
    call.say("dtmf 42#");
    call.expect_tool("send_dtmf").await?;
    call.say("transfer");
    call.expect_tool("transfer").await?;
    call.expect_nothing(Duration::from_millis(100)).await?;
    transcript(sim, &call);

    println!("\n== call 2: an audio call at 16 kHz, echoed");
    let mut call = conformance.start_audio(16000);
    for n in 0..25u16 {
        let frame = tone(16000, n);
        call.send_audio(&frame);
        call.expect_audio(&frame).await?;
    }
    call.end("caller_hung_up");
    transcript(sim, &call);

    println!("\n== call 3: the panicker agent panics; the call goes on with a fresh instance");
    let mut call = panicker.start_text();
    call.expect_say("Hello from the panicker.").await?;
    call.say("panic");
    call.say("echo Still here after the panic");
    call.expect_say("Still here after the panic").await?;
    call.end("caller_hung_up");
    transcript(sim, &call);
    println!(
        "            host: {} trap contained, {} fresh instance started (on-restart), the call never dropped",
        stats.traps(),
        stats.restarts.get()
    );

    println!("\n== call 4: the connection drops mid-call; the call resumes on a new one");
    let conformance = sim.connection_for(Some(CONFORMANCE)).await?;
    let mut call = conformance.start_text();
    call.expect_say("Hello from the conformance agent.").await?;
    call.say("echo before the drop");
    call.expect_say("before the drop").await?;
    conformance.drop_abruptly();
    call.say("echo said while the line was down");
    call.expect_resumed(Duration::from_secs(10)).await?;
    call.expect_say("said while the line was down").await?;
    call.end("caller_hung_up");
    transcript(sim, &call);

    let violations = sim.violations_since(0);
    if violations.is_empty() {
        println!("\nno protocol violations");
    } else {
        for violation in violations {
            println!("protocol violation: {violation}");
        }
    }
    Ok(())
}

/// 20 ms of a 440 Hz tone, starting at frame `n`.
fn tone(sample_rate: u32, n: u16) -> Vec<u8> {
    let count = sample_rate as usize / 50;
    (0..count)
        .flat_map(|i| {
            let t = (n as usize * count + i) as f64 / sample_rate as f64;
            (((t * 440.0 * std::f64::consts::TAU).sin() * 8000.0) as i16).to_le_bytes()
        })
        .collect()
}
