//! A component built against `voicehost:agent@0.1.0` keeps working across the host's move to 0.2.0: it is
//! uploaded and stored, the host is stopped and started again on the same data directory (the store's
//! format did not change with 0.2.0, so this is what a component stored by the release before is read
//! as), and its calls are served through the adapter, marked deprecated in the API's view, the log and a
//! metric.

use crate::operator::{Served, BIN, KEY};
use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use std::path::PathBuf;
use std::process::Command;
use voicehost_testkit::{metric, request};

const AGENT: &str = "agent_legacy";
const TOKEN: &str = "vh_legacy_world_admin_token";

fn agents(admin: &str, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("agents")
        .args(args)
        .env("VOICEHOST_ADMIN", admin)
        .env("VOICEHOST_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(output.status.success(), "agents {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_component_stored_before_the_upgrade_is_still_served_and_marked_deprecated() {
    let sim = Sim::start_local(SimConfig {
        accounts: vec![Account {
            api_key: KEY.into(),
            agents: vec![AGENT.into()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("legacy-world-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key"), KEY).unwrap();
    let config = dir.join("voicehost.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\nsent_url = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nid = \"t\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}\"\n",
            sim.url(),
            voicehost::tenancy::token_sha256(TOKEN),
            dir.join("key").display()
        ),
    )
    .unwrap();

    // Stored, by an upload.
    let served = Served::start(&config);
    served.healthy().await;
    agents(
        &served.admin,
        &[
            "upload",
            AGENT,
            voicehost_test_programs::LEGACY,
            "--activate",
        ],
    );
    served.stop();

    // Started again: served from the store, through the adapter.
    let served = Served::start(&config);
    served.healthy().await;
    let conn = sim.connection_for(Some(AGENT)).await.unwrap();
    let mut call = conn.start_text();
    call.expect_say("Hello from a 0.1.0 agent.").await.unwrap();
    call.say("echo still here");
    call.expect_say("still here").await.unwrap();
    // A trap: the fresh instance is told the reason as 0.1.0 named it.
    call.say("panic");
    call.expect_say("restarted after panic").await.unwrap();
    call.end("caller_hung_up");

    let shown = agents(&served.admin, &["show", AGENT]);
    assert!(shown.contains("0.1.0 (deprecated)"), "{shown}");
    let listed = agents(&served.admin, &["show", AGENT, "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).expect(&listed);
    assert_eq!(
        listed["versions"][0]["world"], "voicehost:agent@0.1.0",
        "{listed}"
    );
    assert_eq!(listed["versions"][0]["deprecated"], true, "{listed}");
    let (_, metrics) = request(&served.admin, "GET", "/metrics", None, vec![]).await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert_eq!(
        metric(
            &metrics,
            &format!("voicehost_deprecated_world_calls_total{{tenant=\"t\",agent=\"{AGENT}\"}}")
        ),
        1.0,
        "{metrics}"
    );
    served.wait_for_log("speaks a deprecated world");
    served.stop();
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
