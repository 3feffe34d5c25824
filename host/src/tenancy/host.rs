//! `voicehost serve`: many tenants' agents on one host. It keeps one link (the agent's connections to
//! Sent, with its tenant's key) for every agent with an active version, and changes what they serve as the
//! admin API activates, rolls back, or deletes versions. Registry changes happen one at a time, under one
//! lock; serving calls never takes it.

use super::cluster::{self, NatsStore};
use super::compiling::{CompileQueue, Payer, Turn, UploadSlots};
use super::config::{reservations_fit, ServeConfig, Tenant, TokenHash};
use super::quota::{Quota, Usage};
use super::rates::Rates;
use super::registry::{
    AgentRecord, ComponentStore, DiskStore, Registry, RegistryError, StoreError, Uploaded,
    VersionRecord,
};
use crate::agent::{Admission, AgentConfig, CallRules, Deployment, Dial, FailurePolicy, Gate};
use crate::content::{ensure_writable, remove_partials, unix_now, Digest, Spool, Spooled};
use crate::sandbox::budget::Budget;
use crate::sandbox::{
    blocking, AgentCode, ChildCompiler, HttpPolicy, Limits, LoadError, Sandbox, Wasm, World,
};
use std::path::PathBuf;

use crate::stats::{Counter, LiveSession, Stats};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod handover;
pub use handover::Left;

/// Why the server refused a change asked through the admin API.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request is wrong, e.g. an agent id Sent cannot know (a 400).
    #[error("{0}")]
    BadRequest(String),
    /// The component cannot serve as an agent.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The registry refused the change, or its store failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A valid agent whose declared needs exceed its limits (its initial memory over `memory_mib`).
    #[error("{0}")]
    OverLimits(String),
    /// The upload would take the tenant over its quota: which part, and what to do.
    #[error("{0}")]
    OverQuota(String),
    /// The tenant has as many uploads in progress as it may: try again once one has finished.
    #[error("{0}")]
    Busy(String),
    /// The tenant has spent its compile time for now (`[compile] tenant_seconds_per_hour`): try again
    /// after the wait.
    #[error("this tenant's compiles (refused ones too) have used the {per_hour} s of compile time it gets per hour: try again in {} s", wait.as_secs() + 1)]
    CompileTimeSpent {
        /// Its compile time per hour, in seconds.
        per_hour: u64,
        /// Until it may compile again.
        wait: Duration,
    },
    /// The host itself failed, e.g. a compilation that stopped.
    #[error("{0}")]
    Internal(String),
    /// The tenant is no longer in the config: a reload removed it while its request was in flight.
    #[error("tenant {0:?} is no longer in the host's config: nothing was changed")]
    NoTenant(String),
}

/// One agent being served.
struct Running {
    deployment: watch::Sender<Arc<Deployment>>,
    /// The component of the deployment's version: in a cluster, an agent deleted and uploaded again
    /// elsewhere has a version of the same number with other code.
    digest: Digest,
    stop: watch::Sender<bool>,
    stats: Arc<Stats>,
    task: JoinHandle<()>,
    /// Why Sent refused the agent, once it has (the link then stops until the agent is activated again).
    refused: Arc<Mutex<Option<String>>>,
    /// The agent's own cap on concurrent calls (unbounded when the config sets none; the tenant's applies).
    agent_gate: Arc<Gate>,
    /// In a cluster: where calls other hosts hand over go.
    arrive: Option<tokio::sync::mpsc::Sender<crate::agent::Arrival>>,
    /// The component of each version this agent has served since it was connected: a call leaving on
    /// rolling restart is offered with its own version's, which only the same code takes.
    digests: BTreeMap<u32, Digest>,
}

// One type for the tenancy and the admin API: `api/views.rs` serialises it as it is, and its doc comments
// are the OpenAPI document's schema (hence in the API's words). Sent's reason for a refusal travels beside it
// (see `Tenancy::status`), as the API's `status_detail` does.
/// Whether an agent's calls can reach it: `inactive`, `loading`, `connecting`, `serving` or `refused`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    /// No active version: not connected.
    Inactive,
    /// Its active version is being compiled (the host started without its compiled form, after an
    /// upgrade): served once compiled.
    Loading,
    /// Connecting to Sent, or reconnecting with backoff.
    Connecting,
    /// At least one connection to Sent is ready.
    Serving,
    /// Sent refused the connection for a reason a person must fix (its `status_detail` says it).
    Refused,
}

impl AgentStatus {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Inactive => "inactive",
            AgentStatus::Loading => "loading",
            AgentStatus::Connecting => "connecting",
            AgentStatus::Serving => "serving",
            AgentStatus::Refused => "refused",
        }
    }
}

/// The refusal of a change whose version was deleted, replaced or rolled past while it was being loaded.
fn changed_meanwhile(agent: &str, version: u32) -> ServeError {
    RegistryError::changed_meanwhile(agent, version).into()
}

/// Sets aside each tenant's reserved pool slots and guest memory (the config checked that they fit).
fn reserve<'a>(slots: &Budget, memory: &Budget, tenants: impl Iterator<Item = &'a Tenant> + Clone) {
    slots.reserve(
        tenants
            .clone()
            .map(|t| (t.id.as_str(), t.reserved_calls as u64)),
    );
    memory.reserve(tenants.map(|t| (t.id.as_str(), t.reserved_memory)));
}

/// One upload in progress: its tenant's slot, freed when dropped.
pub struct UploadSlot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// Each tenant by id, with the cap on its calls.
type Tenants = BTreeMap<String, (Arc<Tenant>, Arc<Gate>)>;

/// The multi-tenant host of `voicehost serve`: the tenants (from the config), the registry of their agents,
/// the agents being served, and the compiling of uploads.
pub struct Tenancy {
    sandbox: Sandbox,
    sent_url: String,
    connections: usize,
    /// The instance pool's slots (`max_calls`): each call takes one from its tenant's share, so the pool
    /// holds no more calls than it has room for, and a tenant's `reserved_calls` are kept for it.
    slots: Arc<Budget>,
    /// The guests' linear memory (`guest_memory_mib`), with each tenant's reserved part.
    memory: Arc<Budget>,
    /// Replaced whole when the config is reloaded.
    tenants: RwLock<Tenants>,
    metrics_token: RwLock<Option<TokenHash>>,
    registry: Arc<tokio::sync::Mutex<Registry>>,
    /// The registry's store when other hosts share it (`[cluster]`): followed for their changes, and
    /// where the hosts tell each other their live calls.
    shared: Option<Arc<NatsStore>>,
    /// In a cluster, the other hosts' live calls per tenant, as last told: each tenant's cap here is its
    /// `max_sessions` less these.
    elsewhere: Mutex<BTreeMap<String, usize>>,
    /// In a cluster, the versions another host made active that this host is compiling to switch to:
    /// (tenant, agent, version).
    switching: Mutex<BTreeSet<(String, String, u32)>>,
    /// Other hosts' changes to the shared registry this host has taken (see [`Tenancy::follow`]).
    pub cluster_changes: Counter,
    /// True once the host leaves the cluster ([`Tenancy::leave`]): its calls leave for other hosts.
    leaving: watch::Sender<bool>,
    /// True once the host takes no more calls offered by other hosts (out of the queue group).
    offers_closed: watch::Sender<bool>,
    /// Where its agents' leaving calls go, and where [`Tenancy::leave`] takes them from (once).
    /// Unbounded, but bounded by the calls: a call is in it at most once (it left its router to be put
    /// there, and is back in one only after [`Tenancy::leave`] took it out), so it holds at most the
    /// calls the host serves (`max_calls`).
    leavers: tokio::sync::mpsc::UnboundedSender<handover::Leaving>,
    leaving_calls: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<handover::Leaving>>>,
    running: Mutex<BTreeMap<(String, String), Running>>,
    /// Active agents not served yet because their version is being compiled (at start, or after a
    /// reload adds their tenant): shown as `loading`.
    loading: Mutex<BTreeSet<(String, String)>>,
    /// The tasks compiling active versions to serve them (see [`Tenancy::compile_in_background`]).
    background: Mutex<Vec<JoinHandle<()>>>,
    ready: AtomicBool,
    /// Whose compile runs when: a few at once, one per tenant (see [`CompileQueue`]).
    compiling: CompileQueue,
    /// Each tenant's uploads in progress.
    uploads: UploadSlots,
    /// How long an upload's body may take to arrive.
    upload_timeout: Duration,
    /// Where uploads are received (`data_dir/uploads`), each into a file of its own.
    uploads_dir: PathBuf,
    /// Failed logins per client address, requests per tenant.
    rates: Rates,
    /// Components compiled by this process (a restart with a warm cache compiles none).
    pub compilations: Counter,
    /// Components loaded from the compiled cache.
    pub cache_loads: Counter,
    /// Connections the admin listener closed at once (see `api::listener`).
    pub admin_refused: Counter,
}

impl Tenancy {
    /// Opens the data directory and reads every tenant's key. Serves nothing until [`Tenancy::start`].
    /// Uploads compile in child processes of `compiler` (the `voicehost` binary) under the bounds of the
    /// config's `[compile]`; with `None`, in this process without bounds (for tests and embedding only).
    pub fn open(config: &ServeConfig, compiler: Option<PathBuf>) -> anyhow::Result<Arc<Tenancy>> {
        let tenants = config.tenants()?;
        for overcommitted in config.overcommitted(&tenants) {
            tracing::warn!("{overcommitted}: past the host's room, calls are refused (host_full) or trap (host_memory), outside what reserved_calls keeps for a tenant");
        }
        let tenants: Tenants = tenants
            .into_iter()
            .map(|tenant| {
                let gate = Gate::new(tenant.limits.max_sessions);
                (tenant.id.clone(), (Arc::new(tenant), gate))
            })
            .collect();
        // Every directory the host writes, checked now: an upload must not be the first to find out.
        anyhow::ensure!(
            config.data_dir.is_absolute(),
            "data_dir {} is relative: ServeConfig::read anchors it",
            config.data_dir.display()
        );
        for sub in ["components", "compiled", "uploads"] {
            let dir = config.data_dir.join(sub);
            ensure_writable(&dir)
                .map_err(|e| anyhow::anyhow!("data_dir: cannot write in {}: {e}", dir.display()))?;
        }
        let shared = match &config.cluster {
            Some(cluster) => Some(Arc::new(NatsStore::connect(cluster)?)),
            None => None,
        };
        let store: Arc<dyn ComponentStore> =
            match &shared {
                Some(shared) => shared.clone(),
                None => Arc::new(DiskStore::new(config.data_dir.join("components")).map_err(
                    |e| anyhow::anyhow!("cannot open {}: {e}", config.data_dir.display()),
                )?),
            };
        let registry = Registry::open(store)?;
        // Uploads are received here: what a killed host left is removed.
        let uploads_dir = config.data_dir.join("uploads");
        remove_partials(&uploads_dir)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", uploads_dir.display()))?;
        let mut sandbox =
            Sandbox::for_calls(config.max_calls)?.with_cache(config.data_dir.join("compiled"));
        if let Some(program) = compiler {
            sandbox = sandbox.with_compiler(ChildCompiler {
                program,
                bounds: config.compile.bounds(),
            });
        }
        match sandbox.collect_cache(&registry.in_use()) {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "removed compiled components no version needs"),
            Err(error) => tracing::warn!(%error, "could not collect the compiled cache"),
        }
        let (slots, memory) = (
            Budget::new(config.max_calls as u64),
            Budget::new(config.guest_memory_bytes()),
        );
        reserve(&slots, &memory, tenants.values().map(|(t, _)| &**t));
        let (leavers, leaving_calls) = tokio::sync::mpsc::unbounded_channel();
        Ok(Arc::new(Tenancy {
            leaving: watch::Sender::new(false),
            offers_closed: watch::Sender::new(false),
            leavers,
            leaving_calls: Mutex::new(Some(leaving_calls)),
            metrics_token: RwLock::new(config.metrics_token()?),
            sandbox,
            sent_url: config.sent_url.clone(),
            connections: config.connections,
            slots,
            memory,
            tenants: RwLock::new(tenants),
            registry: Arc::new(tokio::sync::Mutex::new(registry)),
            shared,
            elsewhere: Mutex::new(BTreeMap::new()),
            switching: Mutex::new(BTreeSet::new()),
            cluster_changes: Counter::default(),
            running: Mutex::new(BTreeMap::new()),
            loading: Mutex::new(BTreeSet::new()),
            background: Mutex::new(Vec::new()),
            ready: AtomicBool::new(false),
            compiling: CompileQueue::new(
                config.compile.at_once,
                Duration::from_secs(config.compile.tenant_seconds_per_hour),
            ),
            uploads: UploadSlots::new(config.admin.uploads_per_tenant),
            upload_timeout: Duration::from_secs(config.admin.upload_timeout_seconds),
            uploads_dir,
            rates: Rates::new(
                config.admin.failed_logins_per_minute,
                config.admin.requests_per_second,
            ),
            compilations: Counter::default(),
            cache_loads: Counter::default(),
            admin_refused: Counter::default(),
        }))
    }

    /// Serves every active version in the registry: those in the compiled cache before it returns (the
    /// server is ready then), those that must be compiled (an upgrade emptied the cache) in the
    /// background, each as soon as it is compiled; until then they show as loading (`/healthz` counts
    /// them).
    pub async fn start(self: &Arc<Tenancy>) {
        let started = Instant::now();
        let to_compile = self.serve_cached().await;
        self.ready.store(true, Ordering::Release);
        tracing::info!(
            agents = self.running().len(),
            loading = to_compile.len(),
            from_cache = self.cache_loads.get(),
            took_ms = started.elapsed().as_millis() as u64,
            "serving"
        );
        self.compile_in_background(to_compile);
        self.follow_cluster();
    }

    /// In cluster mode, takes every change other hosts make to the shared registry as it comes
    /// ([`Tenancy::take_changes`]), and sweeps the components no version refers to now and then; in a
    /// task [`Tenancy::shutdown`] stops.
    fn follow_cluster(self: &Arc<Tenancy>) {
        let Some(mut changes) = self.shared.as_ref().and_then(|store| store.changes()) else {
            return;
        };
        let tenancy = self.clone();
        let task = tokio::spawn(async move {
            let mut sweep = tokio::time::interval(SWEEP_EVERY);
            sweep.tick().await;
            let mut share = tokio::time::interval(cluster::SHARE_EVERY);
            share.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut recheck = tokio::time::interval(cluster::RECHECK);
            recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            recheck.tick().await;
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        tenancy.take_changes(false).await;
                    }
                    _ = sweep.tick() => tenancy.sweep().await,
                    _ = share.tick() => tenancy.share_calls().await,
                    _ = recheck.tick() => tenancy.take_changes(true).await,
                }
            }
        });
        self.background().push(task);
        let offers = tokio::spawn(self.clone().take_offers());
        self.background().push(offers);
    }

    /// Reads the shared registry again and serves what it now says: an agent deleted or deactivated on
    /// another host stops here too (its calls go to Sent's fallback, as on the host that deleted it), one
    /// whose active version changed switches to it once it is compiled (new calls only: live calls finish
    /// on theirs), a new active agent is served, and a changed failure policy applies to new calls.
    pub(crate) async fn take_changes(self: &Arc<Tenancy>, even_if_unchanged: bool) {
        let registry = self.registry.clone().lock_owned().await;
        let (registry, refreshed) = match written(registry, Registry::refresh).await {
            Ok(done) => done,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot read the registry's index");
                return;
            }
        };
        match refreshed {
            Ok(Some(unused)) => {
                self.cluster_changes.inc();
                unused.iter().for_each(|digest| self.sandbox.forget(digest));
                tracing::info!(
                    revision = registry.revision(),
                    "cluster: another host changed the registry"
                );
            }
            Ok(None) if !even_if_unchanged => return,
            Ok(None) => {}
            // The registry last seen is served meanwhile; the next check reads it again.
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot read the registry's index");
                if !even_if_unchanged {
                    return;
                }
            }
        }
        self.serve_what_it_says(registry).await;
    }

    /// Makes what this host serves what `registry` says: agents no longer active stop, those whose
    /// active version is another switch to it once it is compiled, the others take its failure policy,
    /// and active agents not served yet are served. What failed (a component NATS could not give while it
    /// moved a leader) is tried again at the next call: in a cluster, every [`cluster::RECHECK`].
    async fn serve_what_it_says(self: &Arc<Tenancy>, registry: Locked) {
        let mut stopping = Vec::new();
        let mut switching = Vec::new();
        {
            let mut running = self.running();
            let keys: Vec<(String, String)> = running.keys().cloned().collect();
            for (tenant, agent) in keys {
                let record = registry.agent(&tenant, &agent).ok();
                let active = record.and_then(|r| r.active.and_then(|v| r.version(v)));
                let served = &running[&key(&tenant, &agent)];
                let current = served.deployment.borrow().clone();
                match (record, active) {
                    (Some(record), Some(version))
                        if version.version == current.version
                            && version.digest == served.digest =>
                    {
                        served.deployment.send_replace(Arc::new(Deployment {
                            version: current.version,
                            code: current.code.clone(),
                            rules: self.rules(&tenant, &agent, record),
                        }));
                    }
                    (Some(_), Some(version)) => {
                        let switch = (tenant, agent, version.version);
                        // Not twice at once: one already compiling it serves it.
                        if self.switching().insert(switch.clone()) {
                            switching.push((switch.0, switch.1, version.clone()));
                        }
                    }
                    _ => stopping.extend(running.remove(&key(&tenant, &agent))),
                }
            }
        }
        drop(registry);
        stop_all(stopping).await;
        let to_compile = self.serve_cached().await;
        self.compile_in_background(to_compile);
        if !switching.is_empty() {
            let tenancy = self.clone();
            let task = tokio::spawn(async move { tenancy.switch_to(switching).await });
            self.background().push(task);
        }
    }

    /// Serves each of these versions in place of the one its agent serves now, once it is compiled (the
    /// old one keeps serving meanwhile), if it is still the active one then.
    async fn switch_to(self: &Arc<Tenancy>, versions: Vec<(String, String, VersionRecord)>) {
        let each = versions.into_iter().map(|(tenant, agent, version)| async move {
            match self.code(&tenant, &agent, version.version, Payer::Host).await {
                Ok((code, _)) => self.serve_if_active(&tenant, &agent, &version, code).await,
                Err(error) => {
                    tracing::error!(tenant, agent, version = version.version, %error, "cannot serve the version another host made active: tried again in 10 s")
                }
            }
            self.switching()
                .remove(&(tenant, agent, version.version));
        });
        futures_util::future::join_all(each).await;
    }

    /// Tells the other hosts this host's live calls per tenant and caps each tenant's calls here at its
    /// `max_sessions` less theirs. Unreachable, the counts last told stay (a cap is not lifted because
    /// NATS is down).
    async fn share_calls(&self) {
        let Some(shared) = &self.shared else { return };
        let mine: BTreeMap<String, usize> = self
            .tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, (_, gate))| (id.clone(), gate.live()))
            .collect();
        match shared.share_calls(mine).await {
            Ok(others) => {
                *self.elsewhere.lock().unwrap_or_else(|p| p.into_inner()) = others;
                let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
                for (tenant, gate) in tenants.values() {
                    gate.set_cap(self.session_cap(tenant));
                }
            }
            Err(error) => tracing::debug!(%error, "cluster: cannot share the live calls"),
        }
    }

    /// The tenant's cap on calls on this host: its `max_sessions`, less the calls other hosts of the
    /// cluster hold for it.
    fn session_cap(&self, tenant: &Tenant) -> usize {
        let elsewhere = self.elsewhere.lock().unwrap_or_else(|p| p.into_inner());
        let others = elsewhere.get(&tenant.id).copied().unwrap_or(0);
        tenant.limits.max_sessions.saturating_sub(others)
    }

    /// Deletes the shared store's components no version refers to (an upload that failed after its put,
    /// a deletion whose component was still young): see [`super::cluster::DELETE_AFTER`].
    async fn sweep(&self) {
        if let Some(shared) = self.shared.clone() {
            match blocking(move || shared.sweep_chunks()).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "cluster: cannot sweep the chunks of puts cut short")
                }
                Err(error) => {
                    tracing::warn!(%error, "cluster: cannot sweep the chunks of puts cut short")
                }
            }
        }
        let registry = self.registry.clone().lock_owned().await;
        match written(registry, |r| r.sweep()).await {
            Ok((_, Ok(asked))) if !asked.is_empty() => {
                tracing::debug!(components = asked.len(), "cluster: swept unused components")
            }
            Ok((_, Err(error))) | Err(error) => {
                tracing::warn!(%error, "cluster: cannot sweep unused components")
            }
            _ => {}
        }
    }

    /// Whether the registry can be changed now: in cluster mode, whether NATS is reachable (if not, the
    /// host keeps serving what it last saw, and admin changes are refused with 503).
    pub fn registry_reachable(&self) -> bool {
        self.shared.as_ref().is_none_or(|store| store.reachable())
    }

    /// Whether the registry is shared with other hosts (`[cluster]`).
    pub fn clustered(&self) -> bool {
        self.shared.is_some()
    }

    fn switching(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String, u32)>> {
        self.switching.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn background(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        let mut background = self.background.lock().unwrap_or_else(|p| p.into_inner());
        background.retain(|task| !task.is_finished());
        background
    }

    /// [`Tenancy::compile_and_serve`] in a task of its own, which [`Tenancy::shutdown`] stops.
    fn compile_in_background(
        self: &Arc<Tenancy>,
        to_compile: Vec<(String, String, VersionRecord)>,
    ) {
        if to_compile.is_empty() {
            return;
        }
        let tenancy = self.clone();
        let task = tokio::spawn(async move {
            let (count, started) = (to_compile.len(), Instant::now());
            tenancy.compile_and_serve(to_compile).await;
            tracing::info!(
                versions = count,
                agents = tenancy.running().len(),
                took_ms = started.elapsed().as_millis() as u64,
                "the active versions that had to be compiled are loaded"
            );
        });
        self.background().push(task);
    }

    /// Serves the active versions in the compiled cache that are not served yet; returns the others
    /// (smallest first), now counted as loading.
    async fn serve_cached(self: &Arc<Tenancy>) -> Vec<(String, String, VersionRecord)> {
        let mut active = self.registry.lock().await.active();
        active.sort_by_key(|(_, _, version)| version.size_bytes);
        let mut to_compile = Vec::new();
        for (tenant, agent, version) in active {
            if self.tenant(&tenant).is_none() {
                tracing::warn!(
                    tenant,
                    agent,
                    "the tenant is not in the config: not serving its agent"
                );
                continue;
            }
            // Served, or being compiled to be (a reload during the compiles after an upgrade).
            if self.running().contains_key(&key(&tenant, &agent))
                || self.loading().contains(&key(&tenant, &agent))
            {
                continue;
            }
            match self.cached(&version.digest).await {
                Ok(Some(code)) => self.serve_if_active(&tenant, &agent, &version, code).await,
                Ok(None) => to_compile.push((tenant, agent, version)),
                Err(error) => {
                    tracing::error!(tenant, agent, version = version.version, %error, "cannot serve the active version")
                }
            }
        }
        let mut loading = self.loading();
        loading.extend(to_compile.iter().map(|(t, a, _)| key(t, a)));
        drop(loading);
        to_compile
    }

    /// Compiles these active versions and serves each as soon as it is compiled. All are asked for at
    /// once: the compile queue runs `at_once` of them, one per tenant at a time and tenants in turn, so
    /// one tenant's many (or slow) versions hold back no other tenant's agents.
    async fn compile_and_serve(
        self: &Arc<Tenancy>,
        to_compile: Vec<(String, String, VersionRecord)>,
    ) {
        let each = to_compile.into_iter().map(|(tenant, agent, version)| async move {
            match self.code(&tenant, &agent, version.version, Payer::Host).await {
                Ok((code, _)) => self.serve_if_active(&tenant, &agent, &version, code).await,
                Err(error) => {
                    tracing::error!(tenant, agent, version = version.version, %error, "cannot serve the active version")
                }
            }
            self.loading().remove(&key(&tenant, &agent));
        });
        futures_util::future::join_all(each).await;
    }

    /// How many active agents are waiting for their version to compile before they are served.
    pub fn loading_count(&self) -> usize {
        self.loading().len()
    }

    /// Holds `tenant`'s turn to compile until the returned turn is dropped (for tests of the queue).
    #[cfg(test)]
    pub(crate) async fn hold_compile_turn(&self, tenant: &str) -> impl Send {
        self.compiling.turn(tenant, Payer::Host).await
    }

    /// Serves `code` as the agent's, if `version` is still its active version and it is not served yet
    /// (an activation, rollback or delete meanwhile served what it chose).
    async fn serve_if_active(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        version: &VersionRecord,
        code: AgentCode,
    ) {
        let registry = self.registry.lock().await;
        let Ok(record) = registry.agent(tenant, agent) else {
            return;
        };
        let served = self
            .running()
            .get(&key(tenant, agent))
            .map(|running| (running.deployment.borrow().version, running.digest.clone()));
        if record.active != Some(version.version)
            || record.version(version.version).map(|v| &v.digest) != Some(&version.digest)
            || served == Some((version.version, version.digest.clone()))
        {
            return;
        }
        let still = self.still_fits(
            &registry,
            tenant,
            agent,
            version.version,
            &version.digest,
            &code,
        );
        if let Err(error) = still {
            tracing::error!(tenant, agent, version = version.version, %error, "cannot serve the active version");
            return;
        }
        let deployment = Deployment {
            version: version.version,
            code,
            rules: self.rules(tenant, agent, record),
        };
        self.serve(tenant, agent, version.digest.clone(), deployment);
    }

    /// Takes the tenants, limits and metrics token of `config` without a restart: a new tenant can log in
    /// and its agents are served; a removed tenant's agents stop (their calls go to Sent's fallback); a
    /// tenant whose Sent key changed reconnects its agents with the new key; new limits and HTTP policies
    /// apply to new calls. A config that does not load changes nothing. The data directory, the admin
    /// listener, the Sent URL and the connections per agent need a restart.
    pub async fn reload(self: &Arc<Tenancy>, config: &ServeConfig) -> anyhow::Result<()> {
        let fresh = config.tenants()?;
        // The pool and the guests' memory keep their size until a restart: the reservations must fit
        // what the host has.
        reservations_fit(&fresh, self.slots.capacity(), self.memory.capacity()).map_err(|e| {
            anyhow::anyhow!("{e} (the host runs with the max_calls and guest_memory_mib it started with until a restart)")
        })?;
        let metrics_token = config.metrics_token()?;
        for overcommitted in config.overcommitted(&fresh) {
            tracing::warn!("{overcommitted}: past the host's room, calls are refused (host_full) or trap (host_memory), outside what reserved_calls keeps for a tenant");
        }
        // What a reload cannot change is said, not silently kept.
        if config.data_dir.join("uploads") != self.uploads_dir {
            tracing::warn!(
                "data_dir changed: the host keeps the one it started with until a restart"
            );
        }
        if config.sent_url != self.sent_url
            || config.connections != self.connections
            || config.max_calls != self.sandbox.max_calls()
            || config.guest_memory_bytes() != self.memory.capacity()
        {
            tracing::warn!(
                "sent_url, connections, max_calls or guest_memory_mib changed: they apply from the next restart"
            );
        }
        // No admin change in between.
        let registry = self.registry.lock().await;
        self.compiling
            .retain(|tenant| fresh.iter().any(|t| t.id == tenant));
        self.uploads
            .retain(|tenant| fresh.iter().any(|t| t.id == tenant));
        let (gone, rekeyed) = {
            let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
            let mut next = BTreeMap::new();
            let mut rekeyed = Vec::new();
            for mut tenant in fresh {
                let gate = match tenants.get(&tenant.id) {
                    Some((old, gate)) => {
                        // Lookups in flight hold the old places: the tenant keeps them, not 8 more.
                        tenant.http = Arc::new(HttpPolicy {
                            lookups: old.http.lookups.clone(),
                            ..(*tenant.http).clone()
                        });
                        if old.api_key.expose() != tenant.api_key.expose() {
                            rekeyed.push(tenant.id.clone());
                        }
                        gate.set_cap(self.session_cap(&tenant));
                        gate.clone()
                    }
                    None => Gate::new(self.session_cap(&tenant)),
                };
                next.insert(tenant.id.clone(), (Arc::new(tenant), gate));
            }
            let gone: Vec<String> = tenants
                .keys()
                .filter(|id| !next.contains_key(*id))
                .cloned()
                .collect();
            reserve(&self.slots, &self.memory, next.values().map(|(t, _)| &**t));
            *tenants = next;
            (gone, rekeyed)
        };
        *self
            .metrics_token
            .write()
            .unwrap_or_else(|p| p.into_inner()) = metrics_token;
        let stopping: Vec<Running> = {
            let mut running = self.running();
            let keys: Vec<(String, String)> = running
                .keys()
                .filter(|(tenant, _)| gone.contains(tenant) || rekeyed.contains(tenant))
                .cloned()
                .collect();
            keys.iter().filter_map(|k| running.remove(k)).collect()
        };
        stop_all(stopping).await;
        let kept: Vec<(String, String)> = self.running().keys().cloned().collect();
        for (tenant, agent) in kept {
            let (Ok(record), Some(config)) =
                (registry.agent(&tenant, &agent), self.tenant(&tenant))
            else {
                continue;
            };
            let rules = self.rules(&tenant, &agent, record);
            if let Some(running) = self.running().get(&key(&tenant, &agent)) {
                let current = running.deployment.borrow().clone();
                running.deployment.send_replace(Arc::new(Deployment {
                    version: current.version,
                    code: current.code.clone(),
                    rules,
                }));
                running
                    .agent_gate
                    .set_cap(config.agent_session_cap(&agent).unwrap_or(usize::MAX));
            }
        }
        drop(registry);
        let to_compile = self.serve_cached().await;
        self.compile_in_background(to_compile);
        tracing::info!(
            tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner()).len(),
            removed = gone.len(),
            rekeyed = rekeyed.len(),
            agents = self.running().len(),
            "the config is reloaded"
        );
        Ok(())
    }

    /// Whether [`Tenancy::start`] has served what the compiled cache holds (`/healthz` answers 200 from
    /// then on).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The id of the tenant whose admin token was presented (by its hash, computed once per request).
    pub fn tenant_by_token(&self, presented: &TokenHash) -> Option<String> {
        // Every tenant is checked, so the time taken does not tell which one matched.
        let mut found = None;
        for (tenant, _) in self
            .tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            if tenant.owns_token(presented) {
                found = Some(tenant.id.clone());
            }
        }
        found
    }

    /// The operator's metrics token (by its hash), when the config sets one: then `/metrics` needs it.
    pub fn metrics_token(&self) -> Option<TokenHash> {
        self.metrics_token
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The tenant of this id, as the config says now.
    pub fn tenant(&self, id: &str) -> Option<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|(tenant, _)| tenant.clone())
    }

    // ----- what the admin API asks -----

    /// How long `client` must wait before it may present a token again, when it has failed too often.
    pub fn login_refused(&self, client: Option<std::net::IpAddr>) -> Option<Duration> {
        self.rates.login_refused(client)
    }

    /// Counts a failed login from `client`; `Err(wait)` when it has failed too often lately.
    pub fn failed_login(&self, client: Option<std::net::IpAddr>) -> Result<(), Duration> {
        self.rates.failed_login(client)
    }

    /// Counts one of the tenant's requests; `Err(wait)` when it asks faster than it may.
    pub fn request(&self, tenant: &str) -> Result<(), Duration> {
        self.rates.request(tenant)
    }

    /// Counts a rendering of the tenant's metrics; `Err(wait)` when it had one less than a second ago.
    pub fn metrics_render(&self, tenant: &str) -> Result<(), Duration> {
        self.rates.render(tenant)
    }

    /// A slot for one of the tenant's uploads, to hold from before its body is read until its answer.
    pub fn upload_slot(&self, tenant: &str) -> Result<UploadSlot, ServeError> {
        self.uploads
            .try_take(tenant)
            .map(UploadSlot)
            .ok_or_else(|| {
                ServeError::Busy(format!(
                "this tenant has {} uploads in progress, as many as it may: try again once one has \
                 been answered",
                self.uploads.per_tenant()
            ))
            })
    }

    /// How many of the tenant's uploads are in progress (their body being read, or compiling).
    pub fn uploads_in_progress(&self, tenant: &str) -> usize {
        self.uploads.in_progress(tenant)
    }

    /// How long an upload's body may take to arrive.
    pub fn upload_timeout(&self) -> Duration {
        self.upload_timeout
    }

    /// What can be refused before an upload's body is read: an agent id Sent cannot know, and a tenant
    /// already at its quota of versions. (Its bytes count once its digest is known.)
    pub async fn upload_may_start(&self, tenant: &str, agent: &str) -> Result<(), ServeError> {
        check_agent_id(agent)?;
        self.compiling
            .may_compile(tenant)
            .map_err(|wait| self.compile_time_spent(wait))?;
        let mut usage = self.registry.lock().await.usage(tenant, None);
        usage.versions += 1;
        self.check_quota(tenant, &usage)
    }

    /// A new file to receive an upload into (deleted when the upload is dropped unfinished).
    pub async fn spool(&self) -> Result<Spool, ServeError> {
        Spool::create(&self.uploads_dir).await.map_err(|e| {
            tracing::error!(dir = %self.uploads_dir.display(), error = %e, "cannot receive an upload");
            ServeError::Internal("the host cannot receive uploads; its log says why".into())
        })
    }

    /// Validates and compiles the component received into `wasm` on this host, then keeps it as the
    /// agent's next version; nothing is stored when it cannot serve as an agent.
    pub async fn upload(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        wasm: Spooled,
        activate: bool,
    ) -> Result<VersionRecord, ServeError> {
        check_agent_id(agent)?;
        let digest = wasm.digest().clone();
        let size = wasm.size();
        let known = {
            let registry = self.registry.lock().await;
            // Before compiling: over its versions or stored bytes, the upload costs no compile. Its
            // compiled size is not known yet.
            let usage = registry.usage(tenant, Some((&digest, size, 0)));
            self.check_quota(tenant, &usage)?;
            // The compiled cache is shared by content, so a tenant's upload compiles unless the tenant
            // itself has uploaded these bytes before: how long it takes says nothing of other tenants'.
            registry.holds(tenant, &digest)
        };
        let code = self
            .load(
                tenant,
                Wasm::File(wasm.path().to_path_buf()),
                &digest,
                known,
            )
            .await?;
        // Flushed to disk before the lock is taken: storing it under the lock is then a rename.
        let wasm = blocking(move || wasm.sync().map(|()| wasm))
            .await?
            .map_err(|e| ServeError::Internal(format!("cannot write the upload down: {e}")))?;
        // Compiled (an uploader who goes away stops its compile); from here on, to the end.
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        to_the_end(async move { me.store(&t, &a, wasm, code, activate).await }).await
    }

    /// Keeps a compiled upload as the agent's next version (active if `activate`), if its tenant's quota
    /// and the agent's limits still allow it.
    async fn store(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        wasm: Spooled,
        code: AgentCode,
        activate: bool,
    ) -> Result<VersionRecord, ServeError> {
        let (digest, size) = (wasm.digest().clone(), wasm.size());
        let registry = self.registry_for(tenant).await?;
        // Under the lock, with the limits and the tenant's other uploads as they are now (a reload may
        // have lowered them, another upload may have been stored meanwhile); its compiled size counted.
        let compiled = code.compiled_bytes();
        let world = code.world().unwrap_or(World::CURRENT);
        let usage = registry.usage(tenant, Some((&digest, size, compiled)));
        let checked = self
            .check_quota(tenant, &usage)
            .and_then(|()| self.check_fits(tenant, agent, &code));
        let (registry, stored) = match checked {
            // Stored and made active in one write of the index: a crash never leaves it stored but
            // inactive.
            Ok(()) => {
                let (t, a) = key(tenant, agent);
                let now = unix_now();
                written(registry, move |r| {
                    let uploaded = Uploaded {
                        compiled_bytes: compiled,
                        world,
                        at: now,
                    };
                    r.add_version(&t, &a, wasm, uploaded, activate)
                })
                .await?
            }
            Err(error) => (registry, Err(error)),
        };
        let version = match stored {
            Ok(version) => version,
            Err(error) => {
                // Its compiled form goes too, unless a version (of any tenant) has these bytes.
                if !registry.in_use().contains(&digest) {
                    self.sandbox.forget(&digest);
                }
                return Err(error);
            }
        };
        tracing::info!(
            tenant,
            agent,
            version = version.version,
            digest = %version.digest,
            size_bytes = version.size_bytes,
            activate,
            "uploaded"
        );
        if activate {
            let record = registry.agent(tenant, agent)?;
            let deployment = Deployment {
                version: version.version,
                code,
                rules: self.rules(tenant, agent, record),
            };
            self.serve(tenant, agent, version.digest.clone(), deployment);
            tracing::info!(tenant, agent, version = version.version, "activated");
        }
        Ok(version)
    }

    /// The tenant's agents and their records, in id order.
    pub async fn agents(&self, tenant: &str) -> Vec<(String, AgentRecord)> {
        let registry = self.registry.lock().await;
        registry
            .agents(tenant)
            .map(|(id, record)| (id.clone(), record.clone()))
            .collect()
    }

    /// One of the tenant's agents' records (another tenant's agent is not found).
    pub async fn agent(&self, tenant: &str, agent: &str) -> Result<AgentRecord, ServeError> {
        Ok(self.registry.lock().await.agent(tenant, agent)?.clone())
    }

    /// New calls get `version`; live calls finish on theirs.
    pub async fn activate(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        version: u32,
    ) -> Result<AgentRecord, ServeError> {
        // Compiled (or read from the cache) before anything changes, without the lock: a version that
        // cannot load is never made active, and no other change waits for a compile.
        let (code, digest) = self.code(tenant, agent, version, Payer::Tenant).await?;
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        let compiled = (code, digest);
        to_the_end(async move {
            me.make_active(&t, &a, Switch::Activate, version, compiled)
                .await
        })
        .await
    }

    /// Makes the compiled `version` the agent's active one, as `switch` says, and serves it; refused if
    /// the registry changed meanwhile so that it no longer applies.
    async fn make_active(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        switch: Switch,
        version: u32,
        (code, digest): (AgentCode, Digest),
    ) -> Result<AgentRecord, ServeError> {
        let registry = self.registry_for(tenant).await?;
        if switch == Switch::Rollback
            && registry.agent(tenant, agent)?.previous.last() != Some(&version)
        {
            return Err(changed_meanwhile(agent, version));
        }
        self.still_fits(&registry, tenant, agent, version, &digest, &code)?;
        let (t, a, compiled) = (tenant.to_string(), agent.to_string(), digest.clone());
        // Checked again in the commit: another host may have changed the agent meanwhile.
        let (registry, done) = written(registry, move |r| match switch {
            Switch::Activate => r.activate_as(&t, &a, version, Some(&compiled)),
            Switch::Rollback => r.roll_back_to(&t, &a, Some((version, &compiled))).map(drop),
        })
        .await?;
        done?;
        let record = registry.agent(tenant, agent)?.clone();
        let deployment = Deployment {
            version,
            code,
            rules: self.rules(tenant, agent, &record),
        };
        self.serve(tenant, agent, digest, deployment);
        tracing::info!(tenant, agent, version, change = ?switch, "made active");
        Ok(record)
    }

    /// Goes back to the version active before the current one.
    pub async fn rollback(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
    ) -> Result<AgentRecord, ServeError> {
        let back = {
            let registry = self.fresh_registry().await?;
            let record = registry.agent(tenant, agent)?;
            match record.previous.last() {
                Some(&back) => back,
                None => return Err(RegistryError::nothing_to_roll_back(agent).into()),
            }
        };
        let (code, digest) = self.code(tenant, agent, back, Payer::Tenant).await?;
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        let compiled = (code, digest);
        to_the_end(async move {
            me.make_active(&t, &a, Switch::Rollback, back, compiled)
                .await
        })
        .await
    }

    /// The agent's failure policy, for its calls from now on.
    pub async fn set_policy(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        policy: FailurePolicy,
    ) -> Result<AgentRecord, ServeError> {
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        to_the_end(async move { me.set_policy_now(&t, &a, policy).await }).await
    }

    async fn set_policy_now(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        policy: FailurePolicy,
    ) -> Result<AgentRecord, ServeError> {
        let registry = self.registry_for(tenant).await?;
        let (t, a) = key(tenant, agent);
        let (registry, done) = written(registry, move |r| r.set_policy(&t, &a, policy)).await?;
        done?;
        let record = registry.agent(tenant, agent)?.clone();
        let current = self
            .running()
            .get(&key(tenant, agent))
            .map(|r| (r.deployment.borrow().clone(), r.digest.clone()));
        if let Some((current, digest)) = current {
            let deployment = Deployment {
                version: current.version,
                code: current.code.clone(),
                rules: self.rules(tenant, agent, &record),
            };
            self.serve(tenant, agent, digest, deployment);
        }
        Ok(record)
    }

    /// Forgets a version that is not active; its component goes once no version refers to it.
    pub async fn delete_version(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        version: u32,
    ) -> Result<(), ServeError> {
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        to_the_end(async move { me.delete_version_now(&t, &a, version).await }).await
    }

    async fn delete_version_now(
        &self,
        tenant: &str,
        agent: &str,
        version: u32,
    ) -> Result<(), ServeError> {
        let registry = self.registry_for(tenant).await?;
        let (t, a) = key(tenant, agent);
        let (_registry, unused) =
            written(registry, move |r| r.delete_version(&t, &a, version)).await?;
        let unused = unused?;
        // (An upload of the same bytes compiling meanwhile may lose its compiled form here: it is compiled
        // again when next needed.)
        unused.iter().for_each(|digest| self.sandbox.forget(digest));
        Ok(())
    }

    /// Forgets the agent: its connections close, and Sent sends its live calls to their fallback.
    pub async fn delete_agent(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
    ) -> Result<(), ServeError> {
        let (me, (t, a)) = (self.clone(), key(tenant, agent));
        to_the_end(async move { me.delete_agent_now(&t, &a).await }).await
    }

    async fn delete_agent_now(&self, tenant: &str, agent: &str) -> Result<(), ServeError> {
        let running = {
            let registry = self.registry_for(tenant).await?;
            let (t, a) = key(tenant, agent);
            let (_registry, unused) = written(registry, move |r| r.delete_agent(&t, &a)).await?;
            let unused = unused?;
            unused.iter().for_each(|digest| self.sandbox.forget(digest));
            self.running().remove(&key(tenant, agent))
        };
        // Its connections close without the registry held: other changes need not wait for them.
        stop_all(running.into_iter().collect()).await;
        tracing::info!(tenant, agent, "deleted");
        Ok(())
    }

    /// The tenant's live calls: (agent, call).
    pub fn sessions(&self, tenant: &str) -> Vec<(String, LiveSession)> {
        self.running()
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .flat_map(|((_, agent), running)| {
                running
                    .stats
                    .live()
                    .into_iter()
                    .map(|live| (agent.clone(), live))
            })
            .collect()
    }

    /// Whether the agent's calls can reach it, with Sent's reason when it refused the agent (`Some` only
    /// with [`AgentStatus::Refused`]).
    pub fn status(&self, tenant: &str, agent: &str) -> (AgentStatus, Option<String>) {
        let running = self.running();
        let Some(running) = running.get(&key(tenant, agent)) else {
            if self.loading().contains(&key(tenant, agent)) {
                return (AgentStatus::Loading, None);
            }
            return (AgentStatus::Inactive, None);
        };
        if let Some(why) = running
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return (AgentStatus::Refused, Some(why));
        }
        if running.stats.connections_open.get() > 0 {
            (AgentStatus::Serving, None)
        } else {
            (AgentStatus::Connecting, None)
        }
    }

    /// The version the agent's new calls get on this host, while it is served.
    pub fn served_version(&self, tenant: &str, agent: &str) -> Option<u32> {
        self.running()
            .get(&key(tenant, agent))
            .filter(|running| !running.task.is_finished())
            .map(|running| running.deployment.borrow().version)
    }

    /// How many calls the agent serves now.
    pub fn live_sessions(&self, tenant: &str, agent: &str) -> usize {
        self.running()
            .get(&key(tenant, agent))
            .map_or(0, |r| r.stats.live_count())
    }

    /// Every served agent's counters: (tenant, agent, stats).
    pub fn stats(&self) -> Vec<(String, String, Arc<Stats>)> {
        self.running()
            .iter()
            .map(|((tenant, agent), r)| (tenant.clone(), agent.clone(), r.stats.clone()))
            .collect()
    }

    /// Stops serving every agent: their connections close, live calls go to Sent's fallback.
    pub async fn shutdown(&self) {
        // Compiles still to come would serve agents again: they stop first (a compiling child dies with
        // its task).
        let background =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(|p| p.into_inner()));
        background.iter().for_each(JoinHandle::abort);
        // Waited for: one past its last await (serving what it compiled) ends before `running` is taken.
        futures_util::future::join_all(background).await;
        self.loading().clear();
        let running: Vec<Running> = std::mem::take(&mut *self.running()).into_values().collect();
        stop_all(running).await;
    }

    // ----- inside -----

    /// The registry, locked, for a change of `tenant`'s; refused when the config no longer has the tenant.
    /// A reload swaps the tenants under this lock, so a request that was let in before a reload removed
    /// its tenant changes nothing after it (a tenant added again later under the same id inherits
    /// nothing that request would have stored).
    async fn registry_for(&self, tenant: &str) -> Result<Locked, ServeError> {
        let registry = self.fresh_registry().await?;
        if self.tenant(tenant).is_none() {
            return Err(ServeError::NoTenant(tenant.to_string()));
        }
        Ok(registry)
    }

    /// The registry, locked, and in a cluster read again first: a change, or a lookup for one, must see
    /// what another host changed a moment ago (a version uploaded through another host, then activated
    /// through this one). What the reading found changed is served at the next [`Tenancy::take_changes`],
    /// which the watch asks for anyway.
    async fn fresh_registry(&self) -> Result<Locked, ServeError> {
        let registry = self.registry.clone().lock_owned().await;
        if self.shared.is_none() {
            return Ok(registry);
        }
        let (registry, caught_up) = written(registry, Registry::catch_up).await?;
        caught_up?;
        Ok(registry)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn loading(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String)>> {
        self.loading.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stored version's code and the digest it was made from: from the cache, or compiled in the
    /// tenant's turn. The registry's lock is held only to look the version up: the cache is asked first,
    /// and a component that must be compiled is read (and hashed) off the async workers without it. The
    /// caller checks, under the lock again, that nothing changed meanwhile and that the code fits the
    /// agent's limits as they are then ([`Tenancy::still_fits`]).
    async fn code(
        &self,
        tenant: &str,
        agent: &str,
        version: u32,
        payer: Payer,
    ) -> Result<(AgentCode, Digest), ServeError> {
        let (digest, store) = {
            let registry = self.fresh_registry().await?;
            let chosen = registry
                .agent(tenant, agent)?
                .version(version)
                .ok_or_else(|| RegistryError::no_version(agent, version))?;
            (chosen.digest.clone(), registry.store())
        };
        if let Some(code) = self.cached(&digest).await? {
            return Ok((code, digest));
        }
        // The tenant's turn first: versions waiting to compile (all of them, after an upgrade) hold no
        // component in memory meanwhile.
        let _turn = self.compile_turn(tenant, payer).await?;
        if let Some(code) = self.cached(&digest).await? {
            return Ok((code, digest));
        }
        let wasm = {
            let digest = digest.clone();
            match blocking(move || store.get(&digest)).await? {
                Ok(wasm) => wasm,
                // Deleted since it was looked up.
                Err(StoreError::NotFound(_)) => return Err(changed_meanwhile(agent, version)),
                Err(error) => return Err(RegistryError::from(error).into()),
            }
        };
        let code = self
            .sandbox
            .compile(Wasm::Bytes(wasm.into()), &digest)
            .await?;
        self.compilations.inc();
        Ok((code, digest))
    }

    /// Whether `code`, made from `digest` while the lock was not held, is still version `version` of the
    /// agent (not a version of the same number after the agent was deleted and uploaded again) and fits
    /// its limits as they are now. Called under the registry's lock.
    fn still_fits(
        &self,
        registry: &Registry,
        tenant: &str,
        agent: &str,
        version: u32,
        digest: &Digest,
        code: &AgentCode,
    ) -> Result<(), ServeError> {
        let record = registry.agent(tenant, agent)?;
        match record.version(version) {
            Some(now) if &now.digest == digest => self.check_fits(tenant, agent, code),
            Some(_) => Err(changed_meanwhile(agent, version)),
            None => Err(RegistryError::no_version(agent, version).into()),
        }
    }

    /// Refuses code whose instances could never start under the agent's limits, so that the upload (or
    /// the activation or rollback, after the limits were lowered) fails, not every call.
    /// Whether `usage` is within the tenant's quota.
    fn check_quota(&self, tenant: &str, usage: &Usage) -> Result<(), ServeError> {
        let quota = self.quota(tenant);
        match quota.refusal(usage) {
            Some(why) => Err(ServeError::OverQuota(why)),
            None => Ok(()),
        }
    }

    /// The tenant's quota (the default for a tenant the config no longer has).
    pub fn quota(&self, tenant: &str) -> Quota {
        self.tenant(tenant)
            .map_or(Quota::DEFAULT, |tenant| tenant.quota)
    }

    /// What the tenant keeps now.
    pub async fn usage(&self, tenant: &str) -> Usage {
        let registry = self.registry.lock().await;
        registry.usage(tenant, None)
    }

    fn check_fits(&self, tenant: &str, agent: &str, code: &AgentCode) -> Result<(), ServeError> {
        match code.never_fits(&self.limits(tenant, agent)) {
            Some(why) => Err(ServeError::OverLimits(why)),
            None => Ok(()),
        }
    }

    /// `wasm`'s code: from the compiled cache when `cached_ok` (never waiting for a compile), else
    /// compiled in `tenant`'s turn of the queue.
    async fn load(
        &self,
        tenant: &str,
        wasm: Wasm,
        digest: &Digest,
        cached_ok: bool,
    ) -> Result<AgentCode, ServeError> {
        if cached_ok {
            if let Some(code) = self.cached(digest).await? {
                return Ok(code);
            }
        }
        let _turn = self.compile_turn(tenant, Payer::Tenant).await?;
        let code = self.sandbox.compile(wasm, digest).await?;
        self.compilations.inc();
        Ok(code)
    }

    /// `tenant`'s turn to compile, or why it must wait.
    async fn compile_turn(&self, tenant: &str, payer: Payer) -> Result<Turn, ServeError> {
        self.compiling
            .turn(tenant, payer)
            .await
            .map_err(|wait| self.compile_time_spent(wait))
    }

    fn compile_time_spent(&self, wait: Duration) -> ServeError {
        ServeError::CompileTimeSpent {
            per_hour: self.compiling.per_hour().as_secs(),
            wait,
        }
    }

    /// The code of `digest` from the compiled cache, if it is there (read off the async workers).
    async fn cached(&self, digest: &Digest) -> Result<Option<AgentCode>, ServeError> {
        let sandbox = self.sandbox.clone();
        let digest = digest.clone();
        match blocking(move || sandbox.load_cached(&digest)).await? {
            Some(loaded) => {
                self.cache_loads.inc();
                Ok(Some(loaded?))
            }
            None => Ok(None),
        }
    }

    fn rules(&self, tenant: &str, agent: &str, record: &AgentRecord) -> CallRules {
        CallRules {
            limits: self.limits(tenant, agent),
            policy: record.failure_policy.clone(),
            ..CallRules::default()
        }
    }

    /// The limits an agent's calls run under: its tenant's for it, or the defaults.
    fn limits(&self, tenant: &str, agent: &str) -> Limits {
        match self.tenant(tenant) {
            Some(config) => Limits {
                host_memory: Some(self.memory.part(tenant)),
                ..Limits::of(&config.agent_limits(agent), config.http.clone())
            },
            None => Limits::default(),
        }
    }

    /// Makes `deployment` what the agent's new calls get, connecting the agent first if needed.
    fn serve(
        self: &Arc<Tenancy>,
        tenant: &str,
        agent: &str,
        digest: Digest,
        deployment: Deployment,
    ) {
        let deployment = Arc::new(deployment);
        let version = deployment.version;
        let mut running = self.running();
        if let Some(current) = running.get_mut(&key(tenant, agent)) {
            if !current.task.is_finished() {
                if current.deployment.borrow().version != deployment.version {
                    warn_if_deprecated(tenant, agent, deployment.version, &deployment.code);
                }
                current.digests.insert(deployment.version, digest.clone());
                current.digest = digest;
                current.deployment.send_replace(deployment);
                return;
            }
        }
        warn_if_deprecated(tenant, agent, deployment.version, &deployment.code);
        let Some((tenant_config, tenant_gate)) = self
            .tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .cloned()
        else {
            return;
        };
        let agent_gate = Gate::new(tenant_config.agent_session_cap(agent).unwrap_or(usize::MAX));
        let gates = vec![tenant_gate, agent_gate.clone()];
        let (deployments, receiver) = watch::channel(deployment);
        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(Stats::default());
        let (moves, arrive) = self.moves_for(tenant, agent).unzip();
        let config = AgentConfig {
            dial: Dial::new(self.sent_url.clone(), agent, tenant_config.api_key.clone()),
            deployment: receiver,
            connections: self.connections,
            admission: Admission::new(gates).with_slots(self.slots.part(tenant)),
            moves,
        };
        let (tenant_id, agent_id) = (tenant.to_string(), agent.to_string());
        let refused = Arc::new(Mutex::new(None));
        let task = tokio::spawn({
            let (stats, refused) = (stats.clone(), refused.clone());
            async move {
                if let Err(error) = crate::agent::serve(config, stats, stopped).await {
                    tracing::error!(tenant = tenant_id, agent = agent_id, %error, "Sent refused the agent: it is not served until it is activated again");
                    *refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
                }
            }
        });
        running.insert(
            key(tenant, agent),
            Running {
                deployment: deployments,
                digest: digest.clone(),
                stop,
                stats,
                task,
                refused,
                agent_gate,
                arrive,
                digests: BTreeMap::from([(version, digest)]),
            },
        );
    }
}

/// Runs `change` in a task of its own and waits for it: a change goes to its end even if the request that
/// asked for it is dropped meanwhile (its client went away, its connection's age ran out), so a commit is
/// always followed by what it means for the agents served. (A compile comes before, in the request: an
/// uploader who goes away stops it.)
async fn to_the_end<T, F>(change: F) -> Result<T, ServeError>
where
    F: std::future::Future<Output = Result<T, ServeError>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(change).await.unwrap_or_else(|e| {
        Err(ServeError::Internal(format!(
            "a registry change stopped: {e}"
        )))
    })
}

/// How a version becomes the active one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Switch {
    /// The tenant named it.
    Activate,
    /// It was the one active before the current one.
    Rollback,
}

/// The registry, locked, as a change holds it.
type Locked = tokio::sync::OwnedMutexGuard<Registry>;

/// Runs `change` on the locked registry on a blocking thread (a change writes the whole index and flushes
/// it to disk, a component is renamed into place or deleted: no async worker, which carries calls, waits
/// for the disk), and hands the lock back with what it returned.
async fn written<T: Send + 'static>(
    mut registry: Locked,
    change: impl FnOnce(&mut Registry) -> Result<T, RegistryError> + Send + 'static,
) -> Result<(Locked, Result<T, ServeError>), ServeError> {
    let (registry, result) = blocking(move || {
        let result = change(&mut registry);
        (registry, result)
    })
    .await?;
    Ok((registry, result.map_err(ServeError::from)))
}

/// Stops these agents' links: their connections close and Sent sends their calls to their fallback.
async fn stop_all(agents: Vec<Running>) {
    for agent in &agents {
        let _ = agent.stop.send(true);
    }
    // Together, under one bound: an agent whose connections do not close in time is left to be dropped.
    let tasks = agents.into_iter().map(|agent| agent.task);
    let _ = tokio::time::timeout(STOP_WITHIN, futures_util::future::join_all(tasks)).await;
}

/// Says in the log that a version about to serve calls speaks a deprecated world (it is served through
/// an adapter; the API's views and `voicehost_deprecated_world_calls_total` say so too).
fn warn_if_deprecated(tenant: &str, agent: &str, version: u32, code: &AgentCode) {
    if let Some(world) = code.world().filter(|w| w.deprecated()) {
        tracing::warn!(
            tenant,
            agent,
            version,
            world = world.name(),
            "the agent's version speaks a deprecated world, served through an adapter: rebuild it against voicehost:agent@0.3.0"
        );
    }
}

/// How often a host of a cluster deletes the shared components no version refers to (see
/// [`super::cluster::DELETE_AFTER`]).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// How long stopping agents waits for their connections to close.
const STOP_WITHIN: Duration = Duration::from_secs(5);

fn key(tenant: &str, agent: &str) -> (String, String) {
    (tenant.to_string(), agent.to_string())
}

/// Refuses an agent id Sent cannot know (a 400), before anything else of a request is looked at.
pub fn check_agent_id(agent: &str) -> Result<(), ServeError> {
    if super::config::valid_agent_id(agent) {
        Ok(())
    } else {
        Err(ServeError::BadRequest(format!(
            "{:?}: {}",
            agent.chars().take(80).collect::<String>(),
            super::config::AGENT_ID_RULE
        )))
    }
}
