//! Crash safety of the registry, with the real `voicehost` binary: it is killed (SIGKILL) at random points
//! of uploads, activations, rollbacks and deletes, again and again, and after each start it must load,
//! hold the state it last answered for (or that with the change in flight done, never half of it), serve
//! its active versions, and keep nothing no version refers to: no component, no compiled form, no partial
//! file. `CRASH_SEED` replays one run's random choices (not its timing); `CRASH_ROUNDS` sets how many kills (10 by default).

use crate::operator::{one_tenant, Served};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use voicehost_testkit::admin;

const TOKEN: &str = "vh_crash_test_token";
const AGENTS: [&str; 2] = ["agent_crash-a", "agent_crash-b"];

/// An agent as the registry holds it: its active version, and each version's digest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Agent {
    active: Option<u64>,
    versions: BTreeMap<u64, String>,
}

type State = BTreeMap<String, Agent>;

/// One change to the registry.
#[derive(Debug, Clone)]
enum Change {
    Upload {
        agent: String,
        digest: String,
        activate: bool,
    },
    Activate {
        agent: String,
        version: u64,
    },
    Rollback {
        agent: String,
    },
    DeleteVersion {
        agent: String,
        version: u64,
    },
    DeleteAgent {
        agent: String,
    },
}

impl Change {
    /// Whether `after` is `before` with this change made, whole.
    fn explains(&self, before: &State, after: &State) -> bool {
        let agent = match self {
            Change::Upload { agent, .. }
            | Change::Activate { agent, .. }
            | Change::Rollback { agent }
            | Change::DeleteVersion { agent, .. }
            | Change::DeleteAgent { agent } => agent,
        };
        let others = |state: &State| {
            let mut state = state.clone();
            state.remove(agent);
            state
        };
        if others(before) != others(after) {
            return false;
        }
        let old = before.get(agent).cloned().unwrap_or_default();
        let Some(new) = after.get(agent) else {
            return matches!(self, Change::DeleteAgent { .. });
        };
        match self {
            Change::Upload {
                digest, activate, ..
            } => {
                let added: Vec<_> = new
                    .versions
                    .iter()
                    .filter(|(v, _)| !old.versions.contains_key(v))
                    .collect();
                let kept = old
                    .versions
                    .iter()
                    .all(|(v, d)| new.versions.get(v) == Some(d));
                let newest = old.versions.keys().max().copied().unwrap_or(0);
                kept && added.len() == 1
                    && added[0].1 == digest
                    && *added[0].0 > newest
                    && new.versions.len() == old.versions.len() + 1
                    && new.active
                        == if *activate {
                            Some(*added[0].0)
                        } else {
                            old.active
                        }
            }
            Change::Activate { version, .. } => {
                new.versions == old.versions && new.active == Some(*version)
            }
            // The version it returns to is the registry's to know (`previous`, which the API does not show).
            Change::Rollback { .. } => {
                new.versions == old.versions
                    && new.active != old.active
                    && new.active.is_some_and(|v| new.versions.contains_key(&v))
            }
            Change::DeleteVersion { version, .. } => {
                let mut expected = old.versions.clone();
                expected.remove(version);
                new.versions == expected && new.active == old.active
            }
            Change::DeleteAgent { .. } => false,
        }
    }
}

/// The looper agent with a custom section that makes it the `n`th distinct component.
fn variant(n: u64) -> Vec<u8> {
    let name = b"voicehost-crash-test";
    let mut section = vec![name.len() as u8];
    section.extend(name);
    section.extend(n.to_le_bytes());
    let mut wasm = voicehost_test_programs::read("looper");
    wasm.push(0);
    wasm.push(section.len() as u8);
    wasm.extend(section);
    wasm
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The registry's state as the admin API shows it; `None` when the host cannot be reached.
async fn read_state(admin_url: &str) -> Option<State> {
    let (status, list) = admin::send(admin_url, "GET", "/v1/agents", Some(TOKEN), vec![])
        .await
        .ok()?;
    assert_eq!(status, 200, "{list}");
    let mut state = State::new();
    for agent in list["agents"].as_array().unwrap() {
        let versions = agent["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["version"].as_u64().unwrap(),
                    v["digest"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let id = agent["agent_id"].as_str().unwrap().to_string();
        // An active version is served (here: dialling Sent), so its component loaded.
        if !agent["active_version"].is_null() {
            assert_ne!(agent["status"], "inactive", "{agent}");
        }
        state.insert(
            id,
            Agent {
                active: agent["active_version"].as_u64(),
                versions,
            },
        );
    }
    Some(state)
}

/// A change that makes sense on `state`, and the request that makes it.
fn pick(rng: &mut fastrand::Rng, state: &State, n: u64) -> (Change, &'static str, String, Vec<u8>) {
    let agent = AGENTS[rng.usize(..AGENTS.len())].to_string();
    let record = state.get(&agent).cloned().unwrap_or_default();
    let inactive: Vec<u64> = record
        .versions
        .keys()
        .copied()
        .filter(|v| Some(*v) != record.active)
        .collect();
    let base = format!("/v1/agents/{agent}");
    match rng.u8(..100) {
        0..=39 => {
            let activate = rng.bool();
            let wasm = variant(n);
            let change = Change::Upload {
                agent,
                digest: digest_of(&wasm),
                activate,
            };
            (
                change,
                "POST",
                format!("{base}/versions?activate={activate}"),
                wasm,
            )
        }
        40..=59 if !record.versions.is_empty() => {
            let versions: Vec<u64> = record.versions.keys().copied().collect();
            let version = versions[rng.usize(..versions.len())];
            let body = format!("{{\"version\":{version}}}").into_bytes();
            (
                Change::Activate { agent, version },
                "POST",
                format!("{base}/activate"),
                body,
            )
        }
        60..=74 if record.active.is_some() => (
            Change::Rollback { agent },
            "POST",
            format!("{base}/rollback"),
            vec![],
        ),
        75..=94 if !inactive.is_empty() => {
            let version = inactive[rng.usize(..inactive.len())];
            (
                Change::DeleteVersion { agent, version },
                "DELETE",
                format!("{base}/versions/{version}"),
                vec![],
            )
        }
        95.. if !record.versions.is_empty() => {
            (Change::DeleteAgent { agent }, "DELETE", base, vec![])
        }
        _ => pick(rng, state, n),
    }
}

/// What the data directory holds must be exactly what the state refers to: every component there, intact,
/// and nothing else; compiled forms only of those; no partial file.
fn check_disk(data: &Path, state: &State) {
    let used: BTreeSet<String> = state
        .values()
        .flat_map(|a| a.versions.values().cloned())
        .collect();
    let mut stored = BTreeSet::new();
    for entry in std::fs::read_dir(data.join("components")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "index.json" {
            continue;
        }
        let hex = name
            .strip_suffix(".wasm")
            .unwrap_or_else(|| panic!("a stray file {name}"));
        let digest = format!("sha256:{hex}");
        assert_eq!(
            digest_of(&std::fs::read(&path).unwrap()),
            digest,
            "{name} is damaged"
        );
        stored.insert(digest);
    }
    assert_eq!(
        stored, used,
        "the components kept are not those the versions refer to"
    );
    if let Ok(compiled) = std::fs::read_dir(data.join("compiled")) {
        for entry in compiled {
            let name = entry.unwrap().file_name().to_string_lossy().to_string();
            let hex = name.split('-').next().unwrap();
            assert!(name.ends_with(".cwasm"), "a stray compiled file {name}");
            assert!(
                used.contains(&format!("sha256:{hex}")),
                "a compiled form no version needs: {name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_amid_registry_changes_reopens_to_a_committed_state_with_nothing_left_over() {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let rounds: usize = std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut rng = fastrand::Rng::with_seed(seed);
    let (dir, config) = one_tenant("crash", TOKEN);

    let mut committed = State::new();
    let mut in_flight: Option<(Change, bool)> = None;
    let mut uploads = 0u64;
    let mut changes_made = 0;
    let mut cut_short = 0;
    for round in 0..rounds {
        let context = format!("seed {seed} (CRASH_SEED={seed}), round {round}");
        let mut served = Served::start(&config);
        served.healthy().await;
        let now = read_state(&served.admin).await.expect("the host answers");
        match &in_flight {
            None => assert_eq!(now, committed, "{context}"),
            // Answered as made: it must have been. In flight (or refused, 409): whole or not at all.
            Some((change, answered)) => assert!(
                change.explains(&committed, &now) || (!answered && now == committed),
                "{context}: after {change:?} (answered: {answered})\nbefore: {committed:?}\nnow: {now:?}"
            ),
        }
        check_disk(&dir.join("data"), &now);
        committed = now;

        // Changes, one after the other, until the kill comes.
        let shared = Arc::new(Mutex::new((
            committed.clone(),
            None::<(Change, bool)>,
            0usize,
        )));
        let worker = tokio::spawn({
            let admin_url = served.admin.clone();
            let shared = shared.clone();
            let mut rng = fastrand::Rng::with_seed(rng.u64(..));
            let first = uploads;
            async move {
                let mut n = first;
                loop {
                    let state = shared.lock().unwrap().0.clone();
                    let (change, method, path, body) = pick(&mut rng, &state, n);
                    if matches!(change, Change::Upload { .. }) {
                        n += 1;
                    }
                    shared.lock().unwrap().1 = Some((change.clone(), false));
                    let Ok((status, answer)) =
                        admin::send(&admin_url, method, &path, Some(TOKEN), body).await
                    else {
                        return n;
                    };
                    assert!(
                        (200..300).contains(&status) || status == 409,
                        "{change:?}: {status} {answer}"
                    );
                    // A 409 refused the change (a rollback with nothing to go back to, an activation
                    // of a version deleted meanwhile): answered, and made not at all.
                    shared.lock().unwrap().1 = Some((change, status != 409));
                    let Some(after) = read_state(&admin_url).await else {
                        return n;
                    };
                    let mut shared = shared.lock().unwrap();
                    shared.0 = after;
                    shared.1 = None;
                    shared.2 += 1;
                }
            }
        });
        // Each round kills after at least one change was answered (however slow the machine), then
        // amid whatever comes next: the kills test something on a loaded machine too.
        let first_answered = async {
            while shared.lock().unwrap().2 == 0 && !worker.is_finished() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), first_answered)
            .await
            .unwrap_or_else(|_| panic!("{context}: no change answered in 120 s"));
        tokio::time::sleep(Duration::from_millis(rng.u64(0..2000))).await;
        served.child.kill().unwrap();
        served.child.wait().unwrap();
        uploads = worker.await.unwrap();
        let (last, pending, made) = shared.lock().unwrap().clone();
        committed = last;
        cut_short += usize::from(pending.is_some());
        in_flight = pending;
        changes_made += made;
        drop(served);
    }
    eprintln!(
        "{rounds} kills, {cut_short} while a change was in flight or being read back, {changes_made} \
         changes answered, {uploads} uploads (seed {seed})"
    );
    // A kill that finds nothing in progress tests nothing: most must come amid a change, after others
    // were made (a host too slow to answer any would pass every check above).
    assert!(
        changes_made >= rounds && cut_short * 2 >= rounds,
        "only {changes_made} changes answered and {cut_short} kills with a change in flight or being read back \
         in {rounds} rounds (seed {seed})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
