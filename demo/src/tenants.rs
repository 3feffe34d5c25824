//! The second half of the demo: `voicehost serve` in-process for two tenants, agents uploaded and
//! activated through the admin API over loopback, a call to each, what each tenant sees, the metrics, and
//! a restart served from the compiled cache. Its data directory is a temporary one, removed at the end.

use anyhow::{Context as _, Result};
use hyper::Method;
use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use voicehost::api::views::{AgentList, AgentView, VersionView};
use voicehost::cli::{agents_table, Body, Client};
use voicehost::tenancy::Tenancy;
use voicehost::tenancy::{token_sha256, ServeConfig};

/// The demo's tenants: (tenant, its admin token, its Sent key, its agent, the example it uploads).
const TENANTS: [(&str, &str, &str, &str, &str); 2] = [
    (
        "acme",
        "vh_demo_acme",
        "sk_demo_acme",
        "agent_acme-support",
        "conformance",
    ),
    (
        "globex",
        "vh_demo_globex",
        "sk_demo_globex",
        "agent_globex-sales",
        "panicker",
    ),
];

/// `serve` in-process and its admin API on a loopback port.
struct Hosted {
    tenancy: Arc<Tenancy>,
    admin: String,
    api: tokio::task::JoinHandle<()>,
}

impl Hosted {
    async fn start(config: &Path) -> Result<Hosted> {
        let config = ServeConfig::read(config)?;
        // The demo compiles in its own process (it has no `voicehost` binary beside it); `serve` compiles
        // in a child under `[compile]`'s bounds.
        let tenancy = Tenancy::open(&config, None)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let admin = format!("http://{}", listener.local_addr()?);
        let api = voicehost::api::start_serving(
            &tenancy,
            listener,
            &config.admin,
            None,
            std::future::pending(),
        )
        .await;
        Ok(Hosted {
            tenancy,
            admin,
            api,
        })
    }

    fn client(&self, token: &str) -> Result<Client> {
        Client::new(
            &self.admin,
            token.to_string(),
            Duration::from_secs(60),
            None,
        )
    }

    async fn stop(self) {
        self.tenancy.shutdown().await;
        self.api.abort();
    }
}

pub async fn run() -> Result<()> {
    // Absolute, whatever TMPDIR says: the config names its key files by this path.
    let dir = std::path::absolute(std::env::temp_dir())?
        .join(format!("voicehost-demo-{}", std::process::id()));
    let result = tour(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn tour(dir: &Path) -> Result<()> {
    println!("\n== many tenants: voicehost serve");
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        accounts: TENANTS
            .iter()
            .map(|(_, _, key, agent, _)| Account {
                api_key: key.to_string(),
                agents: vec![agent.to_string()],
            })
            .collect(),
        ..SimConfig::default()
    })
    .await?;
    let config = write_config(dir, &sim.url())?;
    println!(
        "config {} (two tenants), data under {}",
        config.display(),
        dir.join("data").display()
    );
    let hosted = Hosted::start(&config).await?;
    println!("admin API on {}", hosted.admin);

    for (tenant, token, _, agent, example) in TENANTS {
        let wasm = crate::shared::component(example)?;
        let started = Instant::now();
        let path = format!("/v1/agents/{agent}/versions?activate=true");
        let version: VersionView = hosted
            .client(token)?
            .request(Method::POST, &path, Body::Wasm(wasm))
            .await?;
        println!(
            "{tenant} uploads {example}.wasm as {agent}: version {}, validated, compiled and active in {} ms",
            version.version,
            started.elapsed().as_millis()
        );
    }
    for (tenant, _, _, agent, _) in TENANTS {
        let mut call = sim.connection_for(Some(agent)).await?.start_text();
        call.expect_frame("the greeting", |j| j["type"] == "agent.say")
            .await?;
        call.say("echo hello from the simulator");
        call.expect_say("hello from the simulator").await?;
        println!("\n{tenant}'s call to {agent}:");
        crate::shared::transcript(&sim, &call);
        call.end("completed");
    }

    let (acme, globex) = (TENANTS[0], TENANTS[1]);
    let seen: AgentList = hosted
        .client(acme.1)?
        .request(Method::GET, "/v1/agents", Body::Empty)
        .await?;
    println!(
        "\nwhat acme's token lists (globex's agent is not there):\n{}",
        agents_table(&seen)
    );
    let other = format!("/v1/agents/{}", globex.3);
    let refused = hosted
        .client(acme.1)?
        .request::<AgentView>(Method::GET, &other, Body::Empty)
        .await;
    println!(
        "acme asking for globex's agent: {}",
        refused
            .err()
            .map_or("answered (it must not be)".into(), |e| e.to_string())
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = voicehost::api::render_metrics(
        &hosted.tenancy.stats(),
        Some(voicehost::api::HostCounts {
            compilations: &hosted.tenancy.compilations,
            cache_loads: &hosted.tenancy.cache_loads,
            admin_refused: &hosted.tenancy.admin_refused,
            cluster: None,
        }),
    );
    println!("\nfrom /metrics:");
    for line in metrics.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("voicehost_sessions_started_total")
                || l.starts_with("voicehost_sessions_ended_total")
                || l.starts_with("voicehost_compilations_total"))
    }) {
        println!("  {line}");
    }

    hosted.stop().await;
    let started = Instant::now();
    let hosted = Hosted::start(&config).await?;
    println!(
        "\nrestarted on the same data directory: serving again in {} ms, {} compilations, {} from the compiled cache",
        started.elapsed().as_millis(),
        hosted.tenancy.compilations.get(),
        hosted.tenancy.cache_loads.get()
    );
    let mut call = sim.connection_for(Some(acme.3)).await?.start_text();
    call.expect_frame("the greeting", |j| j["type"] == "agent.say")
        .await?;
    call.end("completed");
    println!("and {} takes calls again", acme.3);
    hosted.stop().await;
    sim.shutdown();
    Ok(())
}

/// `voicehost.toml` for the two tenants, their keys in files beside it.
fn write_config(dir: &Path, sent_url: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut config = format!("data_dir = \"data\"\nsent_url = \"{sent_url}\"\n");
    for (tenant, token, key, _, _) in TENANTS {
        let key_file = dir.join(format!("{tenant}.key"));
        std::fs::write(&key_file, key)?;
        config.push_str(&format!(
            "\n[[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}\"\n",
            token_sha256(token),
            key_file.display()
        ));
    }
    let path = dir.join("voicehost.toml");
    std::fs::write(&path, config).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
