//! Tenants' agents and their versions: components content-addressed by SHA-256 and one index document,
//! both behind [`ComponentStore`]: this host's disk ([`DiskStore`]), or the cluster's JetStream buckets
//! (`cluster::NatsStore`). Every change to the index is written whole and atomically, and only over the
//! revision it was made from (compare and swap): after a crash the registry is the one before or after it,
//! and of two hosts changing it at once, the second makes its change again on the first's.

use super::quota::Usage;
use crate::content::{remove_partials, write_atomically, Digest, Spooled};
use crate::sandbox::World;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use voicehost_proto::call::FailurePolicy;

/// Why the component store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Nothing is stored at this address.
    #[error("no component {0}")]
    NotFound(Digest),
    /// What is stored no longer hashes to its address.
    #[error("the stored component {0} is damaged")]
    Corrupt(Digest),
    /// The disk (or what stands in for it) failed.
    #[error("the component store failed: {0}")]
    Io(#[from] std::io::Error),
    /// The shared store cannot be reached now (NATS down or cut off), or would not take the change.
    #[error("the cluster's registry cannot be reached now: {0}")]
    Unavailable(String),
    /// The index was changed by another host since it was read: read it again and redo the change.
    #[error("the registry's index changed meanwhile")]
    Stale,
}

/// The index document as the store holds it, and the revision it is at (0 before the first write).
#[derive(Debug, Clone, Default)]
pub struct StoredIndex {
    /// The document, `None` before the first write.
    pub bytes: Option<Vec<u8>>,
    /// Grows with every write; what a write names to replace.
    pub revision: u64,
}

/// Components by content address, and the registry's index. What a shared object store implements.
pub trait ComponentStore: Send + Sync {
    /// Keeps the component received into `wasm` and returns its address; keeping the same bytes twice is
    /// one copy.
    fn put(&self, wasm: Spooled) -> Result<Digest, StoreError>;
    /// The bytes at `digest`, checked against it.
    fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError>;
    /// Forgets the component at `digest` (nothing when there is none).
    fn delete(&self, digest: &Digest) -> Result<(), StoreError>;
    /// Every component kept, by address.
    fn list(&self) -> Result<Vec<Digest>, StoreError>;
    /// The index document and its revision.
    fn read_index(&self) -> Result<StoredIndex, StoreError>;
    /// Replaces the index document whole, if it is still at revision `replacing` ([`StoreError::Stale`]
    /// if not); returns the new revision. A reader sees the old document or the new one.
    fn write_index(&self, bytes: &[u8], replacing: u64) -> Result<u64, StoreError>;
    /// The latest revision of the index other hosts wrote, as the store learns of them: `None` for a
    /// store no other host writes.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// Whether the store can be reached now (a shared store: whether its connection is up).
    fn reachable(&self) -> bool {
        true
    }
}

/// The embedded store: one file per component under a directory and `index.json` beside it, all written
/// atomically.
pub struct DiskStore {
    dir: PathBuf,
    /// This process is the only writer: the revision is counted here, from 1 for an index found.
    revision: std::sync::Mutex<u64>,
}

impl DiskStore {
    /// A store in `dir`, created if missing; what writes cut short by a crash left there is removed.
    pub fn new(dir: impl Into<PathBuf>) -> Result<DiskStore, StoreError> {
        let dir = dir.into();
        crate::content::private_dir(&dir)?;
        let removed = remove_partials(&dir)?;
        if removed > 0 {
            tracing::info!(dir = %dir.display(), removed, "removed files left by writes cut short");
        }
        let revision = std::sync::Mutex::new(u64::from(dir.join("index.json").exists()));
        Ok(DiskStore { dir, revision })
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.wasm", digest.hex()))
    }
}

impl ComponentStore for DiskStore {
    fn put(&self, wasm: Spooled) -> Result<Digest, StoreError> {
        let digest = wasm.digest().clone();
        // Renamed over a file already there: the same bytes, or a damaged copy repaired; never read back.
        wasm.keep_as(&self.path(&digest))?;
        Ok(digest)
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
        let bytes = match std::fs::read(self.path(digest)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(digest.clone()))
            }
            Err(error) => return Err(error.into()),
        };
        if Digest::of(&bytes) != *digest {
            return Err(StoreError::Corrupt(digest.clone()));
        }
        Ok(bytes)
    }

    fn delete(&self, digest: &Digest) -> Result<(), StoreError> {
        match std::fs::remove_file(self.path(digest)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error.into()),
            _ => Ok(()),
        }
    }

    fn list(&self) -> Result<Vec<Digest>, StoreError> {
        let mut kept = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let digest = name
                .to_str()
                .and_then(|name| name.strip_suffix(".wasm"))
                .and_then(|hex| Digest::parse(&format!("sha256:{hex}")).ok());
            kept.extend(digest);
        }
        Ok(kept)
    }

    fn read_index(&self) -> Result<StoredIndex, StoreError> {
        let revision = *self.revision.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = match std::fs::read(self.index_path()) {
            Ok(bytes) => Some(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error.into()),
        };
        Ok(StoredIndex { bytes, revision })
    }

    fn write_index(&self, bytes: &[u8], replacing: u64) -> Result<u64, StoreError> {
        let mut revision = self.revision.lock().unwrap_or_else(|p| p.into_inner());
        if *revision != replacing {
            return Err(StoreError::Stale);
        }
        write_atomically(&self.index_path(), bytes)?;
        *revision += 1;
        Ok(*revision)
    }
}

// ----- tenants, agents, versions -----

/// One uploaded version of an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRecord {
    /// From 1, per agent; never reused.
    pub version: u32,
    /// The component's content address in the store.
    pub digest: Digest,
    /// The component's size in bytes.
    pub size_bytes: u64,
    /// The size of its compiled code when it was uploaded, in bytes (0 for versions uploaded before it
    /// was recorded).
    #[serde(default)]
    pub compiled_bytes: u64,
    /// Unix seconds.
    pub uploaded_at: u64,
    /// The version of the `voicehost:agent` world it was built against.
    #[serde(default = "World::recorded_before_0_2")]
    pub world: World,
}

/// What the registry records of an upload besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploaded {
    /// The size of its compiled code, in bytes.
    pub compiled_bytes: u64,
    /// The world it was built against.
    pub world: World,
    /// When, in Unix seconds.
    pub at: u64,
}

/// One agent of a tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Every stored version, oldest first.
    pub versions: Vec<VersionRecord>,
    /// The version new calls get; `None` until one is activated.
    pub active: Option<u32>,
    /// Versions active before the current one, the latest last: what a rollback returns to.
    pub previous: Vec<u32>,
    /// The number the next upload gets (0 in a new record: the first upload gets 1).
    pub next_version: u32,
    /// What happens to a call the agent cannot serve (a hangup unless set).
    pub failure_policy: FailurePolicy,
}

impl AgentRecord {
    /// The record of `version`, if it is still stored.
    pub fn version(&self, version: u32) -> Option<&VersionRecord> {
        self.versions.iter().find(|v| v.version == version)
    }
}

/// Everything the registry knows: tenant → agent → record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// Tenant id → agent id → the agent's record.
    pub tenants: BTreeMap<String, BTreeMap<String, AgentRecord>>,
}

/// Why the registry refused a change.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The tenant has no agent of this id.
    #[error("no agent {0:?}")]
    NoAgent(String),
    /// The agent has no such version (never uploaded, or deleted).
    #[error("agent {agent:?} has no version {version}")]
    NoVersion {
        /// The agent's id.
        agent: String,
        /// The version asked for.
        version: u32,
    },
    /// The change contradicts the registry's state (deleting the active version, nothing to roll back to).
    #[error("{0}")]
    Conflict(String),
    /// The component store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The index document does not parse, or cannot be written as JSON.
    #[error("the registry's index is unreadable: {0}")]
    BadIndex(String),
}

impl RegistryError {
    /// [`RegistryError::NoVersion`] for `agent` and `version`.
    pub fn no_version(agent: &str, version: u32) -> RegistryError {
        RegistryError::NoVersion {
            agent: agent.to_string(),
            version,
        }
    }

    /// The conflict of a change made for a version of `agent` that changed meanwhile (here, or on another
    /// host of a cluster): its compiled component is no longer the version's, or no longer the one to
    /// roll back to.
    pub fn changed_meanwhile(agent: &str, version: u32) -> RegistryError {
        RegistryError::Conflict(format!(
            "agent {agent} changed while version {version} was being loaded: try again"
        ))
    }

    /// The conflict of a rollback for `agent` with no earlier active version to go back to.
    pub fn nothing_to_roll_back(agent: &str) -> RegistryError {
        RegistryError::Conflict(format!(
            "agent {agent:?} has no earlier active version to roll back to"
        ))
    }
}

/// The tenants' agents and versions, over a [`ComponentStore`]. Not shared: the host keeps it behind a
/// lock, so changes happen one at a time.
pub struct Registry {
    store: Arc<dyn ComponentStore>,
    index: Index,
    /// The store's revision of `index`.
    revision: u64,
    /// Components other hosts' changes stopped referring to, read while committing a change of this
    /// host's: [`Registry::refresh`] tells them (and that the index moved) to the host.
    foreign: Option<BTreeSet<Digest>>,
}

/// How many times a change is made again on a fresher index before it gives up: each retry means
/// another host changed the index in between.
const ATTEMPTS: usize = 16;

impl Registry {
    /// Opens the registry kept in `store`, and deletes every component no version refers to: what an
    /// upload killed before its commit, or a delete killed after its commit, left behind.
    pub fn open(store: Arc<dyn ComponentStore>) -> Result<Registry, RegistryError> {
        let stored = store.read_index()?;
        let indexed = stored.bytes.is_some();
        let registry = Registry {
            index: parse(stored.bytes.as_deref())?,
            revision: stored.revision,
            store,
            foreign: None,
        };
        let stored = registry.store.list()?;
        if !indexed && !stored.is_empty() {
            // Components with no index is not a fresh registry but a damaged or half-restored one: keep them.
            tracing::warn!(
                components = stored.len(),
                "the registry's index is missing but components are stored: none is deleted"
            );
            return Ok(registry);
        }
        let removed = registry.collect(stored).len();
        if removed > 0 {
            tracing::info!(removed, "removed components no version refers to");
        }
        Ok(registry)
    }

    /// Reads the index again if the store has a newer revision (another host changed it); returns the
    /// components the registry referred to and no longer does, or `None` when nothing changed.
    pub fn refresh(&mut self) -> Result<Option<BTreeSet<Digest>>, RegistryError> {
        let newer = self.read_newer()?;
        match (newer, self.foreign.take()) {
            (None, None) => Ok(None),
            (newer, foreign) => Ok(Some(newer.into_iter().chain(foreign).flatten().collect())),
        }
    }

    /// Reads the index again if the store has a newer revision, keeping what changed for
    /// [`Registry::refresh`]'s caller: what a host does before a change, or a lookup that missed, so that
    /// a version uploaded through another host a moment ago is found.
    pub fn catch_up(&mut self) -> Result<(), RegistryError> {
        if let Some(unused) = self.read_newer()? {
            self.foreign.get_or_insert_default().extend(unused);
        }
        Ok(())
    }

    /// [`Registry::refresh`], without what a commit read.
    fn read_newer(&mut self) -> Result<Option<BTreeSet<Digest>>, RegistryError> {
        let stored = self.store.read_index()?;
        if stored.revision <= self.revision {
            return Ok(None);
        }
        let before = self.in_use();
        self.index = parse(stored.bytes.as_deref())?;
        self.revision = stored.revision;
        let after = self.in_use();
        Ok(Some(before.difference(&after).cloned().collect()))
    }

    /// The store's revision of the index this registry holds.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Reads the index again, then deletes every stored component no version refers to (the store may
    /// keep a young one: see [`ComponentStore::delete`]); returns those it asked to delete. What the
    /// reading found changed is kept for [`Registry::refresh`]'s caller, as a commit's. Nothing is deleted
    /// when the index cannot be read, nor when it is empty (an index deleted by hand, or restored half).
    pub fn sweep(&mut self) -> Result<Vec<Digest>, RegistryError> {
        self.catch_up()?;
        if self.index.tenants.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.collect(self.store.list()?))
    }

    /// The components some version of some tenant refers to.
    pub fn in_use(&self) -> BTreeSet<Digest> {
        self.index
            .tenants
            .values()
            .flat_map(|agents| agents.values())
            .flat_map(|record| &record.versions)
            .map(|v| v.digest.clone())
            .collect()
    }

    /// Whether one of the tenant's own versions has the component at `digest`.
    pub fn holds(&self, tenant: &str, digest: &Digest) -> bool {
        self.index.tenants.get(tenant).is_some_and(|agents| {
            agents
                .values()
                .flat_map(|record| &record.versions)
                .any(|v| &v.digest == digest)
        })
    }

    /// What the tenant keeps, with `adding` (a version's digest, size and compiled size) counted too when
    /// given: its versions, and each component they hold once, at its size and its compiled size as
    /// recorded.
    pub fn usage(&self, tenant: &str, adding: Option<(&Digest, u64, u64)>) -> Usage {
        // Digest → (size, compiled size): a component held by several versions counts once.
        let mut components: BTreeMap<&Digest, (u64, u64)> = BTreeMap::new();
        let mut versions = 0;
        let held = self.agents(tenant).flat_map(|(_, record)| &record.versions);
        let held = held.map(|v| (&v.digest, v.size_bytes, v.compiled_bytes));
        for (digest, size, compiled) in held.chain(adding) {
            versions += 1;
            let counted = components.entry(digest).or_default();
            *counted = (size, counted.1.max(compiled));
        }
        Usage {
            versions,
            stored_bytes: components.values().map(|(size, _)| size).sum(),
            compiled_bytes: components.values().map(|(_, compiled)| compiled).sum(),
        }
    }

    /// The tenant's agents, by id.
    pub fn agents(&self, tenant: &str) -> impl Iterator<Item = (&String, &AgentRecord)> {
        self.index.tenants.get(tenant).into_iter().flatten()
    }

    /// The record of one of the tenant's agents.
    pub fn agent(&self, tenant: &str, agent: &str) -> Result<&AgentRecord, RegistryError> {
        self.index
            .tenants
            .get(tenant)
            .and_then(|agents| agents.get(agent))
            .ok_or_else(|| RegistryError::NoAgent(agent.to_string()))
    }

    /// Every active version: (tenant, agent, version).
    pub fn active(&self) -> Vec<(String, String, VersionRecord)> {
        let mut active = Vec::new();
        for (tenant, agents) in &self.index.tenants {
            for (agent, record) in agents {
                if let Some(version) = record.active.and_then(|v| record.version(v)) {
                    active.push((tenant.clone(), agent.clone(), version.clone()));
                }
            }
        }
        active
    }

    /// The component store, to read a component without holding the registry (reading and hashing a
    /// large one takes a while). What is read is checked against its digest; whether that version is
    /// still the one wanted is for the caller to check under the registry again.
    pub fn store(&self) -> Arc<dyn ComponentStore> {
        self.store.clone()
    }

    /// Keeps a new version of `agent` (created on its first upload), made active too when `activate` is
    /// set: one write of the index, so a crash leaves it stored and active, or not stored at all. The
    /// caller has validated `wasm`.
    pub fn add_version(
        &mut self,
        tenant: &str,
        agent: &str,
        wasm: Spooled,
        uploaded: Uploaded,
        activate: bool,
    ) -> Result<VersionRecord, RegistryError> {
        let Uploaded {
            compiled_bytes,
            world,
            at: uploaded_at,
        } = uploaded;
        let size_bytes = wasm.size();
        let digest = self.store.put(wasm)?;
        self.commit(|index| {
            let record = index
                .tenants
                .entry(tenant.to_string())
                .or_default()
                .entry(agent.to_string())
                .or_default();
            record.next_version = record.next_version.max(1);
            let version = VersionRecord {
                version: record.next_version,
                digest: digest.clone(),
                size_bytes,
                compiled_bytes,
                uploaded_at,
                world,
            };
            record.next_version += 1;
            record.versions.push(version.clone());
            if activate {
                make_active(record, version.version);
            }
            Ok(version)
        })
    }

    /// Makes `version` the one new calls get.
    #[cfg(test)]
    pub fn activate(
        &mut self,
        tenant: &str,
        agent: &str,
        version: u32,
    ) -> Result<(), RegistryError> {
        self.activate_as(tenant, agent, version, None)
    }

    /// [`Registry::activate`], refused as a conflict unless the version still has the component
    /// `digest` (when given): the one the caller compiled, which another host may have replaced meanwhile
    /// (the agent deleted and uploaded again numbers its versions from 1 again).
    pub fn activate_as(
        &mut self,
        tenant: &str,
        agent: &str,
        version: u32,
        digest: Option<&Digest>,
    ) -> Result<(), RegistryError> {
        self.change(tenant, agent, |record| {
            let Some(stored) = record.version(version) else {
                return Err(RegistryError::no_version(agent, version));
            };
            if digest.is_some_and(|digest| *digest != stored.digest) {
                return Err(RegistryError::changed_meanwhile(agent, version));
            }
            make_active(record, version);
            Ok(())
        })
    }

    /// Activates the version that was active before the current one, and returns it; refused as a conflict
    /// unless that is `expected` (when given): the version the caller compiled, which another host's change
    /// may have made another one meanwhile.
    pub fn roll_back_to(
        &mut self,
        tenant: &str,
        agent: &str,
        expected: Option<(u32, &Digest)>,
    ) -> Result<u32, RegistryError> {
        self.change(tenant, agent, |record| {
            let back = record
                .previous
                .pop()
                .ok_or_else(|| RegistryError::nothing_to_roll_back(agent))?;
            let now = record.version(back).map(|v| (back, &v.digest));
            if expected.is_some_and(|expected| Some(expected) != now) {
                return Err(RegistryError::changed_meanwhile(agent, back));
            }
            record.active = Some(back);
            Ok(back)
        })
    }

    /// Sets the agent's failure policy.
    pub fn set_policy(
        &mut self,
        tenant: &str,
        agent: &str,
        policy: FailurePolicy,
    ) -> Result<(), RegistryError> {
        self.change(tenant, agent, |record| {
            record.failure_policy = policy.clone();
            Ok(())
        })
    }

    /// Forgets a version that is not active; returns the components no version refers to any more.
    pub fn delete_version(
        &mut self,
        tenant: &str,
        agent: &str,
        version: u32,
    ) -> Result<Vec<Digest>, RegistryError> {
        let removed = self.change(tenant, agent, |record| {
            let Some(at) = record.versions.iter().position(|v| v.version == version) else {
                return Err(RegistryError::no_version(agent, version));
            };
            if record.active == Some(version) {
                return Err(RegistryError::Conflict(format!(
                    "version {version} is active: activate another one, or delete the agent"
                )));
            }
            record.previous.retain(|v| *v != version);
            Ok(record.versions.remove(at))
        })?;
        Ok(self.collect([removed.digest]))
    }

    /// Forgets the agent and all its versions; returns the components no version refers to any more.
    pub fn delete_agent(
        &mut self,
        tenant: &str,
        agent: &str,
    ) -> Result<Vec<Digest>, RegistryError> {
        let removed = self.commit(|index| {
            agent_mut(index, tenant, agent)?;
            let removed = index
                .tenants
                .get_mut(tenant)
                .and_then(|agents| agents.remove(agent))
                .unwrap_or_default();
            if index.tenants.get(tenant).is_some_and(BTreeMap::is_empty) {
                index.tenants.remove(tenant);
            }
            Ok(removed)
        })?;
        Ok(self.collect(removed.versions.into_iter().map(|v| v.digest)))
    }

    /// Applies `edit` to a copy of one agent's record and commits it; an error from `edit` changes nothing.
    fn change<T>(
        &mut self,
        tenant: &str,
        agent: &str,
        mut edit: impl FnMut(&mut AgentRecord) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        self.commit(|index| edit(agent_mut(index, tenant, agent)?))
    }

    /// Applies `edit` to a copy of the index, writes it over the revision it was made from, and only then
    /// makes it the registry's: a failed write, or an error from `edit`, changes nothing. When another
    /// host wrote first, the index is read again and `edit` made again on it, so its checks see the
    /// other host's change. A change that changes nothing (the same policy again, the active version
    /// activated) is not written.
    fn commit<T>(
        &mut self,
        mut edit: impl FnMut(&mut Index) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        for _ in 0..ATTEMPTS {
            let mut index = self.index.clone();
            let result = edit(&mut index)?;
            if index == self.index {
                return Ok(result);
            }
            let bytes =
                serde_json::to_vec(&index).map_err(|e| RegistryError::BadIndex(e.to_string()))?;
            match self.store.write_index(&bytes, self.revision) {
                Ok(revision) => {
                    (self.index, self.revision) = (index, revision);
                    return Ok(result);
                }
                Err(StoreError::Stale) => {
                    tracing::debug!(
                        "the registry's index changed meanwhile: the change is made again on it"
                    );
                    self.catch_up()?;
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(StoreError::Unavailable(format!(
            "the index changed under each of {ATTEMPTS} attempts"
        ))
        .into())
    }

    /// Deletes those of `digests` no version of any tenant refers to any more (the same bytes uploaded twice
    /// are stored once), and returns them. One that cannot be deleted now goes when the registry next opens.
    fn collect(&self, digests: impl IntoIterator<Item = Digest>) -> Vec<Digest> {
        let used = self.in_use();
        let unused: BTreeSet<Digest> = digests.into_iter().filter(|d| !used.contains(d)).collect();
        for digest in &unused {
            if let Err(error) = self.store.delete(digest) {
                tracing::warn!(%digest, %error, "could not delete an unused component");
            }
        }
        unused.into_iter().collect()
    }
}

/// The index in `bytes`, or an empty one before the first write.
fn parse(bytes: Option<&[u8]>) -> Result<Index, RegistryError> {
    bytes.map_or(Ok(Index::default()), |bytes| {
        serde_json::from_slice(bytes).map_err(|e| RegistryError::BadIndex(e.to_string()))
    })
}

/// Makes `version` the record's active one; the one active before, if another, is what a rollback returns
/// to.
fn make_active(record: &mut AgentRecord, version: u32) {
    if record.active != Some(version) {
        if let Some(current) = record.active {
            record.previous.retain(|v| *v != current);
            record.previous.push(current);
        }
        record.previous.retain(|v| *v != version);
        record.active = Some(version);
    }
}

fn agent_mut<'a>(
    index: &'a mut Index,
    tenant: &str,
    agent: &str,
) -> Result<&'a mut AgentRecord, RegistryError> {
    index
        .tenants
        .get_mut(tenant)
        .and_then(|agents| agents.get_mut(agent))
        .ok_or_else(|| RegistryError::NoAgent(agent.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uploaded(at: u64) -> Uploaded {
        Uploaded {
            compiled_bytes: 0,
            world: World::V0_3,
            at,
        }
    }

    /// `bytes`, received as an upload is.
    fn spooled(bytes: &[u8]) -> Spooled {
        let dir = std::env::temp_dir().join(format!("voicehost-spooled-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Spooled::from_bytes(&dir, bytes).unwrap()
    }

    fn store(name: &str) -> DiskStore {
        let dir =
            std::env::temp_dir().join(format!("voicehost-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DiskStore::new(dir).unwrap()
    }

    #[test]
    fn a_component_comes_back_by_its_digest_and_is_kept_once() {
        let store = store("roundtrip");
        let digest = store.put(spooled(b"\0asm component")).unwrap();
        assert_eq!(store.put(spooled(b"\0asm component")).unwrap(), digest);
        assert_eq!(store.get(&digest).unwrap(), b"\0asm component");
        assert_eq!(std::fs::read_dir(&store.dir).unwrap().count(), 1);
    }

    #[test]
    fn an_unknown_digest_is_not_found_and_a_damaged_file_is_refused_then_repaired_by_its_bytes() {
        let store = store("damaged");
        let unknown = Digest::of(b"never stored");
        assert!(matches!(store.get(&unknown), Err(StoreError::NotFound(_))));
        let digest = store.put(spooled(b"original")).unwrap();
        std::fs::write(store.path(&digest), b"tampered").unwrap();
        assert!(matches!(store.get(&digest), Err(StoreError::Corrupt(_))));
        // The same bytes uploaded again repair it, rather than being taken for already kept.
        assert_eq!(store.put(spooled(b"original")).unwrap(), digest);
        assert_eq!(store.get(&digest).unwrap(), b"original");
    }

    fn registry(name: &str) -> Registry {
        Registry::open(Arc::new(store(name))).unwrap()
    }

    #[test]
    fn versions_count_from_one_and_survive_a_reopen() {
        let mut registry = registry("reopen");
        let one = registry
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(10), false)
            .unwrap();
        let two = registry
            .add_version("acme", "agent_a", spooled(b"v2"), uploaded(20), false)
            .unwrap();
        assert_eq!((one.version, two.version), (1, 2));
        registry.activate("acme", "agent_a", 2).unwrap();
        let dir = registry_dir("reopen");
        let reopened = Registry::open(Arc::new(DiskStore::new(dir).unwrap())).unwrap();
        assert_eq!(reopened.index, registry.index);
        assert_eq!(reopened.active()[0].2, two);
        assert_eq!(reopened.store().get(&two.digest).unwrap(), b"v2");
    }

    fn registry_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("voicehost-store-{name}-{}", std::process::id()))
    }

    /// A store that counts the index writes of the store it wraps.
    struct CountingWrites(DiskStore, std::sync::atomic::AtomicUsize);

    impl ComponentStore for CountingWrites {
        fn put(&self, wasm: Spooled) -> Result<Digest, StoreError> {
            self.0.put(wasm)
        }
        fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
            self.0.get(digest)
        }
        fn delete(&self, digest: &Digest) -> Result<(), StoreError> {
            self.0.delete(digest)
        }
        fn list(&self) -> Result<Vec<Digest>, StoreError> {
            self.0.list()
        }
        fn read_index(&self) -> Result<StoredIndex, StoreError> {
            self.0.read_index()
        }
        fn write_index(&self, bytes: &[u8], replacing: u64) -> Result<u64, StoreError> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.write_index(bytes, replacing)
        }
    }

    #[test]
    fn a_change_that_changes_nothing_writes_nothing() {
        let store = Arc::new(CountingWrites(store("no-op"), Default::default()));
        let mut registry = Registry::open(store.clone()).unwrap();
        let writes = || store.1.load(std::sync::atomic::Ordering::Relaxed);
        registry
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(0), true)
            .unwrap();
        registry
            .set_policy("acme", "agent_a", FailurePolicy::default())
            .unwrap();
        registry.activate("acme", "agent_a", 1).unwrap();
        assert_eq!(writes(), 1, "only the upload changed the index");
        registry
            .set_policy(
                "acme",
                "agent_a",
                FailurePolicy::Transfer {
                    to: voicehost_proto::call::Party::new("number", "+14155550100").unwrap(),
                },
            )
            .unwrap();
        assert_eq!(writes(), 2);
    }

    /// The index where two registries share it, as hosts of a cluster do: compare and swap on a revision.
    struct SharedIndex {
        components: DiskStore,
        index: Arc<std::sync::Mutex<StoredIndex>>,
    }

    impl ComponentStore for SharedIndex {
        fn put(&self, wasm: Spooled) -> Result<Digest, StoreError> {
            self.components.put(wasm)
        }
        fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
            self.components.get(digest)
        }
        fn delete(&self, digest: &Digest) -> Result<(), StoreError> {
            self.components.delete(digest)
        }
        fn list(&self) -> Result<Vec<Digest>, StoreError> {
            self.components.list()
        }
        fn read_index(&self) -> Result<StoredIndex, StoreError> {
            Ok(self.index.lock().unwrap().clone())
        }
        fn write_index(&self, bytes: &[u8], replacing: u64) -> Result<u64, StoreError> {
            let mut index = self.index.lock().unwrap();
            if index.revision != replacing {
                return Err(StoreError::Stale);
            }
            *index = StoredIndex {
                bytes: Some(bytes.to_vec()),
                revision: replacing + 1,
            };
            Ok(index.revision)
        }
    }

    #[test]
    fn a_change_over_an_index_another_host_changed_is_made_again_on_theirs() {
        let index = Arc::new(std::sync::Mutex::new(StoredIndex::default()));
        let host = |name: &str| {
            let store = SharedIndex {
                components: store(name),
                index: index.clone(),
            };
            Registry::open(Arc::new(store)).unwrap()
        };
        let (mut a, mut b) = (host("shared-a"), host("shared-b"));
        let first = a
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(0), true)
            .unwrap();
        // b has not seen a's upload: its own is numbered after it, and a's stays.
        let second = b
            .add_version("acme", "agent_a", spooled(b"v2"), uploaded(0), false)
            .unwrap();
        assert_eq!((first.version, second.version), (1, 2));
        // a's change, read while b committed, is told to b's host once (its agents must follow it).
        assert!(b.refresh().unwrap().is_some());
        assert!(b.refresh().unwrap().is_none());
        let record = b.agent("acme", "agent_a").unwrap();
        assert_eq!(record.active, Some(1));
        assert_eq!(record.versions.len(), 2);
        // a learns of b's change when it refreshes (its watch would tell it to).
        assert!(a.refresh().unwrap().is_some());
        assert_eq!(a.index, b.index);
        assert!(a.refresh().unwrap().is_none(), "nothing newer");
        a.activate("acme", "agent_a", 2).unwrap();
        b.refresh().unwrap();
        // b means to roll back to 1 (what it compiled); a activates 1 first, so a rollback now goes to 2:
        // b's is refused, not taken elsewhere.
        a.activate("acme", "agent_a", 1).unwrap();
        assert!(matches!(
            b.roll_back_to("acme", "agent_a", Some((1, &first.digest))),
            Err(RegistryError::Conflict(_))
        ));
        assert_eq!(b.agent("acme", "agent_a").unwrap().active, Some(1));
        assert_eq!(
            b.roll_back_to("acme", "agent_a", Some((2, &second.digest)))
                .unwrap(),
            2
        );
    }

    #[test]
    fn a_sweep_deletes_nothing_while_the_index_is_empty() {
        let mut registry = registry("sweep-empty");
        registry
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(0), false)
            .unwrap();
        let orphan = registry.store.put(spooled(b"never committed")).unwrap();
        assert_eq!(registry.sweep().unwrap(), vec![orphan]);
        registry.delete_agent("acme", "agent_a").unwrap();
        let kept = registry.store.put(spooled(b"kept")).unwrap();
        // An empty index with components stored: an index lost or deleted by hand, not a reason to delete.
        assert!(registry.sweep().unwrap().is_empty());
        assert_eq!(registry.store.list().unwrap(), vec![kept]);
    }

    #[test]
    fn rollback_returns_to_the_version_active_before() {
        let mut registry = registry("rollback");
        for wasm in [b"v1", b"v2", b"v3"] {
            registry
                .add_version("acme", "agent_a", spooled(wasm), uploaded(0), false)
                .unwrap();
        }
        assert!(matches!(
            registry.roll_back_to("acme", "agent_a", None),
            Err(RegistryError::Conflict(_))
        ));
        registry.activate("acme", "agent_a", 1).unwrap();
        registry.activate("acme", "agent_a", 3).unwrap();
        registry.activate("acme", "agent_a", 2).unwrap();
        assert_eq!(registry.roll_back_to("acme", "agent_a", None).unwrap(), 3);
        assert_eq!(registry.roll_back_to("acme", "agent_a", None).unwrap(), 1);
        assert!(registry.roll_back_to("acme", "agent_a", None).is_err());
        assert_eq!(registry.agent("acme", "agent_a").unwrap().active, Some(1));
    }

    #[test]
    fn the_active_version_cannot_be_deleted_and_a_shared_component_outlives_one_owner() {
        let mut registry = registry("delete");
        let mine = registry
            .add_version("acme", "agent_a", spooled(b"same"), uploaded(0), false)
            .unwrap();
        registry
            .add_version("globex", "agent_b", spooled(b"same"), uploaded(0), false)
            .unwrap();
        registry.activate("acme", "agent_a", 1).unwrap();
        assert!(matches!(
            registry.delete_version("acme", "agent_a", 1),
            Err(RegistryError::Conflict(_))
        ));
        registry.delete_agent("acme", "agent_a").unwrap();
        assert!(registry.agent("acme", "agent_a").is_err());
        // globex uploaded the same bytes: they stay until its version goes too.
        assert_eq!(registry.store().get(&mine.digest).unwrap(), b"same");
        registry.delete_version("globex", "agent_b", 1).unwrap();
        assert!(matches!(
            registry.store().get(&mine.digest),
            Err(StoreError::NotFound(_))
        ));
    }

    #[test]
    fn components_no_version_refers_to_are_deleted_when_the_registry_opens() {
        let mut registry = registry("orphans");
        let kept = registry
            .add_version("acme", "agent_a", spooled(b"kept"), uploaded(0), false)
            .unwrap();
        // An upload killed between storing its component and committing the index.
        let orphan = registry.store.put(spooled(b"never committed")).unwrap();
        let dir = registry_dir("orphans");
        let reopened = Registry::open(Arc::new(DiskStore::new(&dir).unwrap())).unwrap();
        assert_eq!(reopened.store.list().unwrap(), vec![kept.digest.clone()]);
        assert!(matches!(
            reopened.store.get(&orphan),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(reopened.store().get(&kept.digest).unwrap(), b"kept");
    }

    #[test]
    fn components_with_no_index_are_kept_when_the_registry_opens() {
        let mut registry = registry("no-index");
        let kept = registry
            .add_version("acme", "agent_a", spooled(b"kept"), uploaded(0), false)
            .unwrap();
        let dir = registry_dir("no-index");
        // A restore that has not put the index back yet, or an index deleted by hand.
        std::fs::remove_file(dir.join("index.json")).unwrap();
        let reopened = Registry::open(Arc::new(DiskStore::new(&dir).unwrap())).unwrap();
        assert!(reopened.active().is_empty());
        assert_eq!(reopened.store.list().unwrap(), vec![kept.digest]);
    }

    #[test]
    fn a_version_added_active_is_active_in_the_same_write() {
        let mut registry = registry("add-active");
        registry
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(0), true)
            .unwrap();
        let two = registry
            .add_version("acme", "agent_a", spooled(b"v2"), uploaded(0), true)
            .unwrap();
        let dir = registry_dir("add-active");
        let reopened = Registry::open(Arc::new(DiskStore::new(&dir).unwrap())).unwrap();
        let record = reopened.agent("acme", "agent_a").unwrap();
        assert_eq!(record.active, Some(two.version));
        assert_eq!(
            record.previous,
            vec![1],
            "a rollback returns to the version active before"
        );
    }

    #[test]
    fn deleting_returns_the_components_no_version_needs_any_more() {
        let mut registry = registry("unused");
        let shared = registry
            .add_version("acme", "agent_a", spooled(b"shared"), uploaded(0), false)
            .unwrap();
        registry
            .add_version("globex", "agent_b", spooled(b"shared"), uploaded(0), false)
            .unwrap();
        let own = registry
            .add_version("acme", "agent_a", spooled(b"own"), uploaded(0), false)
            .unwrap();
        assert_eq!(
            registry.delete_version("acme", "agent_a", 2).unwrap(),
            vec![own.digest]
        );
        assert_eq!(registry.delete_agent("acme", "agent_a").unwrap(), vec![]);
        assert_eq!(
            registry.delete_agent("globex", "agent_b").unwrap(),
            vec![shared.digest]
        );
        assert!(registry.store.list().unwrap().is_empty());
    }

    #[test]
    fn a_tenant_never_reaches_another_tenants_agent() {
        let mut registry = registry("tenants");
        registry
            .add_version("acme", "agent_a", spooled(b"v1"), uploaded(0), false)
            .unwrap();
        assert!(registry.agent("globex", "agent_a").is_err());
        assert!(registry.activate("globex", "agent_a", 1).is_err());
        assert!(registry.delete_agent("globex", "agent_a").is_err());
        assert_eq!(registry.agents("globex").count(), 0);
        assert_eq!(registry.agents("acme").count(), 1);
    }
}
