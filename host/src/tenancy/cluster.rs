//! Cluster mode: the registry every host of a cluster shares, on NATS JetStream. The index is one
//! document under one key of a KV bucket (`PREFIX-registry`), written with compare and swap on its
//! revision; the components are objects of an object store (`PREFIX-components`) named by their SHA-256
//! and checked against it when read. Each host follows the key (a watch from the revision it read, made
//! again with backoff when it ends, and a read every [`RECHECK`] in case a watch stalls) and serves what it
//! says (`host::Tenancy::follow`). The compiled cache stays on each host: compiled code is never shared.
//!
//! Per-tenant session caps hold across the cluster: every [`SHARE_EVERY`] each host writes its live calls
//! per tenant under its id in a KV bucket (`PREFIX-calls`) whose entries expire after [`CALLS_TTL`] (a
//! bucket `max_age`: a 2.9 server has no per-key TTL), reads the others' and caps each tenant's calls here
//! at its `max_sessions` less the others' (`Tenancy::share_calls`). The counts are as old as the last
//! exchange, so a burst on several hosts at once may pass a cap by what arrives within it.
//!
//! The registry is synchronous (its changes run on blocking threads, under its lock); the NATS client runs
//! on a small runtime of its own, and each call into it waits on a thread of its own, so it may be made
//! from anywhere, an async worker included, without stalling the runtime the client needs.

use super::config::ClusterConfig;
use super::registry::{ComponentStore, StoreError, StoredIndex};
use crate::content::{Digest, Spooled};
use async_nats::jetstream::{self, kv, object_store};
use futures_util::StreamExt as _;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// The index's key in the KV bucket.
const INDEX_KEY: &str = "index";
/// How long one call to NATS may take (a component's transfer: [`TRANSFER_TIMEOUT`]).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a component's put or get may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest component a tenant may upload (`component_mib`'s maximum, 1 GiB).
const MAX_COMPONENT_BYTES: usize = 1 << 30;
/// How long a component's transfer may go without a byte before it is given up.
const STALLED_AFTER: Duration = Duration::from_secs(5);
/// How often the index is read besides the watch, so a watch that stalls delays a change no longer.
pub const RECHECK: Duration = Duration::from_secs(10);
/// A component no version refers to is deleted only once it is this old: another host may have just put
/// it for an upload it has not committed yet (longer than any upload's put-to-commit).
pub const DELETE_AFTER: Duration = Duration::from_secs(3600);
/// How often a host tells the others its live calls per tenant, and reads theirs.
pub const SHARE_EVERY: Duration = Duration::from_secs(2);
/// How long a host's counts are kept once it stops telling them (it stopped or lost NATS).
const CALLS_TTL: Duration = Duration::from_secs(30);
/// How long the host waits for JetStream to answer at start (a NATS cluster electing its leader).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the host waits for NATS at start before it gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim on a handed-over call's token is kept: longer than any resume window Sent gives.
const CLAIMS_TTL: Duration = Duration::from_secs(600);
/// How long a leaving host waits for a peer to take a call it offers (the client's own request timeout,
/// 10 s, is longer).
pub const OFFER_TIMEOUT: Duration = Duration::from_secs(8);
/// Offers a host holds that it has not answered yet, at most; more wait in NATS (and time out there).
const OFFERS_QUEUED: usize = 64;

/// The registry's store on JetStream.
pub struct NatsStore {
    /// The client's own runtime; `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    client: async_nats::Client,
    index: kv::Store,
    components: object_store::ObjectStore,
    /// The object store's stream, whose chunk subjects a put cut short leaves behind.
    chunks: jetstream::stream::Stream,
    /// The chunks' prefix: `$O.<bucket>.C.`, then the object's nuid.
    chunk_prefix: String,
    /// Chunks no object referred to at the last sweep: purged if still so at the next.
    suspected: std::sync::Mutex<BTreeSet<String>>,
    /// Each host's live calls per tenant, under its id.
    calls: kv::Store,
    /// Claims on handed-over calls' tokens: whoever holds one resumes the call.
    claims: kv::Store,
    /// The subject calls are offered on (a queue group of the hosts taking calls).
    offers_subject: String,
    host_id: String,
    changes: watch::Receiver<u64>,
    follower: tokio::task::JoinHandle<()>,
}

impl NatsStore {
    /// Connects to the cluster's NATS servers and opens (or creates) the buckets; follows the index from
    /// then on. Fails when no server answers within [`CONNECT_TIMEOUT`].
    pub fn connect(config: &ClusterConfig) -> anyhow::Result<NatsStore> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("voicehost-nats")
            .enable_all()
            .build()?;
        let host_id = config.host_id();
        let opened = on_own_thread(runtime.handle(), async {
            let mut options = async_nats::ConnectOptions::new()
                .name(format!("voicehost {host_id}"))
                .connection_timeout(CONNECT_TIMEOUT)
                .event_callback(|event| async move {
                    tracing::info!(%event, "NATS");
                });
            if let Some(path) = &config.credentials {
                options = options
                    .credentials_file(path)
                    .await
                    .map_err(|e| anyhow::anyhow!("cluster.credentials {}: {e}", path.display()))?;
            }
            let servers = config.servers_for_log();
            let addrs = config
                .servers
                .iter()
                .map(|server| server.parse::<async_nats::ServerAddr>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("cluster.servers ({servers}): {e}"))?;
            let client = tokio::time::timeout(CONNECT_TIMEOUT, options.connect(addrs))
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no NATS server of cluster.servers ({servers}) answered in {} s",
                        CONNECT_TIMEOUT.as_secs()
                    )
                })?
                .map_err(|e| anyhow::anyhow!("cannot connect to NATS ({servers}): {e}"))?;
            let js = jetstream::new(client.clone());
            // A NATS cluster starting beside the hosts answers JetStream only once it has a leader.
            let deadline = tokio::time::Instant::now() + OPEN_TIMEOUT;
            let buckets = loop {
                match Buckets::open(&js, config).await {
                    Ok(buckets) => break buckets,
                    Err(error) if tokio::time::Instant::now() < deadline => {
                        tracing::info!(%error, "cluster: JetStream not ready yet; trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(error) => return Err(error),
                }
            };
            let Buckets {
                index,
                calls,
                claims,
                components,
                chunks,
                chunk_prefix,
            } = buckets;
            anyhow::Ok((
                client,
                index,
                components,
                calls,
                claims,
                chunks,
                chunk_prefix,
            ))
        });
        let (client, index, components, calls, claims, chunks, chunk_prefix) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                // Wherever the host opens its registry, an async context included: not waited for.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let (tx, changes) = watch::channel(0);
        let follower = runtime.spawn(follow(index.clone(), tx));
        tracing::info!(%host_id, servers = %config.servers_for_log(), "cluster: the registry is on NATS JetStream");
        Ok(NatsStore {
            runtime: Some(runtime),
            client,
            index,
            components,
            chunks,
            chunk_prefix,
            suspected: Default::default(),
            calls,
            claims,
            offers_subject: format!("voicehost.{}.handover", config.bucket_prefix),
            host_id,
            changes,
            follower,
        })
    }

    /// The client's runtime.
    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime lives as long as the store")
    }

    /// Runs `call` on the client's runtime, waiting at most `timeout`; a store that cannot be reached is
    /// [`StoreError::Unavailable`] at once.
    fn call<T: Send>(
        &self,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if !self.reachable() {
            return Err(StoreError::Unavailable(
                "not connected to NATS: nothing was changed".into(),
            ));
        }
        let runtime = self.runtime();
        on_own_thread(runtime.handle(), async {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Unavailable(format!(
                        "NATS did not answer in {} s: a change may have been made or not; read it before trying again",
                        timeout.as_secs()
                    )))
                })
        })
    }
}

impl NatsStore {
    /// Purges the chunks no object refers to: what a put cut short (its host killed, NATS lost meanwhile)
    /// left. A chunk is purged only when it was found so at the sweep before too: a put in progress now
    /// is done long before the next sweep (a put takes at most 120 s). Returns how many objects' chunks
    /// were purged.
    pub fn sweep_chunks(&self) -> Result<usize, StoreError> {
        self.call(TRANSFER_TIMEOUT, async {
            let mut live = BTreeSet::new();
            let mut listed = self.components.list().await.map_err(unavailable)?;
            while let Some(info) = listed.next().await {
                live.insert(info.map_err(unavailable)?.nuid);
            }
            let mut subjects = self
                .chunks
                .info_with_subjects(format!("{}>", self.chunk_prefix))
                .await
                .map_err(unavailable)?;
            let mut orphans = BTreeSet::new();
            while let Some(subject) = subjects.next().await {
                let (subject, _) = subject.map_err(unavailable)?;
                match subject.strip_prefix(&self.chunk_prefix) {
                    Some(nuid) if !live.contains(nuid) => orphans.insert(nuid.to_string()),
                    _ => false,
                };
            }
            let purge: Vec<String> = {
                let mut suspected = self.suspected.lock().unwrap_or_else(|p| p.into_inner());
                let purge = orphans.intersection(&suspected).cloned().collect();
                *suspected = orphans;
                purge
            };
            for nuid in &purge {
                let subject = format!("{}{nuid}", self.chunk_prefix);
                self.chunks
                    .purge()
                    .filter(&subject)
                    .await
                    .map_err(unavailable)?;
                self.suspected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(nuid);
            }
            if !purge.is_empty() {
                tracing::info!(
                    objects = purge.len(),
                    "cluster: purged the chunks of puts cut short"
                );
            }
            Ok(purge.len())
        })
    }

    /// Tells the other hosts this host's live calls per tenant, and returns theirs added up per tenant
    /// (hosts whose counts are older than [`CALLS_TTL`] are gone from the bucket).
    pub async fn share_calls(
        &self,
        mine: BTreeMap<String, usize>,
    ) -> Result<BTreeMap<String, usize>, StoreError> {
        let (calls, host_id) = (self.calls.clone(), self.host_id.clone());
        let runtime = self.runtime();
        let exchange = runtime.spawn(async move {
            let value = serde_json::to_vec(&mine).map_err(|e| StoreError::Io(e.into()))?;
            calls.put(&host_id, value.into()).await.map_err(unavailable)?;
            let mut others = BTreeMap::new();
            let mut keys = calls.keys().await.map_err(unavailable)?;
            while let Some(host) = keys.next().await {
                let host = host.map_err(unavailable)?;
                if host == host_id {
                    continue;
                }
                let Some(value) = calls.get(&host).await.map_err(unavailable)? else {
                    continue;
                };
                // Another host's counts that do not parse are not counted (and said).
                match serde_json::from_slice::<BTreeMap<String, usize>>(&value) {
                    Ok(counts) => {
                        for (tenant, live) in counts {
                            let total: &mut usize = others.entry(tenant).or_default();
                            *total = total.saturating_add(live);
                        }
                    }
                    Err(error) => tracing::warn!(host, %error, "cluster: another host's call counts do not parse"),
                }
            }
            Ok(others)
        });
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| StoreError::Unavailable("NATS did not answer in time".into()))?
            .unwrap_or_else(|e| Err(unavailable(e)))
    }
}

/// One call offered by a leaving host: its message, and where the answer goes.
pub struct Offered {
    /// The offer, as the leaving host wrote it (at most the server's `max_payload`).
    pub payload: Vec<u8>,
    reply: Option<async_nats::Subject>,
}

/// The offers made to this host while it takes calls; dropping it leaves the queue group (what NATS sent
/// here meanwhile is lost, and its senders wait their timeout: [`Offers::drain`] keeps most of it).
pub struct Offers {
    /// The offers, in the order they came; it ends once [`Offers::drain`] has drained them.
    pub next: tokio::sync::mpsc::Receiver<Offered>,
    drain: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Offers {
    /// Leaves the queue group: `next` gives what had reached this host, then ends. Best effort: the
    /// client forgets the subscription before NATS has taken the unsubscribe in, so an offer NATS routes
    /// here within that round trip is lost (its sender waits its timeout and takes the call back).
    pub fn drain(&mut self) {
        if let Some(drain) = self.drain.take() {
            let _ = drain.send(());
        }
    }
}

impl Drop for Offers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a call offered got no answer.
#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    /// The call's state is larger than NATS carries in one message (its `max_payload`): it never will.
    #[error("the call's state ({0} bytes) is larger than NATS carries in one message")]
    TooLarge(usize),
    /// No host answered: none listens, none answered in time, or NATS cannot be reached.
    #[error("{0}")]
    Unanswered(String),
}

/// Whose a claim on a handed-over call's token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This host's now: it resumes the call.
    Mine,
    /// Another host's: it resumes the call, not this one.
    Taken,
}

/// Calls handed between hosts: offered on a subject every host taking calls listens to in one queue
/// group (one of them gets each offer), claimed by their token in a KV bucket (`PREFIX-claims`, kept
/// [`CLAIMS_TTL`]), so that the peer that got an offer resumes the call only if nobody (the leaving host
/// taking it back, say) has claimed it first.
impl NatsStore {
    /// This host's id in the cluster.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Joins the queue group calls are offered to.
    pub async fn offers(&self) -> Result<Offers, StoreError> {
        let (client, subject) = (self.client.clone(), self.offers_subject.clone());
        let runtime = self.runtime();
        let group = format!("{subject}.takers");
        let mut subscriber = runtime
            .spawn(async move { client.queue_subscribe(subject, group).await })
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?;
        let (tx, next) = tokio::sync::mpsc::channel(OFFERS_QUEUED);
        let (drain, mut drained) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(async move {
            let mut draining = false;
            loop {
                let message = tokio::select! {
                    message = subscriber.next() => message,
                    _ = &mut drained, if !draining => {
                        draining = true;
                        // An unsubscribe and a ping: the stream ends with what had reached the client.
                        if subscriber.drain().await.is_err() {
                            break;
                        }
                        continue;
                    }
                };
                let Some(message) = message else { break };
                let offered = Offered {
                    payload: message.payload.to_vec(),
                    reply: message.reply,
                };
                if tx.send(offered).await.is_err() {
                    break;
                }
            }
        });
        Ok(Offers {
            next,
            drain: Some(drain),
            task,
        })
    }

    /// Offers a call to the hosts taking calls: the answer of the one that took the offer, or why none
    /// came (nobody listens, none answered in [`OFFER_TIMEOUT`], NATS is not reachable).
    pub async fn offer(&self, payload: Vec<u8>) -> Result<Vec<u8>, OfferError> {
        if payload.len() > self.client.server_info().max_payload {
            return Err(OfferError::TooLarge(payload.len()));
        }
        let (client, subject) = (self.client.clone(), self.offers_subject.clone());
        let runtime = self.runtime();
        let asked = runtime.spawn(async move {
            tokio::time::timeout(OFFER_TIMEOUT, client.request(subject, payload.into())).await
        });
        match asked.await {
            Ok(Ok(Ok(answer))) => Ok(answer.payload.to_vec()),
            Ok(Ok(Err(error))) => Err(OfferError::Unanswered(error.to_string())),
            Ok(Err(_)) => Err(OfferError::Unanswered(format!(
                "no host answered in {} s",
                OFFER_TIMEOUT.as_secs()
            ))),
            Err(error) => Err(OfferError::Unanswered(error.to_string())),
        }
    }

    /// Answers an offer.
    pub async fn answer(&self, offered: Offered, payload: Vec<u8>) -> Result<(), StoreError> {
        let Some(reply) = offered.reply else {
            return Ok(());
        };
        let client = self.client.clone();
        let runtime = self.runtime();
        runtime
            .spawn(async move {
                tokio::time::timeout(CALL_TIMEOUT, client.publish(reply, payload.into())).await
            })
            .await
            .map_err(unavailable)?
            .map_err(|_| StoreError::Unavailable("NATS did not take the answer in time".into()))?
            .map_err(unavailable)
    }

    /// Waits until NATS has every message this host published so far (its pong), at most
    /// [`CALL_TIMEOUT`].
    pub async fn flush(&self) -> Result<(), StoreError> {
        let client = self.client.clone();
        self.runtime()
            .spawn(async move { tokio::time::timeout(CALL_TIMEOUT, client.flush()).await })
            .await
            .map_err(unavailable)?
            .map_err(|_| StoreError::Unavailable("NATS did not answer the flush in time".into()))?
            .map_err(unavailable)
    }

    /// Claims call `name` (a digest of its token) for this host, if nobody has (`take`: whoever has).
    pub async fn claim(&self, name: &str, take: bool) -> Result<Claim, StoreError> {
        let (claims, key, host) = (
            self.claims.clone(),
            format!("c{name}"),
            self.host_id.clone(),
        );
        let runtime = self.runtime();
        let claimed = runtime.spawn(async move {
            let value = bytes::Bytes::from(host.into_bytes());
            if take {
                claims
                    .put(&key, value)
                    .await
                    .map(|_| Claim::Mine)
                    .map_err(unavailable)
            } else {
                match claims.create(&key, value).await {
                    Ok(_) => Ok(Claim::Mine),
                    Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                        Ok(Claim::Taken)
                    }
                    Err(error) => Err(unavailable(error)),
                }
            }
        });
        tokio::time::timeout(CALL_TIMEOUT, claimed)
            .await
            .map_err(|_| StoreError::Unavailable("NATS did not answer in time".into()))?
            .unwrap_or_else(|e| Err(unavailable(e)))
    }
}

/// The buckets (and the object store's stream) a host uses.
struct Buckets {
    index: kv::Store,
    calls: kv::Store,
    claims: kv::Store,
    components: object_store::ObjectStore,
    chunks: jetstream::stream::Stream,
    chunk_prefix: String,
}

impl Buckets {
    /// Opens each bucket, creating the missing ones.
    async fn open(js: &jetstream::Context, config: &ClusterConfig) -> anyhow::Result<Buckets> {
        let index = open_kv(
            js,
            &format!("{}-registry", config.bucket_prefix),
            "the registry's index (tenants, agents, versions)",
            8,
            Duration::ZERO,
            jetstream::stream::StorageType::File,
            config.replicas,
        )
        .await?;
        let calls = open_kv(
            js,
            &format!("{}-calls", config.bucket_prefix),
            "each host's live calls per tenant",
            1,
            CALLS_TTL,
            jetstream::stream::StorageType::Memory,
            config.replicas,
        )
        .await?;
        let claims = open_kv(
            js,
            &format!("{}-claims", config.bucket_prefix),
            "claims on the tokens of calls handed between hosts",
            1,
            CLAIMS_TTL,
            jetstream::stream::StorageType::File,
            config.replicas,
        )
        .await?;
        let bucket = format!("{}-components", config.bucket_prefix);
        let components = match js.get_object_store(&bucket).await {
            Ok(store) => store,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: bucket.clone(),
                    description: Some("voicehost: agents' components by SHA-256".into()),
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: config.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    anyhow::anyhow!("cannot open or create the object store {bucket}: {e}")
                })?,
        };
        let chunks = js.get_stream(format!("OBJ_{bucket}")).await.map_err(|e| {
            anyhow::anyhow!("cannot open the object store's stream OBJ_{bucket}: {e}")
        })?;
        let chunk_prefix = format!("$O.{bucket}.C.");
        Ok(Buckets {
            index,
            calls,
            claims,
            components,
            chunks,
            chunk_prefix,
        })
    }
}

/// Opens the KV bucket `bucket`, creating it if missing with this history, entry age (zero: forever),
/// storage and copies.
async fn open_kv(
    js: &jetstream::Context,
    bucket: &str,
    what: &str,
    history: i64,
    max_age: Duration,
    storage: jetstream::stream::StorageType,
    replicas: usize,
) -> anyhow::Result<kv::Store> {
    if let Ok(store) = js.get_key_value(bucket).await {
        return Ok(store);
    }
    // The stream a KV bucket is (ADR-8's layout, as async-nats makes it), created here: async-nats's
    // `create_key_value` first reads the account's info, whose reply from a 2.9 server (Debian's) lacks
    // fields it requires, and fails.
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        description: Some(format!("voicehost: {what}")),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: history,
        max_age,
        storage,
        num_replicas: replicas,
        allow_rollup: true,
        deny_delete: true,
        // Reads from the stream's leader, never a replica that may lag: a host must not take an old
        // index for the latest (it would miss a change until the next one).
        allow_direct: false,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot create the KV bucket {bucket}: {e}"))?;
    js.get_key_value(bucket)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the KV bucket {bucket}: {e}"))
}

impl Drop for NatsStore {
    fn drop(&mut self) {
        self.follower.abort();
        // Dropped wherever the host ends, an async context included: the runtime is not waited for.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Runs `future` to its end on `runtime`, from a thread of its own: the caller may be an async worker of
/// another runtime (blocked meanwhile, as a disk read blocks it) or a blocking thread.
fn on_own_thread<T: Send>(
    runtime: &tokio::runtime::Handle,
    future: impl Future<Output = T> + Send,
) -> T {
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| runtime.block_on(future));
        waiting
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// What a NATS error means to the registry: it could not be reached.
fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

impl ComponentStore for NatsStore {
    fn put(&self, wasm: Spooled) -> Result<Digest, StoreError> {
        let digest = wasm.digest().clone();
        let path = wasm.path().to_path_buf();
        // Written again even when an object of that name is there: its time is then fresh, so a sweep
        // on another host does not take it for an old one no version refers to (see DELETE_AFTER).
        self.call(TRANSFER_TIMEOUT, async {
            let mut file = tokio::fs::File::open(&path).await?;
            self.components
                .put(digest.hex(), &mut file)
                .await
                .map_err(unavailable)?;
            Ok(())
        })?;
        drop(wasm);
        Ok(digest)
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
        let bytes = self.call(TRANSFER_TIMEOUT, async {
            let opened = tokio::time::timeout(CALL_TIMEOUT, self.components.get(digest.hex()));
            let mut object = match opened.await.map_err(unavailable)? {
                Ok(object) => object,
                Err(error) if error.kind() == object_store::GetErrorKind::NotFound => {
                    return Err(StoreError::NotFound(digest.clone()))
                }
                Err(error) => return Err(unavailable(error)),
            };
            // The size is what the bucket says: room for at most the largest component up front.
            let mut bytes = Vec::with_capacity(object.info().size.min(MAX_COMPONENT_BYTES));
            // A read that stalls (its chunks purged by a put of the same bytes, a stream leader moving)
            // fails soon, and is tried again later, rather than holding its caller for the whole
            // transfer's time.
            loop {
                let read = tokio::io::AsyncReadExt::read_buf(&mut object, &mut bytes);
                match tokio::time::timeout(STALLED_AFTER, read).await {
                    Ok(Ok(0)) => break,
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return Err(unavailable(error)),
                    Err(_) => {
                        return Err(StoreError::Unavailable(format!(
                            "reading component {digest} from NATS stalled for {} s",
                            STALLED_AFTER.as_secs()
                        )))
                    }
                }
            }
            Ok(bytes)
        })?;
        if Digest::of(&bytes) != *digest {
            return Err(StoreError::Corrupt(digest.clone()));
        }
        Ok(bytes)
    }

    /// Deletes the component only once it is [`DELETE_AFTER`] old: a younger one may be the put of an
    /// upload on another host that has not committed yet. A later sweep deletes it.
    fn delete(&self, digest: &Digest) -> Result<(), StoreError> {
        self.call(CALL_TIMEOUT, async {
            let info = match self.components.info(digest.hex()).await {
                Ok(info) => info,
                Err(error) if error.kind() == object_store::InfoErrorKind::NotFound => return Ok(()),
                Err(error) => return Err(unavailable(error)),
            };
            let modified = info.modified.map_or(0, |at| at.unix_timestamp());
            let age = crate::content::unix_now().saturating_sub(modified.max(0) as u64);
            if age < DELETE_AFTER.as_secs() {
                tracing::debug!(%digest, age_s = age, "an unused component is kept until a later sweep");
                return Ok(());
            }
            match self.components.delete(digest.hex()).await {
                Err(error) if error.kind() != object_store::DeleteErrorKind::NotFound => {
                    Err(unavailable(error))
                }
                _ => Ok(()),
            }
        })
    }

    fn list(&self) -> Result<Vec<Digest>, StoreError> {
        self.call(CALL_TIMEOUT, async {
            let mut listed = self.components.list().await.map_err(unavailable)?;
            let mut kept = Vec::new();
            while let Some(info) = listed.next().await {
                let info = info.map_err(unavailable)?;
                if info.deleted {
                    continue;
                }
                kept.extend(Digest::parse(&format!("sha256:{}", info.name)).ok());
            }
            Ok(kept)
        })
    }

    fn read_index(&self) -> Result<StoredIndex, StoreError> {
        self.call(CALL_TIMEOUT, async {
            let entry = self.index.entry(INDEX_KEY).await.map_err(unavailable)?;
            Ok(match entry {
                Some(entry) if entry.operation == kv::Operation::Put => StoredIndex {
                    bytes: Some(entry.value.to_vec()),
                    revision: entry.revision,
                },
                // Deleted or purged by hand (`nats kv del`): not taken for an empty registry, which would
                // stop every agent on every host.
                Some(entry) => {
                    return Err(StoreError::Unavailable(format!(
                        "the index was deleted from the KV bucket by hand (revision {}): put back an earlier revision (the bucket keeps 8)",
                        entry.revision
                    )))
                }
                None => StoredIndex::default(),
            })
        })
    }

    fn write_index(&self, bytes: &[u8], replacing: u64) -> Result<u64, StoreError> {
        let max = self.client.server_info().max_payload;
        if bytes.len() > max.saturating_sub(1024) {
            return Err(StoreError::Unavailable(format!(
                "the registry's index ({} bytes) no longer fits NATS's max_payload ({max} bytes): nothing was changed; raise max_payload on the NATS servers",
                bytes.len()
            )));
        }
        let value = bytes::Bytes::copy_from_slice(bytes);
        self.call(CALL_TIMEOUT, async {
            match self.index.update(INDEX_KEY, value, replacing).await {
                Ok(revision) => Ok(revision),
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    Err(StoreError::Stale)
                }
                Err(error) => Err(unavailable(error)),
            }
        })
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.clone())
    }

    fn reachable(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}

/// Tells `latest` of every revision of the index: a watch from the revision after the last one seen,
/// made again (with backoff) whenever it ends or fails, and a read every [`RECHECK`] besides.
async fn follow(index: kv::Store, latest: watch::Sender<u64>) {
    let tell = |revision: u64| {
        latest.send_if_modified(|seen| {
            let newer = revision > *seen;
            *seen = (*seen).max(revision);
            newer
        });
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok(Some(entry)) = index.entry(INDEX_KEY).await {
            tell(entry.revision);
        }
        let from = *latest.borrow() + 1;
        match index.watch_from_revision(INDEX_KEY, from).await {
            Ok(mut watch) => loop {
                tokio::select! {
                    entry = watch.next() => match entry {
                        Some(Ok(entry)) => {
                            backoff = Duration::from_millis(100);
                            tell(entry.revision);
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, "cluster: the registry's watch failed; made again");
                            break;
                        }
                        None => break,
                    },
                    () = tokio::time::sleep(RECHECK) => match index.entry(INDEX_KEY).await {
                        Ok(Some(entry)) => tell(entry.revision),
                        Ok(None) => {}
                        Err(error) => tracing::debug!(%error, "cluster: cannot read the registry's index"),
                    },
                }
            },
            Err(error) => tracing::warn!(%error, "cluster: cannot watch the registry's index"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
