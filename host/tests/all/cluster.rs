//! Cluster mode with real processes: a `nats-server -js` on loopback, three `voicehost serve` sharing its
//! registry (`[cluster]`), and the simulator as Sent. A change made through any host's admin API is served
//! by every host; a host cut off from NATS keeps its calls and catches up when NATS is back.

use crate::operator::{Served, BIN};
use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use voicehost::tenancy::token_sha256;
use voicehost_testkit::nats::Nats;
use voicehost_testkit::{guest, quantile, request};

const KEY: &str = "sk_cluster_sent_key";
const TOKEN: &str = "vh_cluster_tenant_token_0123456789";
const AGENT: &str = "agent_support";
/// How long a change may take to reach another host before the test fails: far above the target (1 s),
/// so only a change that never arrives fails it; the benchmark reports the real figures.
const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

/// NATS, the simulator and three hosts sharing one registry.
struct Cluster {
    /// One server, or the servers of a NATS cluster.
    nats: Vec<Nats>,
    sim: Sim,
    hosts: Vec<Served>,
    dir: PathBuf,
    /// What the tenant's `[[tenants]]` table says besides its id, token and key.
    acme: String,
    /// How long a change may take to reach a host before the test fails.
    converge_within: Duration,
}

impl Cluster {
    async fn start(name: &str) -> Cluster {
        Cluster::start_with(name, "").await
    }

    /// [`Cluster::start`], with `acme` appended to the tenant's table (its limits).
    async fn start_with(name: &str, acme: &str) -> Cluster {
        Cluster::start_on(name, acme, 1).await
    }

    /// [`Cluster::start_with`] on a NATS cluster of `servers` (JetStream keeping each bucket on each).
    async fn start_on(name: &str, acme: &str, servers: usize) -> Cluster {
        Cluster::start_hosts(name, acme, servers, &["a", "b", "c"]).await
    }

    /// [`Cluster::start_on`] with these hosts only.
    async fn start_hosts(name: &str, acme: &str, servers: usize, hosts: &[&str]) -> Cluster {
        voicehost_testkit::init_tracing();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let nats = match servers {
            1 => vec![Nats::start(dir.join("nats"))],
            n => Nats::cluster(dir.join("nats"), n),
        };
        let sim = Sim::start_local(SimConfig {
            heartbeat_interval_ms: 1000,
            accounts: vec![Account {
                api_key: KEY.into(),
                agents: vec![AGENT.into()],
            }],
            ..SimConfig::default()
        })
        .await
        .unwrap();
        std::fs::write(dir.join("acme.key"), KEY).unwrap();
        let mut cluster = Cluster {
            nats,
            sim,
            hosts: Vec::new(),
            dir,
            acme: acme.to_string(),
            converge_within: CONVERGE_WITHIN,
        };
        for id in hosts {
            let host = cluster.host(id);
            cluster.hosts.push(host);
        }
        for host in &cluster.hosts {
            host.healthy().await;
        }
        cluster
    }

    /// `voicehost serve` as host `id` of the cluster, its data directory its own.
    fn host(&self, id: &str) -> Served {
        let config = self.dir.join(format!("{id}.toml"));
        std::fs::write(
            &config,
            format!(
                "data_dir = \"data-{id}\"\nsent_url = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\nrequests_per_second = 100000\n\
                 [cluster]\nservers = [{}]\nhost_id = \"{id}\"\nreplicas = {}\nleave_seconds = 30\n\
                 [[tenants]]\nid = \"acme\"\ntoken_sha256 = \"{}\"\napi_key_file = \"acme.key\"\n{}\n",
                self.sim.url(),
                self.nats
                    .iter()
                    .map(|nats| format!("\"{}\"", nats.url()))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.nats.len(),
                token_sha256(TOKEN),
                self.acme,
            ),
        )
        .unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "info");
        let (mut served, addr) = Served::spawn(command);
        let addr = addr
            .recv_timeout(Duration::from_secs(60))
            .expect("voicehost says where its admin API listens");
        served.admin = format!("http://{addr}");
        served
    }

    async fn api(&self, host: usize, method: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
        request(&self.hosts[host].admin, method, path, Some(TOKEN), body).await
    }

    /// Waits until host `host` says of the agent what `wanted` accepts (its answer to GET, status and
    /// body); returns how long that took.
    async fn until(&self, host: usize, wanted: impl Fn(u16, &Value) -> bool) -> Duration {
        let started = Instant::now();
        loop {
            let (status, body) = self
                .api(host, "GET", &format!("/v1/agents/{AGENT}"), vec![])
                .await;
            if wanted(status, &body) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < self.converge_within,
                "host {host} never got there: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until every host serves `version` of the agent.
    async fn all_serve(&self, version: u64) {
        for host in 0..self.hosts.len() {
            self.until(host, |status, agent| {
                status == 200
                    && agent["active_version"] == version
                    && agent["served_version"] == version
                    && agent["status"] == "serving"
            })
            .await;
        }
    }

    fn upload_path(activate: bool) -> String {
        format!("/v1/agents/{AGENT}/versions?activate={activate}")
    }

    /// Uploads `name` through host `host`, active or not; returns the version.
    async fn upload(&self, host: usize, name: &str, activate: bool) -> u64 {
        let path = Cluster::upload_path(activate);
        let (status, body) = self.api(host, "POST", &path, guest(name)).await;
        assert_eq!(status, 201, "{body}");
        body["version"].as_u64().unwrap()
    }

    /// The conformance agent as version 1, active and served by every host, and the panicker as 2.
    async fn two_versions(&self) {
        self.upload(0, "conformance", true).await;
        self.upload(0, "panicker", false).await;
        self.all_serve(1).await;
    }

    /// Activates `version` through host `host`: the answer.
    async fn activate(&self, host: usize, version: u64) -> (u16, Value) {
        let body = json!({ "version": version }).to_string().into_bytes();
        let path = format!("/v1/agents/{AGENT}/activate");
        self.api(host, "POST", &path, body).await
    }

    /// Sets the failure policy to a transfer through host `host`.
    async fn transfer_on_failure(&self, host: usize) {
        let policy = br#"{"action":"transfer","to":{"kind":"number","value":"+14155550100"}}"#;
        let path = format!("/v1/agents/{AGENT}/failure-policy");
        let (status, body) = self.api(host, "PUT", &path, policy.to_vec()).await;
        assert_eq!(status, 200, "{body}");
    }

    /// A call on each of the agent's connections (one per host), greeted by version 1.
    async fn live_calls(&self) -> Vec<sentsim::Call> {
        let mut live: Vec<_> = self
            .sim
            .usable_connections(AGENT)
            .iter()
            .map(|conn| conn.start_text())
            .collect();
        for call in &mut live {
            let hello = call.expect_say("Hello from the conformance agent.").await;
            hello.unwrap();
        }
        live
    }

    /// Waits until every host says in `/healthz` that NATS is `reachable` or not (always 200).
    async fn registry_reachable(&self, reachable: bool) {
        for host in &self.hosts {
            let deadline = Instant::now() + CONVERGE_WITHIN;
            loop {
                let (status, health) = request(&host.admin, "GET", "/healthz", None, vec![]).await;
                assert_eq!(status, 200, "a host serves, NATS or not: {health}");
                if health["registry_reachable"] == reachable {
                    break;
                }
                assert!(Instant::now() < deadline, "{health}: never {reachable}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Keeps a host's log in `$CLUSTER_LOGS/<name>.log` when that is set (to read after a failed run).
fn keep_log(name: &str, log: &str) {
    if let Ok(dir) = std::env::var("CLUSTER_LOGS") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(PathBuf::from(dir).join(format!("{name}.log")), log);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (n, host) in self.hosts.iter().enumerate() {
            keep_log(&format!("host-{n}-last"), &host.log.lock().unwrap());
        }
        self.hosts.clear();
        self.nats.iter_mut().for_each(Nats::kill);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Places a text call on each of the agent's connections (one per host) and checks it is answered.
async fn every_connection_answers(sim: &Sim, hello: &str) {
    let connections = sim.usable_connections(AGENT);
    assert_eq!(connections.len(), 3, "one connection per host");
    for conn in connections {
        let mut call = conn.start_text();
        call.expect_say(hello).await.unwrap();
        call.end("caller_hung_up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_any_host_is_served_by_every_host() {
    let cluster = Cluster::start("served").await;
    assert_eq!(cluster.upload(0, "conformance", true).await, 1);
    cluster.all_serve(1).await;
    every_connection_answers(&cluster.sim, "Hello from the conformance agent.").await;

    // Uploaded through B: the next number of the shared index, not B's own first.
    assert_eq!(cluster.upload(1, "panicker", false).await, 2);
    // Activated through C, rolled back through A.
    let (status, body) = cluster.activate(2, 2).await;
    assert_eq!(status, 200, "{body}");
    cluster.all_serve(2).await;
    every_connection_answers(&cluster.sim, "Hello from the panicker.").await;
    let (status, body) = cluster
        .api(0, "POST", &format!("/v1/agents/{AGENT}/rollback"), vec![])
        .await;
    assert_eq!(status, 200, "{body}");
    cluster.all_serve(1).await;

    // A failure policy set through B applies on A.
    cluster.transfer_on_failure(1).await;
    let transfers = |_: u16, agent: &Value| agent["failure_policy"]["action"] == "transfer";
    cluster.until(0, transfers).await;

    // Deleted through C: no host serves it, and its connections close.
    let (status, body) = cluster
        .api(2, "DELETE", &format!("/v1/agents/{AGENT}"), vec![])
        .await;
    assert_eq!(status, 204, "{body}");
    for host in 0..3 {
        cluster.until(host, |status, _| status == 404).await;
    }
    let deadline = Instant::now() + CONVERGE_WITHIN;
    while !cluster.sim.open_connections(Some(AGENT)).is_empty() {
        let open = Instant::now() < deadline;
        assert!(open, "the deleted agent's connections stay open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Uploaded again: version 1 again, with other code, which every host serves.
    assert_eq!(cluster.upload(0, "panicker", true).await, 1);
    cluster.all_serve(1).await;
    every_connection_answers(&cluster.sim, "Hello from the panicker.").await;
}

/// Activations through each host in turn, each timed until both other hosts show it: the convergence
/// figures of BENCHMARKS.md (`CLUSTER_CHANGES=100`; 20 by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_through_any_host_converge_on_every_host() {
    let changes: usize = std::env::var("CLUSTER_CHANGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let cluster = Cluster::start("converge").await;
    cluster.two_versions().await;
    let mut took = Vec::new();
    for change in 0..changes {
        let (through, version) = (change % 3, 2 - (change % 2) as u64);
        let (status, body) = cluster.activate(through, version).await;
        assert_eq!(status, 200, "{body}");
        for other in (0..3).filter(|host| *host != through) {
            let seen = cluster
                .until(other, |_, agent| {
                    agent["served_version"] == version && agent["status"] == "serving"
                })
                .await;
            took.push(seen);
        }
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "cluster convergence over {changes} activations ({} host-changes): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        took.len(),
        ms(quantile(&took, 0.5)),
        ms(quantile(&took, 0.99)),
        ms(took.last().copied().unwrap_or_default())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_from_nats_keeps_its_calls_and_catches_up() {
    let mut cluster = Cluster::start("cut-off").await;
    cluster.two_versions().await;
    let mut live = cluster.live_calls().await;

    cluster.nats[0].kill();
    cluster.registry_reachable(false).await;
    // Calls go on, new ones too, on the registry each host last saw.
    for call in &mut live {
        call.say("echo still here");
        call.expect_say("still here").await.unwrap();
    }
    every_connection_answers(&cluster.sim, "Hello from the conformance agent.").await;
    // Changes are refused, and say why.
    let (status, body) = cluster.activate(1, 2).await;
    let refused = (status, &body["error"]["code"]);
    assert_eq!(refused, (503, &json!("unavailable")), "{body}");
    let path = format!("/v1/agents/{AGENT}");
    let (_, agent) = cluster.api(1, "GET", &path, vec![]).await;
    assert_eq!(agent["active_version"], 1, "nothing was changed: {agent}");
    let (_, metrics) = request(&cluster.hosts[1].admin, "GET", "/metrics", None, vec![]).await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    let said = metrics.contains("voicehost_cluster_registry_reachable 0");
    assert!(said, "{metrics}");

    cluster.nats[0].restart();
    cluster.registry_reachable(true).await;
    let (status, body) = cluster.activate(0, 2).await;
    assert_eq!(status, 200, "{body}");
    cluster.all_serve(2).await;
    // The calls of before the outage are still on their version.
    for call in &mut live {
        call.say("echo after");
        call.expect_say("after").await.unwrap();
    }
}

/// Starts a call on `conn` and says whether the agent took it (its greeting) or the tenant's cap refused
/// it (the failure policy's transfer); the call is hung up either way unless kept.
async fn admitted(conn: &sentsim::ConnHandle) -> (bool, sentsim::Call) {
    let mut call = conn.start_text();
    let first = call
        .expect_frame("a greeting or a transfer", |_| true)
        .await
        .unwrap();
    let admitted = first["type"] == "agent.say";
    if !admitted {
        assert_eq!(first["name"], "transfer", "{first}");
    }
    (admitted, call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_session_cap_holds_across_the_hosts() {
    let cluster = Cluster::start_with("cap", "[tenants.limits]\nmax_sessions = 2").await;
    cluster.upload(0, "conformance", true).await;
    cluster.transfer_on_failure(0).await;
    cluster.all_serve(1).await;
    for host in 0..3 {
        let transfers = |_: u16, agent: &Value| agent["failure_policy"]["action"] == "transfer";
        cluster.until(host, transfers).await;
    }
    let conns = cluster.sim.usable_connections(AGENT);
    assert_eq!(conns.len(), 3, "one connection per host");
    // Two calls on two hosts: the tenant's two.
    let (first, mut one) = admitted(&conns[0]).await;
    let (second, two) = admitted(&conns[1]).await;
    assert!(first && second, "two calls fit a cap of two");
    // On the third host a call is refused once the counts have reached it (every 2 s).
    until_admitted(
        &conns[2],
        false,
        "the third host never counted the others' calls",
    )
    .await;
    // Once one ends, there is room again on the third.
    one.say("echo bye");
    one.expect_say("bye").await.unwrap();
    one.end("caller_hung_up");
    until_admitted(
        &conns[2],
        true,
        "the ended call was never taken off the count",
    )
    .await;
    two.end("caller_hung_up");
}

/// Places calls on `conn`, each hung up at once, until one is `admitted` (or refused).
async fn until_admitted(conn: &sentsim::ConnHandle, wanted: bool, never: &str) {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        let (taken, call) = admitted(conn).await;
        call.end("caller_hung_up");
        if taken == wanted {
            return;
        }
        assert!(Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_of_a_put_cut_short_are_purged_at_the_second_sweep_and_components_are_kept() {
    use voicehost::tenancy::cluster::NatsStore;
    use voicehost::tenancy::ComponentStore as _;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cluster-chunks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nats = Nats::start(dir.join("nats"));
    let config = voicehost::tenancy::ClusterConfig {
        servers: vec![nats.url()],
        credentials: None,
        host_id: Some("sweeper".into()),
        bucket_prefix: "voicehost".into(),
        replicas: 1,
        leave_seconds: 30,
    };
    let store = std::sync::Arc::new(NatsStore::connect(&config).unwrap());
    let kept = voicehost::content::Spooled::from_bytes(&dir, b"\0asm a component").unwrap();
    let digest = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.put(kept))
            .await
            .unwrap()
            .unwrap()
    };
    // A put cut short: chunks published, no object's metadata naming them.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.publish(
        "$O.voicehost-components.C.cutshort",
        "half a component".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let chunk_messages = |js: async_nats::jetstream::Context| async move {
        let mut stream = js.get_stream("OBJ_voicehost-components").await.unwrap();
        stream.info().await.unwrap().state.messages
    };
    let before = chunk_messages(js.clone()).await;
    let sweep = |store: std::sync::Arc<NatsStore>| async move {
        tokio::task::spawn_blocking(move || store.sweep_chunks())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        sweep(store.clone()).await,
        0,
        "the first sweep only notes it"
    );
    assert_eq!(chunk_messages(js.clone()).await, before);
    assert_eq!(sweep(store.clone()).await, 1, "the second purges it");
    assert_eq!(chunk_messages(js.clone()).await, before - 1);
    let store2 = store.clone();
    let read = tokio::task::spawn_blocking(move || store2.get(&digest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read, b"\0asm a component",
        "a component's chunks are never taken"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_keep_serving_and_converging_when_one_of_three_nats_servers_dies() {
    let mut cluster = Cluster::start_on("nats-three", "", 3).await;
    cluster.two_versions().await;
    let mut live = cluster.live_calls().await;
    // The first server is every host's first: each loses its connection and takes another.
    cluster.nats[0].kill();
    // JetStream elects new leaders for the streams the killed server led: seconds, more on a busy
    // machine (the whole suite beside it); the deadlines only catch a cluster that never recovers.
    cluster.converge_within = 4 * CONVERGE_WITHIN;
    let (killed, deadline) = (Instant::now(), Instant::now() + cluster.converge_within);
    loop {
        let (status, body) = cluster.activate(1, 2).await;
        if status == 200 {
            break;
        }
        // Until the host has reconnected (and JetStream moved its leaders), a change may be refused.
        let refused = (status, &body["error"]["code"]);
        assert_eq!(refused, (503, &json!("unavailable")), "{body}");
        let waited = Instant::now() < deadline;
        assert!(waited, "no change went through with two of three servers");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "a change went through {:?} after a NATS server died",
        killed.elapsed()
    );
    cluster.all_serve(2).await;
    every_connection_answers(&cluster.sim, "Hello from the panicker.").await;
    for call in &mut live {
        call.say("echo on version 1");
        call.expect_say("on version 1").await.unwrap();
    }
    let (status, body) = cluster
        .api(2, "POST", &format!("/v1/agents/{AGENT}/rollback"), vec![])
        .await;
    assert_eq!(status, 200, "{body}");
    cluster.all_serve(1).await;
}

/// Restarts host `at` as a rolling update does: SIGTERM (it hands its calls over and exits 0), then the
/// same host again, waited for until it serves `version`. Returns what the old one logged.
async fn restart(cluster: &mut Cluster, at: usize, version: u64) -> String {
    let old = cluster.hosts.remove(at);
    let log = tokio::task::spawn_blocking(move || old.stop())
        .await
        .unwrap();
    let id = ["a", "b", "c"][at];
    keep_log(&format!("{id}-stopped"), &log);
    let new = cluster.host(id);
    new.healthy().await;
    cluster.hosts.insert(at, new);
    cluster
        .until(at, |status, agent| {
            status == 200 && agent["served_version"] == version && agent["status"] == "serving"
        })
        .await;
    log
}

/// The `key=value` a host logged on its "cluster: left" line.
fn left_count(log: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("cluster: left"))
        .unwrap_or_else(|| panic!("the host never said it left:\n{log}"));
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_host_loses_no_call_and_no_frame() {
    let calls: usize = std::env::var("CLUSTER_ROLLING_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let mut cluster = Cluster::start("rolling").await;
    cluster.upload(0, "conformance", true).await;
    cluster.all_serve(1).await;
    while cluster.sim.usable_connections(AGENT).len() < 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let plan = sentsim::chaos::ChaosPlan {
        calls,
        at_once: calls,
        lines: 150,
        line_every: Duration::from_millis(200),
        audio_one_in: 3,
        fault_every: None,
        seed: fastrand::u64(..),
    };
    let sim = cluster.sim.clone();
    let run = tokio::spawn(async move { sentsim::chaos::run(&sim, AGENT, &plan).await });
    // Every call placed and talking, spread over the three hosts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut handed_over, mut taken_back) = (0, 0);
    let mut logs = Vec::new();
    for at in 0..3 {
        let log = restart(&mut cluster, at, 1).await;
        assert_eq!(left_count(&log, "left_behind"), 0, "{log}");
        handed_over += left_count(&log, "handed_over");
        taken_back += left_count(&log, "taken_back");
        logs.push(log);
    }
    let report = run
        .await
        .unwrap()
        .unwrap_or_else(|broken| panic!("{broken}"));
    let mut gaps = report.audio_gaps.clone();
    gaps.sort();
    eprintln!(
        "rolling restart: {report}; {handed_over} handovers; audio gap per call p50 {:?}, max {:?}",
        gaps.get(gaps.len() / 2),
        gaps.last()
    );
    assert_eq!(report.lost, 0, "{report}");
    assert_eq!(report.ended, calls, "{report}");
    // Peers that serve the version and are not leaving take every offer: none waits to be taken back.
    assert_eq!(taken_back, 0, "offers no peer took");
    assert!(
        handed_over >= calls as u64,
        "each call lives through three restarts, so it is handed over at least once: {handed_over}"
    );
    let violations = cluster.sim.violations_since(0);
    assert!(violations.is_empty(), "{violations:?}");
    // The fresh instance a moved call starts with is told so (the conformance agent logs the reason), on
    // the host that took it or on the leaving host that took it back. A call moved again before its guest
    // heard of the first move hears of the last one only; and a call's last move is heard of, as it
    // talks on for seconds after the last restart.
    logs.extend(cluster.hosts.iter().map(|h| h.log.lock().unwrap().clone()));
    let told = |reason: &str| {
        let line = format!("guest=\"restarted after: {reason}\"");
        logs.iter()
            .map(|log| log.matches(&line).count())
            .sum::<usize>() as u64
    };
    let moved = told("moved");
    eprintln!(
        "rolling restart: {moved} fresh instances told the call moved, {taken_back} taken back"
    );
    assert!(
        (calls as u64..=handed_over + taken_back).contains(&moved),
        "{moved} fresh instances told the call moved, for {calls} calls, {handed_over} handovers and \
         {taken_back} taken back"
    );
    assert_eq!(told("forced"), 0, "no restart here is forced");
}

/// A peer that takes the first call offered, claims it, and dies before it resumes it (nor answers the
/// offer). Returns the session id it claimed.
async fn claim_and_die(nats_url: String) -> tokio::task::JoinHandle<String> {
    use futures_util::StreamExt as _;
    use sha2::Digest as _;
    let client = async_nats::connect(nats_url).await.unwrap();
    let subject = "voicehost.voicehost.handover";
    let mut offers = client
        .queue_subscribe(subject, format!("{subject}.takers"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    tokio::spawn(async move {
        let offer = offers.next().await.expect("a call offered");
        let offer: Value = serde_json::from_slice(&offer.payload).unwrap();
        let call = &offer["call"]["call"];
        let session = call["session_id"].as_str().unwrap().to_string();
        let mut hash = sha2::Sha256::new();
        hash.update(session.as_bytes());
        hash.update([0]);
        hash.update(call["token"].as_str().unwrap().as_bytes());
        let name: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let claims = async_nats::jetstream::new(client.clone())
            .get_key_value("voicehost-claims")
            .await
            .unwrap();
        claims
            .create(format!("c{name}"), "dead-peer".into())
            .await
            .expect("the first claim on the call");
        // Dies: no resume, no answer.
        drop(offers);
        drop(client);
        session
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_between_its_claim_and_its_resume_leaves_the_call_served_once() {
    let mut cluster = Cluster::start_hosts("claim-killed", "", 1, &["a"]).await;
    cluster.upload(0, "conformance", true).await;
    cluster.all_serve(1).await;
    let dead_peer = claim_and_die(cluster.nats[0].url()).await;
    let conn = cluster.sim.usable_connections(AGENT).remove(0);
    let mut call = conn.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    call.say("echo before");
    call.expect_say("before").await.unwrap();

    // A leaves: its only peer claims the call and dies; A takes it back, serves it, and offers it again
    // once B is there.
    let leaving = cluster.hosts.remove(0);
    let stopped = tokio::task::spawn_blocking(move || leaving.stop());
    let claimed = tokio::time::timeout(Duration::from_secs(20), dead_peer)
        .await
        .expect("the dead peer was offered the call")
        .unwrap();
    assert_eq!(claimed, call.id);
    call.say("echo while nobody has it");
    let b = cluster.host("b");
    b.healthy().await;
    cluster.hosts.push(b);
    cluster
        .until(0, |status, agent| {
            status == 200 && agent["status"] == "serving"
        })
        .await;
    let log = stopped.await.unwrap();
    assert!(left_count(&log, "taken_back") >= 1, "{log}");
    assert_eq!(left_count(&log, "handed_over"), 1, "{log}");
    assert_eq!(left_count(&log, "left_behind"), 0, "{log}");
    call.expect_say("while nobody has it").await.unwrap();
    call.say("echo after");
    call.expect_say("after").await.unwrap();
    let state = call.state().unwrap();
    assert!(!state.lost, "{state:?}");
    // Served once: each line echoed once.
    let says: Vec<String> = call
        .accepted_frames()
        .iter()
        .filter(|j| j["type"] == "agent.say")
        .filter_map(|j| j["text"].as_str().map(str::to_string))
        .collect();
    for line in ["before", "while nobody has it", "after"] {
        assert_eq!(says.iter().filter(|s| *s == line).count(), 1, "{says:?}");
    }
    let violations = cluster.sim.violations_since(0);
    assert!(violations.is_empty(), "{violations:?}");
}
