//! `voicehost.toml`: where the host keeps its data, where the admin API listens, where Sent is, the tenants
//! and their limits. Every table refuses unknown keys, so a typo is an error at start, not a silent default.

use crate::agent::{ApiKey, Dial, SENT_URL};
use crate::sandbox::limits::{self, ResolvedLimits};
use crate::sandbox::outbound::{self, HttpPolicy, Origin};
use crate::sandbox::CompileBounds;
use crate::tenancy::quota::Quota;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Components, the registry's index and compiled artifacts live here.
    pub data_dir: PathBuf,
    /// Sent's connect endpoint.
    #[serde(default = "default_sent_url")]
    pub sent_url: String,
    /// Connections to Sent per active agent, 1 to [`MAX_CONNECTIONS`].
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Live calls this host holds at once across every tenant, 1 to [`limits::MAX_CALLS_CAP`]: the size
    /// of the shared instance pool (see [`limits::MAX_CALLS_CAP`] for the address space each reserves).
    /// A call past it gets its agent's failure policy, as one past a session cap does.
    #[serde(default = "default_max_calls")]
    pub max_calls: usize,
    /// The guests' linear memory across every call, in MiB (16 to 16777216): a guest whose memory would
    /// grow past it (less what other tenants reserved) traps (`host_memory`), so the kernel's OOM killer
    /// never ends every tenant's calls. Left out: three quarters of the machine's memory, or of the
    /// cgroup's limit when it has a lower one.
    pub guest_memory_mib: Option<u64>,
    /// The admin API's listener and the `/metrics` token (`[admin]`).
    #[serde(default)]
    pub admin: AdminConfig,
    /// Defaults for every tenant and agent.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What compiling one upload may cost, and how many compile at once (`[compile]`).
    #[serde(default)]
    pub compile: CompileConfig,
    /// What every tenant may keep, unless its own `[tenants.quota]` says otherwise (`[quota]`).
    #[serde(default)]
    pub quota: QuotaConfig,
    /// The tenants (`[[tenants]]`), as written; [`ServeConfig::tenants()`] reads and checks them.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Cluster mode (`[cluster]`): the registry shared with other hosts through NATS JetStream. Left out,
    /// the registry is this host's own, under `data_dir`.
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: the NATS servers every host of the cluster shares, and who this host is among them. The
/// registry's index is a JetStream KV bucket and the components an object store; the compiled cache stays
/// on each host (compiled code is never shared).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// NATS URLs (`nats://host:port` or `tls://host:port`); the client also learns the cluster's others.
    pub servers: Vec<String>,
    /// A NATS credentials file (a user JWT and its nkey seed), relative to the config's directory.
    pub credentials: Option<PathBuf>,
    /// This host's name in the cluster (1–64 of `A-Z a-z 0-9 _ -`); the machine's hostname (a pod's
    /// name) when left out.
    pub host_id: Option<String>,
    /// The first part of the buckets' names: `PREFIX-registry` (KV) and `PREFIX-components` (objects).
    #[serde(default = "default_bucket_prefix")]
    pub bucket_prefix: String,
    /// Copies JetStream keeps of each bucket, when this host creates them (1, 3 or 5; 1).
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// How long a host that leaves (SIGTERM) hands its calls to the others before it closes its
    /// connections with what is left (1–3600 s; 30). Kubernetes' grace period must cover it and 10 s more.
    #[serde(default = "default_leave_seconds")]
    pub leave_seconds: u64,
}

fn default_leave_seconds() -> u64 {
    30
}

/// `url` with the user and password it may carry (`nats://user:password@host`) replaced by `***`.
fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split('/').next().and_then(|a| a.rsplit_once('@')) {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn default_bucket_prefix() -> String {
    "voicehost".into()
}

fn default_replicas() -> usize {
    1
}

impl ClusterConfig {
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.servers.is_empty() && self.servers.len() <= 64,
            "cluster.servers: name 1 to 64 NATS servers"
        );
        for server in &self.servers {
            let scheme = server.split_once("://").map(|(scheme, _)| scheme);
            anyhow::ensure!(
                matches!(scheme, Some("nats" | "tls"))
                    && server.len() <= 512
                    && server.parse::<async_nats::ServerAddr>().is_ok(),
                "cluster.servers: {:?} is not a nats:// or tls:// URL",
                without_credentials(server)
            );
        }
        if let Some(id) = &self.host_id {
            anyhow::ensure!(
                valid_id(id),
                "cluster.host_id = {id:?}: use 1–64 letters, digits, `_` or `-`"
            );
        }
        anyhow::ensure!(
            valid_id(&self.bucket_prefix) && self.bucket_prefix.len() <= 32,
            "cluster.bucket_prefix = {:?}: use 1–32 letters, digits, `_` or `-`",
            self.bucket_prefix
        );
        anyhow::ensure!(
            matches!(self.replicas, 1 | 3 | 5),
            "cluster.replicas = {}: use 1, 3 or 5",
            self.replicas
        );
        anyhow::ensure!(
            (1..=3600).contains(&self.leave_seconds),
            "cluster.leave_seconds = {}: use 1 to 3600",
            self.leave_seconds
        );
        Ok(())
    }

    /// The servers as they may be logged: a user and password in a URL replaced by `***`.
    pub fn servers_for_log(&self) -> String {
        let shown: Vec<String> = self
            .servers
            .iter()
            .map(|s| without_credentials(s))
            .collect();
        shown.join(",")
    }

    /// This host's id: `host_id`, or the machine's hostname made into one.
    pub fn host_id(&self) -> String {
        if let Some(id) = &self.host_id {
            return id.clone();
        }
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let id: String = name
            .trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(64)
            .collect();
        if id.is_empty() {
            format!("host-{}", std::process::id())
        } else {
            id
        }
    }
}

/// `[compile]`: what compiling one upload may cost, and how many compile at once. Each compile runs in a
/// child process under these bounds; one over them is refused (`422 over_limits`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompileConfig {
    /// CPU seconds one compile may take; its wall-clock deadline is twice this plus a second.
    pub cpu_seconds: u64,
    /// Address space of one compiling process, in MiB.
    pub memory_mib: u64,
    /// Compiles at once across tenants (each tenant's one at a time).
    pub at_once: usize,
    /// Seconds of a compile slot one tenant's compiles may hold per hour, refused ones included (see
    /// `tenancy::compiling`).
    pub tenant_seconds_per_hour: u64,
}

impl Default for CompileConfig {
    fn default() -> Self {
        CompileConfig {
            cpu_seconds: CompileBounds::DEFAULT.cpu.as_secs(),
            memory_mib: CompileBounds::DEFAULT.memory_bytes >> 20,
            at_once: 2,
            tenant_seconds_per_hour: 900,
        }
    }
}

impl CompileConfig {
    /// The bounds of one compile.
    pub fn bounds(&self) -> CompileBounds {
        CompileBounds {
            cpu: Duration::from_secs(self.cpu_seconds),
            memory_bytes: self.memory_mib << 20,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        within(
            "compile",
            &[
                ("cpu_seconds", self.cpu_seconds, 1, 3600),
                ("memory_mib", self.memory_mib, 256, 65_536),
                ("at_once", self.at_once as u64, 1, 16),
                (
                    "tenant_seconds_per_hour",
                    self.tenant_seconds_per_hour,
                    1,
                    16 * 3600,
                ),
            ],
        )
    }
}

/// `[quota]` (for every tenant) and `[tenants.quota]` (one tenant's, over it): what a tenant may keep on
/// the host's disk (see [`Quota`]).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Versions, across all the tenant's agents (1 to 100000; 100).
    pub versions: Option<u64>,
    /// MiB of the components its versions hold, each once (1 to 1048576; 1024).
    pub stored_mib: Option<u64>,
    /// MiB of their compiled forms (1 to 4194304; 4096).
    pub compiled_mib: Option<u64>,
}

impl QuotaConfig {
    /// These settings, the ones left out taken from `base`.
    fn over(&self, base: &QuotaConfig) -> QuotaConfig {
        QuotaConfig {
            versions: self.versions.or(base.versions),
            stored_mib: self.stored_mib.or(base.stored_mib),
            compiled_mib: self.compiled_mib.or(base.compiled_mib),
        }
    }

    /// The quota, the settings left out at their defaults, each checked against its range.
    fn resolve(&self) -> anyhow::Result<Quota> {
        let default = Quota::DEFAULT;
        let versions = self.versions.unwrap_or(default.versions);
        let stored_mib = self.stored_mib.unwrap_or(default.stored_bytes >> 20);
        let compiled_mib = self.compiled_mib.unwrap_or(default.compiled_bytes >> 20);
        within(
            "quota",
            &[
                ("versions", versions, 1, 100_000),
                ("stored_mib", stored_mib, 1, 1 << 20),
                ("compiled_mib", compiled_mib, 1, 4 << 20),
            ],
        )?;
        Ok(Quota {
            versions,
            stored_bytes: stored_mib << 20,
            compiled_bytes: compiled_mib << 20,
        })
    }
}

/// Checks each (name, value, least, most) of the table `table`.
fn within(table: &str, settings: &[(&str, u64, u64, u64)]) -> anyhow::Result<()> {
    for &(name, value, least, most) in settings {
        anyhow::ensure!(
            (least..=most).contains(&value),
            "{table}.{name} = {value}: use {least} to {most}"
        );
    }
    Ok(())
}

/// `[admin]`: where the admin API listens, who may read `/metrics`, and what its clients may hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The admin API's listener: loopback by default. Plain HTTP is served on loopback only; any other
    /// address needs `tls_cert` and `tls_key`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The admin API's certificate chain (PEM, the server's own first); with `tls_key`, the API is
    /// served in TLS. Both are read again on SIGHUP. Relative to the config file's directory.
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    /// The SHA-256 (hex) of the operator's token for `/metrics`. When set, `/metrics` needs it (it names
    /// every tenant's agents); when not, `/metrics` is open to whoever reaches the listener.
    pub metrics_token_sha256: Option<String>,
    /// How long an upload's body may take to arrive, in seconds (1 to 3600); then `408 timeout`.
    #[serde(default = "default_upload_timeout_seconds")]
    pub upload_timeout_seconds: u64,
    /// Uploads one tenant may have in progress at once (1 to 64), from the first byte of the body to the
    /// answer; one more is `429 busy`. What uploads hold in memory is at most this × the tenants ×
    /// their `component_mib`.
    #[serde(default = "default_uploads_per_tenant")]
    pub uploads_per_tenant: usize,
    /// Admin connections open at once from everyone (1 to 65536); one more is closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Admin connections open at once from one client address (1 to 65536).
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
    /// Seconds a request's head may take to arrive, and a connection may sit idle (1 to 300).
    #[serde(default = "default_head_timeout_seconds")]
    pub head_timeout_seconds: u64,
    /// Seconds an admin connection may stay open at all (1 to 86400): bounds a client that stops reading.
    #[serde(default = "default_connection_max_seconds")]
    pub connection_max_seconds: u64,
    /// Failed logins one client address may make per minute (1 to 10000); then `429 busy`.
    #[serde(default = "default_failed_logins_per_minute")]
    pub failed_logins_per_minute: u32,
    /// Requests one tenant may make per second, with a burst of twice that (1 to 100000); then
    /// `429 busy`.
    #[serde(default = "default_requests_per_second")]
    pub requests_per_second: u32,
    /// TLS handshakes the admin listener begins per second, from everyone (1 to 100000); a connection
    /// past it is closed at once. Bounds what the handshakes' signatures take from the calls' CPU.
    #[serde(default = "default_tls_handshakes_per_second")]
    pub tls_handshakes_per_second: u32,
}

fn default_tls_handshakes_per_second() -> u32 {
    100
}

fn default_connection_max_seconds() -> u64 {
    600
}

fn default_failed_logins_per_minute() -> u32 {
    10
}

fn default_requests_per_second() -> u32 {
    50
}

impl AdminConfig {
    /// The admin API's certificate and key, when it is served in TLS.
    pub fn tls(&self) -> Option<crate::tls::CertFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::tls::CertFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => anyhow::bail!("admin.tls_cert is set: set admin.tls_key too"),
            (None, Some(_)) => anyhow::bail!("admin.tls_key is set: set admin.tls_cert too"),
            (None, None) if !self.listen.ip().is_loopback() => anyhow::bail!(
                "admin.listen = {}: plain HTTP is served on loopback only (the admin tokens would \
                 cross the network in clear); set admin.tls_cert and admin.tls_key, or listen on \
                 127.0.0.1 behind a TLS proxy",
                self.listen
            ),
            _ => {}
        }
        within(
            "admin",
            &[
                (
                    "upload_timeout_seconds",
                    self.upload_timeout_seconds,
                    1,
                    3600,
                ),
                ("uploads_per_tenant", self.uploads_per_tenant as u64, 1, 64),
                ("max_connections", self.max_connections as u64, 1, 65_536),
                (
                    "max_connections_per_client",
                    self.max_connections_per_client as u64,
                    1,
                    65_536,
                ),
                ("head_timeout_seconds", self.head_timeout_seconds, 1, 300),
                (
                    "connection_max_seconds",
                    self.connection_max_seconds,
                    1,
                    86_400,
                ),
                (
                    "failed_logins_per_minute",
                    self.failed_logins_per_minute.into(),
                    1,
                    10_000,
                ),
                (
                    "requests_per_second",
                    self.requests_per_second.into(),
                    1,
                    100_000,
                ),
                (
                    "tls_handshakes_per_second",
                    self.tls_handshakes_per_second.into(),
                    1,
                    100_000,
                ),
            ],
        )
    }
}

fn default_max_connections() -> usize {
    256
}

fn default_max_connections_per_client() -> usize {
    32
}

fn default_head_timeout_seconds() -> u64 {
    10
}

fn default_upload_timeout_seconds() -> u64 {
    120
}

fn default_uploads_per_tenant() -> usize {
    2
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_listen(),
            tls_cert: None,
            tls_key: None,
            metrics_token_sha256: None,
            upload_timeout_seconds: default_upload_timeout_seconds(),
            uploads_per_tenant: default_uploads_per_tenant(),
            max_connections: default_max_connections(),
            max_connections_per_client: default_max_connections_per_client(),
            head_timeout_seconds: default_head_timeout_seconds(),
            connection_max_seconds: default_connection_max_seconds(),
            failed_logins_per_minute: default_failed_logins_per_minute(),
            requests_per_second: default_requests_per_second(),
            tls_handshakes_per_second: default_tls_handshakes_per_second(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7070))
}

/// The longest bearer token the admin API hashes, in bytes (`voicehost token new` makes 67). A longer one
/// is refused before any hashing: a request's header may be as long as hyper's head buffer (about
/// 400 KB), and hashing that for every login attempt would be work anybody could ask of the host.
pub const MAX_TOKEN_BYTES: usize = 256;

/// A token known by its hash.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// Parses 64 hex digits, saying which setting was wrong.
    pub fn parse(hex: &str, what: &str) -> anyhow::Result<TokenHash> {
        parse_hash(hex).map(TokenHash).ok_or_else(|| {
            anyhow::anyhow!("{what} must be 64 hex digits (`voicehost token new` makes one)")
        })
    }

    /// The hash of a token a request presented, computed once per request; `None` when it is longer than
    /// [`MAX_TOKEN_BYTES`] (no token the config can hold is).
    pub fn of_presented(token: &str) -> Option<TokenHash> {
        (token.len() <= MAX_TOKEN_BYTES).then(|| TokenHash(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether a presented token's hash is this one (compared in constant time).
    pub fn matches(&self, presented: &TokenHash) -> bool {
        presented
            .0
            .iter()
            .zip(self.0.iter())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
}

/// Limits as written: any may be left out, to take the level above's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Linear memory per call's instance.
    pub memory_mib: Option<u64>,
    /// Guest CPU time per handler call.
    pub cpu_ms: Option<u64>,
    /// Wall-clock time per handler call, waits in `tool` and HTTP included.
    pub wall_ms: Option<u64>,
    /// Concurrent calls: the tenant's total in `[limits]` and a tenant's `limits`, the agent's own in an
    /// agent's `limits`.
    pub max_sessions: Option<usize>,
    /// Guest log lines per second per call.
    pub log_lines_per_second: Option<u32>,
    /// The largest component an upload may be.
    pub component_mib: Option<u64>,
}

impl LimitsConfig {
    /// `self`, with what it leaves out taken from `under`.
    fn over(&self, under: &LimitsConfig) -> LimitsConfig {
        LimitsConfig {
            memory_mib: self.memory_mib.or(under.memory_mib),
            cpu_ms: self.cpu_ms.or(under.cpu_ms),
            wall_ms: self.wall_ms.or(under.wall_ms),
            max_sessions: self.max_sessions.or(under.max_sessions),
            log_lines_per_second: self.log_lines_per_second.or(under.log_lines_per_second),
            component_mib: self.component_mib.or(under.component_mib),
        }
    }
}

impl LimitsConfig {
    /// These limits, with what they leave out taken from the defaults.
    fn resolve(&self) -> ResolvedLimits {
        let config = self;
        let d = limits::DEFAULTS;
        ResolvedLimits {
            memory_mib: config.memory_mib.unwrap_or(d.memory_mib),
            cpu_ms: config.cpu_ms.unwrap_or(d.cpu_ms),
            wall_ms: config.wall_ms.unwrap_or(d.wall_ms),
            max_sessions: config.max_sessions.unwrap_or(d.max_sessions),
            log_lines_per_second: config
                .log_lines_per_second
                .unwrap_or(d.log_lines_per_second),
            component_mib: config.component_mib.unwrap_or(d.component_mib),
        }
    }
}

/// One `[[tenants]]` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name in the registry, logs and metrics.
    pub id: String,
    /// The SHA-256 (lowercase hex) of the tenant's admin token: the host never holds the token itself.
    /// `voicehost token new` makes a token and this line.
    pub token_sha256: String,
    /// The environment variable holding the tenant's Sent API key…
    pub api_key_env: Option<String>,
    /// …or a file holding it.
    pub api_key_file: Option<PathBuf>,
    /// The tenant's limits over `[limits]`; its `max_sessions` is its total over all its agents.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Calls set aside for the tenant (0 by default, at most its `max_sessions`): this many pool slots,
    /// and the guest memory they may grow to (× its largest `memory_mib`), are kept free for it whatever
    /// other tenants hold. Every tenant's added up must fit `max_calls` and `guest_memory_mib`. Past
    /// them, its calls share what nobody reserved, first come, first served.
    #[serde(default)]
    pub reserved_calls: usize,
    /// Where the tenant's agents may send HTTP requests (`[tenants.http]`).
    #[serde(default)]
    pub http: HttpConfig,
    /// What the tenant may keep, over `[quota]` (`[tenants.quota]`).
    #[serde(default)]
    pub quota: QuotaConfig,
    /// Per agent: `[tenants.agents.agent_x]` with `limits`.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentOverrides>,
}

/// One agent's entry in `[tenants.agents]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentOverrides {
    /// The agent's limits over the tenant's; its `max_sessions` is its own cap, never above the tenant's
    /// total.
    #[serde(default)]
    pub limits: LimitsConfig,
}

/// Where a tenant's agents may send HTTP requests.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Origins: `https://api.example.com`, `http://127.0.0.1:8089`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Origins of `allow` whose host names may resolve to loopback, private, link-local or other
    /// non-public addresses (a name's addresses must otherwise all be public; an IP literal in `allow`
    /// needs no entry here).
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// The connect, first-byte and between-bytes timeout and the bound of a whole request, in ms (10 s when
    /// left out).
    pub timeout_ms: Option<u64>,
    /// The largest response body a guest may receive, in KiB (1 MiB when left out).
    pub max_response_kib: Option<u64>,
}

/// One tenant, ready to serve: its key read, its limits resolved.
pub struct Tenant {
    /// The tenant's id: its name in the registry, logs and metrics.
    pub id: String,
    token: TokenHash,
    /// Its Sent API key, read from its environment variable or file.
    pub api_key: ApiKey,
    /// Its limits, resolved; `max_sessions` is its total over all its agents.
    pub limits: ResolvedLimits,
    agent_limits: BTreeMap<String, ResolvedLimits>,
    /// Where its agents may send HTTP requests.
    pub http: Arc<HttpPolicy>,
    /// What it may keep.
    pub quota: Quota,
    /// Pool slots set aside for it (`reserved_calls`).
    pub reserved_calls: usize,
    /// Guest memory set aside for it, in bytes: its reserved calls at its largest `memory_mib`.
    pub reserved_memory: u64,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("id", &self.id)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Tenant {
    /// Whether a presented token (by its hash) is this tenant's admin token, compared in constant time.
    pub fn owns_token(&self, presented: &TokenHash) -> bool {
        self.token.matches(presented)
    }

    /// The limits of one of its agents: the agent's overrides over the tenant's. The agent's own session
    /// cap is only what its overrides say (otherwise only the tenant's total applies).
    pub fn agent_limits(&self, agent: &str) -> ResolvedLimits {
        self.agent_limits
            .get(agent)
            .cloned()
            .unwrap_or_else(|| self.limits.clone())
    }

    /// The most linear memory one of its calls may have: its agents' largest `memory_mib`, in bytes.
    pub fn largest_memory_bytes(&self) -> u64 {
        self.agent_limits
            .values()
            .map(|l| l.memory_mib)
            .fold(self.limits.memory_mib, u64::max)
            << 20
    }

    /// The agent's own cap on concurrent calls, when it has one.
    pub fn agent_session_cap(&self, agent: &str) -> Option<usize> {
        self.agent_limits.get(agent).map(|l| l.max_sessions)
    }
}

/// The hash the config holds for an admin token.
pub fn token_sha256(token: &str) -> String {
    crate::content::hex(&Sha256::digest(token.as_bytes()))
}

fn default_sent_url() -> String {
    SENT_URL.into()
}

fn default_connections() -> usize {
    limits::CONNECTIONS
}

fn default_max_calls() -> usize {
    limits::MAX_CALLS
}

/// The most connections to Sent one agent may keep (`connections`): more add nothing but sockets.
pub const MAX_CONNECTIONS: usize = 16;

/// The longest Sent API key read from a tenant's file: a file longer than this is not a key.
pub const MAX_API_KEY_BYTES: usize = 4 << 10;

/// Where a tenant's Sent API key is, as its config says.
#[derive(Debug, Clone, Copy)]
pub enum KeySource<'a> {
    /// In this environment variable (`api_key_env`).
    Env(&'a str),
    /// In this file (`api_key_file`).
    File(&'a Path),
}

impl KeySource<'_> {
    /// Reads the key: the variable, or the file's first [`MAX_API_KEY_BYTES`] bytes, trimmed.
    pub fn read(self) -> anyhow::Result<String> {
        match self {
            KeySource::Env(var) => std::env::var(var)
                .map_err(|_| anyhow::anyhow!("the environment variable {var} is not set")),
            KeySource::File(path) => {
                // A key, and room for the line ends and spaces around it; a longer file is not a key.
                let most = MAX_API_KEY_BYTES + 64;
                let mut text = String::new();
                std::fs::File::open(path)
                    .and_then(|file| file.take(most as u64 + 1).read_to_string(&mut text))
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                let key = text.trim();
                anyhow::ensure!(
                    text.len() <= most && key.len() <= MAX_API_KEY_BYTES,
                    "{} is longer than a key ({MAX_API_KEY_BYTES} bytes)",
                    path.display()
                );
                Ok(key.to_string())
            }
        }
    }
}

impl TenantConfig {
    /// Where its key is: exactly one of `api_key_env` and `api_key_file`.
    pub fn key_source(&self) -> anyhow::Result<KeySource<'_>> {
        match (&self.api_key_env, &self.api_key_file) {
            (Some(var), None) => Ok(KeySource::Env(var)),
            (None, Some(file)) => Ok(KeySource::File(file)),
            _ => {
                anyhow::bail!("give its Sent API key as exactly one of api_key_env or api_key_file")
            }
        }
    }
}

impl HttpConfig {
    /// The policy these settings make, each checked against its maximum.
    fn policy(&self) -> anyhow::Result<HttpPolicy> {
        let origins = |key: &str, texts: &[String]| -> anyhow::Result<Vec<Origin>> {
            texts
                .iter()
                .map(|o| Origin::parse(o).map_err(|e| anyhow::anyhow!("http.{key} {o:?}: {e}")))
                .collect()
        };
        let allow = origins("allow", &self.allow)?;
        let allow_private = origins("allow_private", &self.allow_private)?;
        if let Some(stray) = allow_private.iter().find(|o| !allow.contains(o)) {
            anyhow::bail!("http.allow_private {stray}: list it in http.allow too");
        }
        let default = HttpPolicy::default();
        let timeout = match self.timeout_ms {
            None => default.timeout,
            Some(ms) => {
                let max = outbound::MAX_TIMEOUT.as_millis();
                anyhow::ensure!(
                    (1..=max).contains(&u128::from(ms)),
                    "http.timeout_ms = {ms}: use 1 to {max}"
                );
                Duration::from_millis(ms)
            }
        };
        let max_response_bytes = match self.max_response_kib {
            None => default.max_response_bytes,
            Some(kib) => {
                let max = outbound::MAX_RESPONSE_BYTES >> 10;
                anyhow::ensure!(
                    (1..=max).contains(&kib),
                    "http.max_response_kib = {kib}: use 1 to {max}"
                );
                kib << 10
            }
        };
        Ok(HttpPolicy {
            allow,
            allow_private,
            timeout,
            max_response_bytes,
            lookups: Default::default(),
            stand_ins: Vec::new(),
        })
    }
}

/// Whether an agent id is one Sent can know: `agent_` and letters, digits or `-` (the protocol's
/// `^agent_[A-Za-z0-9-]+$`), at most 64 in all.
pub fn valid_agent_id(id: &str) -> bool {
    id.len() <= 64
        && id.strip_prefix("agent_").is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// What [`valid_agent_id`] wants, for error messages.
pub const AGENT_ID_RULE: &str =
    "an agent id is Sent's: `agent_` then letters, digits or `-` (like agent_abc123), at most 64 in all";

/// Whether a tenant id is usable: 1–64 of `[A-Za-z0-9_-]`.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ServeConfig {
    /// Reads and parses the file at `path`. Every path it names (`data_dir`, `tls_cert`, `tls_key`, each
    /// tenant's `api_key_file`) is made absolute here, once, against the file's own directory: nothing
    /// below sees a relative path, whatever directory the host was started in or a child runs in. The
    /// tenants are checked later, by [`ServeConfig::tenants()`].
    pub fn read(path: &Path) -> anyhow::Result<ServeConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let mut config = ServeConfig::parse(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a valid config: {e:#}", path.display()))?;
        let absolute = std::path::absolute(path)
            .map_err(|e| anyhow::anyhow!("cannot locate {}: {e}", path.display()))?;
        let dir = absolute.parent().unwrap_or(Path::new("/"));
        config
            .anchor(dir)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
        Ok(config)
    }

    /// Makes every path of the config absolute against `dir` (the config file's directory). A path
    /// starting with `~` is refused: nothing expands it here (a service often has no `$HOME`), and taken
    /// as written it would name a directory called `~`.
    pub fn anchor(&mut self, dir: &Path) -> anyhow::Result<()> {
        let admin = &mut self.admin;
        let mut paths = vec![("data_dir".to_string(), Some(&mut self.data_dir))];
        paths.push(("admin.tls_cert".into(), admin.tls_cert.as_mut()));
        paths.push(("admin.tls_key".into(), admin.tls_key.as_mut()));
        if let Some(cluster) = &mut self.cluster {
            paths.push(("cluster.credentials".into(), cluster.credentials.as_mut()));
        }
        for tenant in &mut self.tenants {
            let key = format!("tenant {:?}: api_key_file", tenant.id);
            paths.push((key, tenant.api_key_file.as_mut()));
        }
        for (key, path) in paths {
            let Some(path) = path else { continue };
            anyhow::ensure!(
                !path.as_os_str().as_encoded_bytes().starts_with(b"~"),
                "{key} = {:?}: `~` is not expanded; write the path in full, or relative to the config file",
                path.display()
            );
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
        Ok(())
    }

    /// Parses a config's text and checks its host-wide settings (the Sent URL, the connections per agent,
    /// the calls per host, the `/metrics` token); the tenants are checked by [`ServeConfig::tenants()`].
    pub fn parse(text: &str) -> anyhow::Result<ServeConfig> {
        let config: ServeConfig = toml::from_str(text)?;
        Dial::check_url(&config.sent_url).map_err(|e| anyhow::anyhow!("sent_url: {e}"))?;
        anyhow::ensure!(
            (1..=MAX_CONNECTIONS).contains(&config.connections),
            "connections = {}: use 1 to {MAX_CONNECTIONS}",
            config.connections
        );
        limits::check_max_calls(config.max_calls)?;
        if let Some(mib) = config.guest_memory_mib {
            limits::check_guest_memory_mib(mib)?;
        }
        config.metrics_token()?;
        config.compile.check()?;
        config.admin.check()?;
        config.quota.resolve()?;
        if let Some(cluster) = &config.cluster {
            cluster.check()?;
        }
        Ok(config)
    }

    /// The operator's `/metrics` token, when the config sets one.
    pub fn metrics_token(&self) -> anyhow::Result<Option<TokenHash>> {
        self.admin
            .metrics_token_sha256
            .as_deref()
            .map(|hex| TokenHash::parse(hex, "admin.metrics_token_sha256"))
            .transpose()
    }

    /// The tenants, with their API keys read from the environment or their files and their limits resolved.
    /// Every problem is named with its tenant, never with a secret.
    pub fn tenants(&self) -> anyhow::Result<Vec<Tenant>> {
        self.tenants_with(|source| source.read())
    }

    /// [`ServeConfig::tenants()`], with the keys read by `read_key` (the fuzzing harness reads none).
    pub fn tenants_with(
        &self,
        read_key: impl Fn(KeySource<'_>) -> anyhow::Result<String>,
    ) -> anyhow::Result<Vec<Tenant>> {
        let mut seen = std::collections::HashSet::new();
        let mut tenants: Vec<Tenant> = Vec::new();
        // A token is who is asking: one hash for two tenants (or for a tenant and the operator's metrics)
        // would log one in as the other.
        let metrics_token = self.metrics_token()?;
        for tenant in &self.tenants {
            let id = &tenant.id;
            anyhow::ensure!(
                valid_id(id),
                "tenant id {id:?}: use 1–64 letters, digits, `_` or `-`"
            );
            anyhow::ensure!(seen.insert(id.clone()), "tenant {id:?} appears twice");
            let token = TokenHash::parse(
                &tenant.token_sha256,
                &format!("tenant {id:?}: token_sha256"),
            )?;
            if let Some(other) = tenants.iter().find(|t| t.token == token) {
                anyhow::bail!(
                    "tenant {id:?}: token_sha256 is tenant {:?}'s too: each tenant needs a token of its own",
                    other.id
                );
            }
            anyhow::ensure!(
                metrics_token.as_ref() != Some(&token),
                "tenant {id:?}: token_sha256 is admin.metrics_token_sha256 too: the operator's metrics \
                 token must be nobody's admin token"
            );
            let api_key = tenant
                .key_source()
                .and_then(&read_key)
                .map_err(|e| anyhow::anyhow!("tenant {id:?}: its Sent API key: {e:#}"))?;
            anyhow::ensure!(
                !api_key.is_empty(),
                "tenant {id:?}: its Sent API key is empty"
            );
            // It is sent as `Authorization: Bearer <key>`: printable ASCII without spaces, as Sent's keys are.
            anyhow::ensure!(
                api_key.bytes().all(|b| b.is_ascii_graphic()),
                "tenant {id:?}: its Sent API key holds a character that is not printable ASCII"
            );
            let own = tenant.limits.over(&self.limits);
            let limits = own.resolve();
            limits
                .check()
                .map_err(|problem| anyhow::anyhow!("tenant {id:?}: limits: {problem}"))?;
            let mut agent_limits = BTreeMap::new();
            for (agent, overrides) in &tenant.agents {
                anyhow::ensure!(
                    valid_agent_id(agent),
                    "tenant {id:?}: {agent:?} in [tenants.agents]: {AGENT_ID_RULE}"
                );
                let mut resolved = overrides.limits.over(&own).resolve();
                // An agent's cap is its own only when it sets one; it can never exceed the tenant's total.
                resolved.max_sessions = overrides
                    .limits
                    .max_sessions
                    .unwrap_or(limits.max_sessions)
                    .min(limits.max_sessions);
                resolved.check().map_err(|problem| {
                    anyhow::anyhow!("tenant {id:?}: {agent} in [tenants.agents]: limits: {problem}")
                })?;
                agent_limits.insert(agent.clone(), resolved);
            }
            let http = tenant
                .http
                .policy()
                .map_err(|e| anyhow::anyhow!("tenant {id:?}: {e:#}"))?;
            let quota = tenant
                .quota
                .over(&self.quota)
                .resolve()
                .map_err(|e| anyhow::anyhow!("tenant {id:?}: {e:#}"))?;
            anyhow::ensure!(
                tenant.reserved_calls <= limits.max_sessions,
                "tenant {id:?}: reserved_calls = {} is over its max_sessions = {}: it could never use them",
                tenant.reserved_calls,
                limits.max_sessions
            );
            let mut resolved = Tenant {
                id: id.clone(),
                token,
                api_key: ApiKey::new(api_key),
                reserved_calls: tenant.reserved_calls,
                reserved_memory: 0,
                limits,
                agent_limits,
                http: Arc::new(http),
                quota,
            };
            // At most 100,000 calls of 1 GiB each: no overflow.
            resolved.reserved_memory =
                tenant.reserved_calls as u64 * resolved.largest_memory_bytes();
            tenants.push(resolved);
        }
        reservations_fit(&tenants, self.max_calls as u64, self.guest_memory_bytes())?;
        Ok(tenants)
    }

    /// The guests' memory across every call, in bytes (see [`ServeConfig::guest_memory_mib`]).
    pub fn guest_memory_bytes(&self) -> u64 {
        self.guest_memory_mib
            .unwrap_or_else(limits::default_guest_memory_mib)
            << 20
    }

    /// What the tenants may hold together beyond the host's room, in words (none when nothing is
    /// overcommitted): calls past it are refused (`host_full`) or trap (`host_memory`) first come, first
    /// served, outside the reservations.
    pub fn overcommitted(&self, tenants: &[Tenant]) -> Vec<String> {
        let sessions: usize = tenants.iter().map(|t| t.limits.max_sessions).sum();
        let memory = tenants
            .iter()
            .map(|t| (t.limits.max_sessions as u64).saturating_mul(t.largest_memory_bytes()))
            .fold(0u64, u64::saturating_add);
        let mut said = Vec::new();
        if sessions > self.max_calls {
            said.push(format!(
                "the tenants' max_sessions add up to {sessions}, over max_calls = {}",
                self.max_calls
            ));
        }
        if memory > self.guest_memory_bytes() {
            said.push(format!(
                "the tenants' max_sessions at their memory_mib add up to {} MiB, over \
                 guest_memory_mib = {}",
                memory >> 20,
                self.guest_memory_bytes() >> 20
            ));
        }
        said
    }
}

/// Whether every tenant's reservations together fit a pool of `slots` and `memory` bytes of guests'
/// memory (the config's at start; on a reload, what the running host has: both apply from a restart).
pub fn reservations_fit(tenants: &[Tenant], slots: u64, memory: u64) -> anyhow::Result<()> {
    let calls: u64 = tenants.iter().map(|t| t.reserved_calls as u64).sum();
    anyhow::ensure!(
        calls <= slots,
        "the tenants' reserved_calls add up to {calls}, over max_calls = {slots}: lower them or raise \
         max_calls"
    );
    let reserved = tenants
        .iter()
        .map(|t| t.reserved_memory)
        .fold(0u64, u64::saturating_add);
    anyhow::ensure!(
        reserved <= memory,
        "the tenants' reserved_calls at their memory_mib add up to {} MiB, over guest_memory_mib = \
         {}: lower them or raise guest_memory_mib",
        reserved >> 20,
        memory >> 20
    );
    Ok(())
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (at, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(at * 2..at * 2 + 2)?, 16).ok()?;
    }
    Some(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ServeConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn limits_come_from_the_agent_then_the_tenant_then_the_host_then_the_defaults() {
        std::env::set_var("VOICEHOST_TEST_KEY_LIMITS", "key");
        let config = parse(&format!(
            r#"
            data_dir = "data"
            [limits]
            cpu_ms = 100
            max_sessions = 10
            [[tenants]]
            id = "acme"
            token_sha256 = "{}"
            api_key_env = "VOICEHOST_TEST_KEY_LIMITS"
            [tenants.limits]
            memory_mib = 32
            [tenants.agents.agent_big.limits]
            memory_mib = 128
            max_sessions = 50
            "#,
            token_sha256("t")
        ));
        let tenant = &config.tenants().unwrap()[0];
        assert_eq!(tenant.limits.cpu_ms, 100);
        assert_eq!(tenant.limits.memory_mib, 32);
        assert_eq!(tenant.limits.max_sessions, 10);
        assert_eq!(tenant.limits.wall_ms, limits::DEFAULTS.wall_ms);
        let big = tenant.agent_limits("agent_big");
        assert_eq!((big.memory_mib, big.cpu_ms), (128, 100));
        assert_eq!(
            tenant.agent_session_cap("agent_big"),
            Some(10),
            "never above the tenant's total"
        );
        assert_eq!(tenant.agent_limits("agent_other"), tenant.limits);
        assert_eq!(tenant.agent_session_cap("agent_other"), None);
    }

    #[test]
    fn an_agent_id_is_one_sent_accepts() {
        let longest = format!("agent_{}", "x".repeat(58));
        for good in ["agent_abc123", "agent_a-b", &longest] {
            assert!(valid_agent_id(good), "{good}");
        }
        let too_long = format!("{longest}x");
        for bad in [
            "",
            "agent_",
            "agent_a_b",
            "support",
            "Agent_x",
            "agent_a/b",
            "agent_é",
            &too_long,
        ] {
            assert!(!valid_agent_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_token_matches_only_its_own_hash() {
        std::env::set_var("VOICEHOST_TEST_KEY_TOKEN", "key");
        let config = parse(&format!(
            "data_dir = \"d\"\n[[tenants]]\nid = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_TOKEN\"\n",
            token_sha256("secret-a")
        ));
        let tenant = &config.tenants().unwrap()[0];
        let presented = |token: &str| TokenHash::of_presented(token).unwrap();
        assert!(tenant.owns_token(&presented("secret-a")));
        assert!(!tenant.owns_token(&presented("secret-b")));
        assert!(!tenant.owns_token(&presented("")));
        assert!(!format!("{tenant:?}").contains("key"));
    }

    #[test]
    fn a_token_longer_than_any_the_host_holds_is_not_hashed() {
        assert!(TokenHash::of_presented(&"t".repeat(MAX_TOKEN_BYTES)).is_some());
        assert!(TokenHash::of_presented(&"t".repeat(MAX_TOKEN_BYTES + 1)).is_none());
    }

    #[test]
    fn one_token_hash_for_two_tenants_or_a_tenant_and_the_metrics_is_refused() {
        std::env::set_var("VOICEHOST_TEST_KEY_SHARED", "key");
        let tenant = |id: &str, token: &str| {
            format!(
                "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SHARED\"\n",
                token_sha256(token)
            )
        };
        let twice = parse(&format!(
            "data_dir = \"d\"\n{}{}",
            tenant("acme", "one-token"),
            tenant("globex", "one-token")
        ));
        let error = format!("{:#}", twice.tenants().unwrap_err());
        assert!(
            error.contains("\"globex\"") && error.contains("\"acme\"'s too"),
            "{error}"
        );

        let metrics = parse(&format!(
            "data_dir = \"d\"\n[admin]\nmetrics_token_sha256 = \"{}\"\n{}",
            token_sha256("one-token"),
            tenant("acme", "one-token")
        ));
        let error = format!("{:#}", metrics.tenants().unwrap_err());
        assert!(error.contains("metrics_token_sha256"), "{error}");
        assert!(!error.contains(&token_sha256("one-token")), "{error}");
    }

    #[test]
    fn reservations_must_fit_the_pool_and_the_guests_memory_and_overcommitment_is_said() {
        std::env::set_var("VOICEHOST_TEST_KEY_RESERVED", "key");
        let config = |top: &str, acme: &str, globex: &str| {
            let tenant = |id: &str, extra: &str| {
                format!(
                    "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_RESERVED\"\n{extra}\n",
                    token_sha256(id)
                )
            };
            ServeConfig::parse(&format!(
                "data_dir = \"d\"\n{top}\n{}{}",
                tenant("acme", acme),
                tenant("globex", globex)
            ))
            .unwrap()
        };
        let fits = config(
            "max_calls = 100\nguest_memory_mib = 4096",
            "reserved_calls = 40\n[tenants.limits]\nmemory_mib = 32\n[tenants.agents.agent_big.limits]\nmemory_mib = 64",
            "reserved_calls = 20",
        );
        let tenants = fits.tenants().unwrap();
        // acme's reservation is at its largest agent's memory.
        assert_eq!(tenants[0].reserved_memory, 40 * (64 << 20));
        assert_eq!(tenants[1].reserved_memory, 20 * (64 << 20));
        // 2 × 100 sessions of 64 MiB: over both the pool and the memory, and said so.
        let said = fits.overcommitted(&tenants);
        assert!(
            said[0].contains("max_sessions add up to 200, over max_calls = 100"),
            "{said:?}"
        );
        assert!(said[1].contains("over guest_memory_mib = 4096"), "{said:?}");

        let cases = [
            (
                config(
                    "max_calls = 50",
                    "reserved_calls = 40",
                    "reserved_calls = 20",
                ),
                "reserved_calls add up to 60, over max_calls = 50",
            ),
            (
                config(
                    "guest_memory_mib = 1024",
                    "reserved_calls = 10",
                    "reserved_calls = 10",
                ),
                "add up to 1280 MiB, over guest_memory_mib = 1024",
            ),
            (
                config(
                    "",
                    "reserved_calls = 5\n[tenants.limits]\nmax_sessions = 4",
                    "",
                ),
                "tenant \"acme\": reserved_calls = 5 is over its max_sessions = 4",
            ),
        ];
        for (config, expected) in cases {
            let error = format!("{:#}", config.tenants().unwrap_err());
            assert!(error.contains(expected), "{error}");
        }
        let error = ServeConfig::parse("data_dir = \"d\"\nguest_memory_mib = 8").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("guest_memory_mib = 8: use 16 to 16777216"),
            "{error}"
        );
    }

    #[test]
    fn mistakes_are_refused_with_the_tenant_named_and_no_secret() {
        std::env::set_var("VOICEHOST_TEST_KEY_SECRET", "sk_live_do_not_print");
        std::env::set_var("VOICEHOST_TEST_KEY_SPACE", "sk_live_do not_print");
        let cases = [
            ("id = \"acme\"\ntoken_sha256 = \"abc\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"", "token_sha256"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_UNSET_VAR\"", token_sha256("t")), "VOICEHOST_TEST_UNSET_VAR"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"", token_sha256("t")), "exactly one"),
            (&format!("id = \"a/b\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"", token_sha256("t")), "tenant id"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.http]\nallow = [\"ftp://x\"]", token_sha256("t")), "http.allow"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.limits]\nmemory_mib = 4096", token_sha256("t")), "memory_mib = 4096 is over its maximum"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.http]\ntimeout_ms = 0", token_sha256("t")), "http.timeout_ms = 0: use 1 to 600000"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.http]\nallow = [\"https://a.example\"]\nallow_private = [\"http://db.internal:8080\"]", token_sha256("t")), "http.allow_private http://db.internal:8080: list it in http.allow too"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.http]\nmax_response_kib = 18014398509481984", token_sha256("t")), "http.max_response_kib = 18014398509481984: use 1 to 65536"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SPACE\"", token_sha256("t")), "not printable ASCII"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_file = \"/dev/zero\"", token_sha256("t")), "longer than a key"),
            (&format!("id = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_env = \"VOICEHOST_TEST_KEY_SECRET\"\n[tenants.agents.agent_big.limits]\ncpu_ms = 0", token_sha256("t")), "agent_big in [tenants.agents]: limits: cpu_ms must be at least 1"),
        ];
        for (tenant, expected) in cases {
            let config = parse(&format!("data_dir = \"d\"\n[[tenants]]\n{tenant}\n"));
            let error = config.tenants().unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("sk_live"), "{error}");
        }
        assert!(
            toml::from_str::<ServeConfig>("data_dir = \"d\"\nmax_sesions = 3\n").is_err(),
            "an unknown key is an error"
        );
    }

    #[test]
    fn host_settings_out_of_range_are_refused_when_parsed() {
        for (text, expected) in [
            (
                "data_dir = \"d\"\nconnections = 0",
                "connections = 0: use 1 to 16",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = []",
                "cluster.servers: name 1 to 64 NATS servers",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"http://nats:4222\"]",
                "cluster.servers: \"http://nats:4222\" is not a nats:// or tls:// URL",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"nats://a:4222,nats://b:4222\"]",
                "is not a nats:// or tls:// URL",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"http://alice:s3cret@nats:4222\"]",
                "\"http://***@nats:4222\" is not a nats:// or tls:// URL",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"nats://a:4222\"]\nhost_id = \"a b\"",
                "cluster.host_id = \"a b\": use 1–64 letters",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"nats://a:4222\"]\nreplicas = 2",
                "cluster.replicas = 2: use 1, 3 or 5",
            ),
            (
                "data_dir = \"d\"\n[cluster]\nservers = [\"nats://a:4222\"]\nbucket_prefix = \"a.b\"",
                "cluster.bucket_prefix = \"a.b\"",
            ),
            (
                "data_dir = \"d\"\nconnections = 17",
                "connections = 17: use 1 to 16",
            ),
            (
                "data_dir = \"d\"\nmax_calls = 0",
                "max_calls = 0: use 1 to 12000",
            ),
            (
                "data_dir = \"d\"\nmax_calls = 12001",
                "max_calls = 12001: use 1 to 12000",
            ),
            (
                "data_dir = \"d\"\nsent_url = \"https://voice.sent.dm/v1\"",
                "sent_url: cannot dial: the URL's scheme must be ws or wss",
            ),
            (
                "data_dir = \"d\"\nsent_url = \"not a url\"",
                "sent_url: cannot dial: the URL does not work",
            ),
            (
                "data_dir = \"d\"\n[admin]\nmetrics_token_sha256 = \"xyz\"",
                "must be 64 hex digits",
            ),
            (
                "data_dir = \"d\"\n[admin]\nlisten = \"0.0.0.0:7070\"",
                "admin.listen = 0.0.0.0:7070: plain HTTP is served on loopback only",
            ),
            (
                "data_dir = \"d\"\n[admin]\nlisten = \"[::]:7070\"",
                "plain HTTP is served on loopback only",
            ),
            (
                "data_dir = \"d\"\n[admin]\ntls_cert = \"c.pem\"",
                "admin.tls_cert is set: set admin.tls_key too",
            ),
            (
                "data_dir = \"d\"\n[admin]\ntls_key = \"k.pem\"",
                "admin.tls_key is set: set admin.tls_cert too",
            ),
            (
                "data_dir = \"d\"\n[quota]\nversions = 0",
                "quota.versions = 0: use 1 to 100000",
            ),
            (
                "data_dir = \"d\"\n[quota]\nstored = 5",
                "unknown field `stored`",
            ),
        ] {
            let error = format!("{:#}", ServeConfig::parse(text).unwrap_err());
            assert!(error.contains(expected), "{text}: {error}");
        }
        let fine = ServeConfig::parse(
            "data_dir = \"d\"\nconnections = 16\nsent_url = \"ws://127.0.0.1:9/x\"",
        );
        assert_eq!(fine.unwrap().connections, 16);
        let tls = ServeConfig::parse(
            "data_dir = \"d\"\n[admin]\nlisten = \"0.0.0.0:7070\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"",
        );
        assert!(tls.unwrap().admin.tls().is_some());
    }

    #[test]
    fn a_config_named_by_a_relative_path_has_every_path_absolute_against_its_own_directory() {
        // Relative to the directory the tests run in, as `--config voicehost.toml` is to the shell's.
        let dir = Path::new("../target/tmp").join(format!("config-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("voicehost.toml");
        std::fs::write(
            &file,
            "data_dir = \"data\"\n[admin]\ntls_cert = \"tls/cert.pem\"\ntls_key = \"/etc/voicehost/key.pem\"\n\
             [[tenants]]\nid = \"acme\"\ntoken_sha256 = \"00\"\napi_key_file = \"keys/acme.key\"\n",
        )
        .unwrap();
        let config = ServeConfig::read(&file).unwrap();
        let home = std::path::absolute(&dir).unwrap();
        assert_eq!(config.data_dir, home.join("data"));
        assert_eq!(config.admin.tls_cert, Some(home.join("tls/cert.pem")));
        assert_eq!(
            config.admin.tls_key,
            Some(PathBuf::from("/etc/voicehost/key.pem")),
            "an absolute path stays as written"
        );
        assert_eq!(
            config.tenants[0].api_key_file,
            Some(home.join("keys/acme.key"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_starting_with_a_tilde_is_refused_as_nothing_expands_it() {
        for (text, key) in [
            ("data_dir = \"~/voicehost/data\"", "data_dir"),
            ("data_dir = \"~voicehost/data\"", "data_dir"),
            (
                "data_dir = \"/d\"\n[admin]\ntls_cert = \"~/c.pem\"\ntls_key = \"/k.pem\"",
                "admin.tls_cert",
            ),
            (
                "data_dir = \"/d\"\n[[tenants]]\nid = \"acme\"\ntoken_sha256 = \"00\"\napi_key_file = \"~/acme.key\"",
                "tenant \"acme\": api_key_file",
            ),
        ] {
            let mut config = ServeConfig::parse(text).unwrap();
            let error = format!("{:#}", config.anchor(Path::new("/etc/voicehost")).unwrap_err());
            assert!(
                error.contains(key) && error.contains("`~` is not expanded"),
                "{text}: {error}"
            );
        }
        // `~` inside a name is a name.
        let mut config = ServeConfig::parse("data_dir = \"data~1\"").unwrap();
        config.anchor(Path::new("/srv")).unwrap();
        assert_eq!(config.data_dir, Path::new("/srv/data~1"));
    }
}
