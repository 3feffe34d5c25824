//! What the multi-tenant tests share: `voicehost serve` in-process, with its admin API on a loopback
//! port, two tenants (acme and globex) whose agents connect to the Sent simulator, and a small HTTP client.

use sentsim::sim::Account;
use sentsim::{ConnHandle, Sim, SimConfig};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use voicehost::tenancy::Tenancy;
use voicehost::tenancy::{token_sha256, ServeConfig};

/// acme's bearer token for the admin API; the config holds only its SHA-256.
pub const ACME_TOKEN: &str = "vh_acme_admin_token_do_not_leak";
/// globex's bearer token for the admin API; the config holds only its SHA-256.
pub const GLOBEX_TOKEN: &str = "vh_globex_admin_token_do_not_leak";
/// acme's Sent API key, written to `acme.key` in the test's directory: it owns `agent_acme` and
/// `agent_acme2`.
pub const ACME_KEY: &str = "sk_acme_sent_key_do_not_leak";
/// globex's Sent API key, written to `globex.key` in the test's directory: it owns `agent_globex`.
pub const GLOBEX_KEY: &str = "sk_globex_sent_key_do_not_leak";

/// The simulator, and the tenancy hosting acme and globex on it.
pub struct Hosting {
    /// The simulated Sent the tenants' agents connect to.
    pub sim: Sim,
    /// The tenants as `voicehost serve` holds them, for tests to inspect and drive directly.
    pub tenancy: Arc<Tenancy>,
    /// The admin API's base URL.
    pub admin: String,
    /// The test's own directory: the config, the tenants' key files and the data directory `data`.
    pub dir: PathBuf,
    config: PathBuf,
    api: tokio::task::JoinHandle<()>,
}

/// The Sent accounts of both tenants.
fn accounts() -> Vec<Account> {
    vec![
        Account {
            api_key: ACME_KEY.into(),
            agents: vec!["agent_acme".into(), "agent_acme2".into()],
        },
        Account {
            api_key: GLOBEX_KEY.into(),
            agents: vec!["agent_globex".into()],
        },
    ]
}

impl Hosting {
    /// A fresh data directory named `name`; `acme` is appended to acme's `[[tenants]]` table (its limits,
    /// its HTTP policy).
    pub async fn start(name: &str, acme: &str) -> Hosting {
        Hosting::start_with(name, "", acme).await
    }

    /// [`Hosting::start`], with `top` among the config's top-level tables (before the tenants).
    pub async fn start_with(name: &str, top: &str, acme: &str) -> Hosting {
        crate::init_tracing();
        let sim = Sim::start_local(SimConfig {
            heartbeat_interval_ms: 1000,
            accounts: accounts(),
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let dir = crate::tmp_dir().join(format!("hosting-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("acme.key"), ACME_KEY).unwrap();
        std::fs::write(dir.join("globex.key"), GLOBEX_KEY).unwrap();
        let config = dir.join("voicehost.toml");
        let tenants = format!(
            "{}{}\n{acme}\n",
            tenant("globex", GLOBEX_TOKEN, &dir),
            tenant("acme", ACME_TOKEN, &dir)
        );
        write_config(&config, &sim.url(), top, &tenants);
        Hosting::open(sim, dir, config).await
    }

    /// Writes a config with these `[[tenants]]` tables (see [`tenant`]) and reloads it, as SIGHUP does.
    pub async fn reload(&self, tenants: &str) -> anyhow::Result<()> {
        write_config(&self.config, &self.sim.url(), "", tenants);
        let config = ServeConfig::read(&self.config)?;
        self.tenancy.reload(&config).await
    }

    /// A `[[tenants]]` table for `id` with this admin token, its key in `<id>.key` of the data directory.
    pub fn tenant(&self, id: &str, token: &str) -> String {
        tenant(id, token, &self.dir)
    }

    async fn open(sim: Sim, dir: PathBuf, config: PathBuf) -> Hosting {
        let parsed = ServeConfig::read(&config).unwrap();
        let tenancy = Tenancy::open(&parsed, Some(crate::voicehost_binary())).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = format!("http://{}", listener.local_addr().unwrap());
        // The admin listener `serve` uses, with the config's `[admin]` limits.
        let api = voicehost::api::start_serving(
            &tenancy,
            listener,
            &parsed.admin,
            None,
            std::future::pending(),
        )
        .await;
        Hosting {
            sim,
            tenancy,
            admin,
            dir,
            config,
            api,
        }
    }

    /// Stops the host and opens a new one on the same data directory and config, as a restart does.
    pub async fn restart(self) -> Hosting {
        self.tenancy.shutdown().await;
        self.api.abort();
        Hosting::open(self.sim, self.dir, self.config).await
    }

    /// Files under the data directory's `sub` (components, compiled), but the registry's index.
    pub fn files(&self, sub: &str) -> Vec<String> {
        std::fs::read_dir(self.dir.join("data").join(sub))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name != "index.json")
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A request to the admin API: (status, body as JSON, or as a string when it is not JSON).
    pub async fn api(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        request(&self.admin, method, path, token, body).await
    }

    /// Uploads an example agent as acme's (or another tenant's) `agent`, activating it; returns the version.
    pub async fn deploy(&self, token: &str, agent: &str, guest: &str) -> u64 {
        let (status, body) = self
            .api(
                "POST",
                &format!("/v1/agents/{agent}/versions?activate=true"),
                Some(token),
                crate::guest(guest),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["version"].as_u64().unwrap()
    }

    /// The newest connection of `agent` the simulator holds.
    pub async fn connection(&self, agent: &str) -> ConnHandle {
        self.sim.connection_for(Some(agent)).await.unwrap()
    }

    /// The text of `GET /metrics` (asked without a token), in Prometheus's text format.
    ///
    /// # Panics
    /// If the answer is not 200.
    pub async fn metrics(&self) -> String {
        let (status, body) = self.api("GET", "/metrics", None, Vec::new()).await;
        assert_eq!(status, 200);
        body.as_str().unwrap().to_string()
    }

    /// Stops everything and removes the data directory.
    pub async fn finish(self) {
        let violations = self.sim.violations_since(0);
        assert!(
            violations.is_empty(),
            "the host broke protocol rules: {violations:#?}"
        );
        self.tenancy.shutdown().await;
        self.api.abort();
        self.sim.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tenant(id: &str, token: &str, dir: &std::path::Path) -> String {
    format!(
        "\n[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}/{id}.key\"\n",
        token_sha256(token),
        dir.display()
    )
}

fn write_config(path: &std::path::Path, sent_url: &str, top: &str, tenants: &str) {
    let text = format!("data_dir = \"data\"\nsent_url = \"{sent_url}\"\n{top}\n{tenants}");
    std::fs::write(path, text).unwrap();
}

/// The value of one metric sample, by its name and labels as written (`name{labels}`).
pub fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
        .parse()
        .unwrap()
}

/// One HTTP/1.1 request on a fresh connection (see [`crate::admin`]).
pub async fn request(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, Value) {
    crate::admin::send(base, method, path, token, body)
        .await
        .unwrap_or_else(|error| panic!("{method} {path}: {error:#}"))
}
