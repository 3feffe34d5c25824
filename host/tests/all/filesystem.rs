//! Where the real binary reads and writes: paths given relative to another directory than the one a child
//! runs in, and a data directory the host cannot write. (The README's walkthroughs, run from a fresh
//! directory with their relative paths, are in `walkthrough.rs`; the config's paths made absolute, `~`
//! refused, and a component moved across file systems are unit tests of `tenancy::config` and `content`.)

use crate::operator::{one_tenant, BIN, KEY};
use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_refuses_to_start_on_a_data_dir_it_cannot_write_and_says_which() {
    let (dir, config) = one_tenant("unwritable", "vh_unwritable_test_token");
    // The directories exist (another user made them) but take no file from the host's user.
    for sub in ["components", "compiled", "uploads"] {
        std::fs::create_dir_all(dir.join("data").join(sub)).unwrap();
    }
    let mut serve = if rustix::process::geteuid().is_root() {
        // Root writes anywhere: the host runs as `nobody`, as a service user would, on root's directories.
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
        command
    } else {
        for sub in ["components", "compiled", "uploads"] {
            let path = dir.join("data").join(sub);
            let mut permissions = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o555);
            std::fs::set_permissions(&path, permissions).unwrap();
        }
        Command::new(BIN)
    };
    let mut child = serve
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started on a data directory it cannot write");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let components = dir.join("data/components");
    assert!(
        stderr.contains(&format!(
            "data_dir: cannot write in {}",
            components.display()
        )) && stderr.contains("Permission denied"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_relative_paths_serves_from_the_directory_it_was_started_in() {
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        accounts: vec![Account {
            api_key: KEY.into(),
            agents: vec!["agent_relative".into()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = voicehost_testkit::tmp_dir().join(format!("run-relative-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).unwrap();
    std::fs::copy(
        voicehost_test_programs::CONFORMANCE,
        dir.join("agents/conformance.wasm"),
    )
    .unwrap();
    std::fs::write(dir.join("key"), KEY).unwrap();
    let mut run = Command::new(BIN)
        .current_dir(&dir)
        .args([
            "run",
            "--agent",
            "agents/conformance.wasm",
            "--cache-dir",
            "cache",
            "--api-key-file",
            "key",
            "--agent-id",
            "agent_relative",
            "--url",
        ])
        .arg(sim.url())
        .env_remove("SENT_API_KEY")
        .env_remove("VOICEHOST_CACHE_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = async {
        let conn = sim.connection_for(Some("agent_relative")).await?;
        let mut call = conn.start_text();
        call.expect_say("Hello from the conformance agent.").await?;
        call.end("completed");
        anyhow::Ok(())
    }
    .await;
    let cached: Vec<_> = std::fs::read_dir(dir.join("cache"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default();
    let _ = run.kill();
    let _ = run.wait();
    sim.shutdown();
    served.unwrap();
    assert_eq!(
        cached.len(),
        1,
        "the compiled component, in ./cache: {cached:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
