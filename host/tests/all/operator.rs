//! An operator's first minutes, with the real `voicehost` binary: make a token, write the config, `serve`,
//! upload an agent with `voicehost agents`, take a call from the simulator, read sessions and metrics, stop
//! with SIGTERM, start again (served from the cache), and at the end scan everything the host printed or
//! answered for the API key, the admin tokens and the resume tokens.

use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use voicehost_testkit::{metric, request};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_voicehost");
pub(crate) const KEY: &str = "sk_operator_sent_key_do_not_leak";
const AGENT: &str = "agent_support";

/// A running `voicehost serve`, its stderr collected line by line.
pub(crate) struct Served {
    pub(crate) child: Child,
    pub(crate) log: Arc<Mutex<String>>,
    /// The thread reading the host's stderr into `log`: it ends when the host's stderr does.
    reader: Option<std::thread::JoinHandle<()>>,
    pub(crate) admin: String,
}

impl Served {
    pub(crate) fn start(config: &Path) -> Served {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--config"])
            .arg(config)
            // Everything the host and its libraries log at debug, to be sure none of it holds a secret.
            .env("RUST_LOG", "debug");
        let (mut served, addr) = Served::spawn(command);
        // On a panic here `served` is dropped, and the child killed with it.
        let addr = addr
            .recv_timeout(Duration::from_secs(30))
            .expect("voicehost says where its admin API listens");
        served.admin = format!("http://{addr}");
        served
    }

    /// `command` (`voicehost` and its arguments) running, its stderr collected line by line, killed when
    /// dropped; the receiver gets the admin API's address if it says one.
    pub(crate) fn spawn(mut command: Command) -> (Served, std::sync::mpsc::Receiver<String>) {
        let mut child = command
            .env_remove("RUST_BACKTRACE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("voicehost starts");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let (found, addr) = std::sync::mpsc::channel();
        let reader = std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("admin API listening") {
                        if let Some(at) = line.split("addr=").nth(1) {
                            let _ =
                                found.send(at.split_whitespace().next().unwrap_or("").to_string());
                        }
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        let served = Served {
            child,
            log,
            reader: Some(reader),
            admin: String::new(),
        };
        (served, addr)
    }

    pub(crate) async fn healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, _) = request(&self.admin, "GET", "/healthz", None, vec![]).await;
            if status == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "never healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{name}");
    }

    /// Waits until the host has logged `text` (at most 20 s).
    pub(crate) fn wait_for_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log.lock().unwrap().contains(text) {
            assert!(Instant::now() < deadline, "the host never logged {text:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, and the exit that follows (which must be 0).
    pub(crate) fn stop(self) -> String {
        let (status, log) = self.stop_with(&["TERM"]);
        assert!(status.success(), "voicehost exited with {status}\n{log}");
        log
    }

    /// These signals, one after the other (each once the host has logged that it is stopping), and the
    /// exit that follows: its status and the whole log.
    fn stop_with(mut self, signals: &[&str]) -> (std::process::ExitStatus, String) {
        for (n, signal) in signals.iter().enumerate() {
            if n > 0 {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !self
                    .log
                    .lock()
                    .unwrap()
                    .contains("stopping: closing every connection")
                {
                    assert!(
                        Instant::now() < deadline,
                        "voicehost never said it was stopping"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            self.signal(signal);
        }
        // A host in a cluster first hands its calls over (at most its `leave_seconds`, 30 in the tests).
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "voicehost did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The whole log: the reader has read to the end of the pipe, which the exit closed.
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the log reader");
        }
        let log = self.log.lock().unwrap().clone();
        (status, log)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `voicehost agents …` as the operator types it; returns stdout, and fails on a non-zero exit.
fn agents(admin: &str, token: &str, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("agents")
        .args(args)
        .env("VOICEHOST_ADMIN", admin)
        .env("VOICEHOST_TOKEN", token)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(output.status.success(), "agents {args:?}: {stderr}");
    stdout + &stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_serves_an_uploaded_agent_restarts_from_the_cache_and_no_secret_leaks() {
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
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("operator-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    // A token for the tenant, and the line for the config.
    let made = Command::new(BIN).args(["token", "new"]).output().unwrap();
    let made = String::from_utf8(made.stdout).unwrap();
    let mut lines = made.lines();
    let token = lines.next().unwrap().trim().to_string();
    let hash_line = lines.next().unwrap().trim().to_string();
    assert!(token.starts_with("vh_"), "{made}");
    assert!(hash_line.starts_with("token_sha256 = "), "{made}");
    let mut hashed = Command::new(BIN)
        .args(["token", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(hashed.stdin.as_mut().unwrap(), token.as_bytes()).unwrap();
    let hashed = String::from_utf8(hashed.wait_with_output().unwrap().stdout).unwrap();
    assert!(hash_line.contains(hashed.trim()), "{hashed} in {hash_line}");
    // A token anyone could guess is not hashed.
    let mut weak = Command::new(BIN)
        .args(["token", "hash"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(weak.stdin.as_mut().unwrap(), b"a").unwrap();
    let weak = weak.wait_with_output().unwrap();
    assert!(!weak.status.success());
    assert!(
        String::from_utf8_lossy(&weak.stderr).contains("too easy to guess"),
        "{weak:?}"
    );

    std::fs::write(dir.join("support.key"), KEY).unwrap();
    let config = dir.join("voicehost.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\nsent_url = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nid = \"support-co\"\n{hash_line}\napi_key_file = \"{}\"\n",
            sim.url(),
            dir.join("support.key").display()
        ),
    )
    .unwrap();

    let served = Served::start(&config);
    served.healthy().await;
    let wasm = voicehost_test_programs::CONFORMANCE;
    let uploaded = agents(
        &served.admin,
        &token,
        &["upload", AGENT, wasm, "--activate"],
    );
    let mut said = Vec::new();
    let conn = sim.connection_for(Some(AGENT)).await.unwrap();
    let mut call = conn.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    let sessions = agents(&served.admin, &token, &["sessions"]);
    assert!(sessions.contains(&call.id), "{sessions}");
    call.say("echo first run");
    call.expect_say("first run").await.unwrap();
    call.end("completed");
    let listed = agents(&served.admin, &token, &["list", "--json"]);
    let listed: Value = serde_json::from_str(&listed).expect(&listed);
    assert_eq!(listed["agents"][0]["active_version"], 1, "{listed}");
    let (_, metrics) = request(&served.admin, "GET", "/metrics", None, vec![]).await;
    let metrics = metrics.as_str().unwrap().to_string();
    let labels = format!("tenant=\"support-co\",agent=\"{AGENT}\"");
    assert_eq!(
        metric(
            &metrics,
            &format!("voicehost_sessions_started_total{{{labels}}}")
        ),
        1.0
    );
    assert_eq!(metric(&metrics, "voicehost_compilations_total"), 1.0);
    said.extend([uploaded, sessions, listed.to_string(), metrics]);

    // A second tenant joins without a restart: the config gains it, and SIGHUP reloads it.
    let second = "vh_second_tenant_admin_token";
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[[tenants]]\nid = \"second-co\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}\"\n",
        voicehost::tenancy::token_sha256(second),
        dir.join("support.key").display()
    ));
    std::fs::write(&config, text).unwrap();
    served.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = request(&served.admin, "GET", "/v1/agents", Some(second), vec![]).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the new tenant never got in");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut logs = served.stop();
    assert!(logs.contains("the config is reloaded"), "{logs}");

    // Started again on the same data directory: nothing is compiled, and calls are served.
    let served = Served::start(&config);
    served.healthy().await;
    let (_, metrics) = request(&served.admin, "GET", "/metrics", None, vec![]).await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert_eq!(
        metric(&metrics, "voicehost_compilations_total"),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "voicehost_compiled_cache_loads_total"),
        1.0
    );
    let conn = sim.connection_for(Some(AGENT)).await.unwrap();
    let mut call = conn.start_text();
    call.expect_say("Hello from the conformance agent.")
        .await
        .unwrap();
    let shown = agents(&served.admin, &token, &["show", AGENT]);
    said.extend([metrics, shown]);
    // Stopped with the call still on: its connection closes with 1000, so Sent sends it to the fallback.
    logs.push_str(&served.stop());
    assert_eq!(
        conn.closed(Duration::from_secs(5)).await.unwrap(),
        "closed by the agent with 1000"
    );
    assert!(logs.contains("stopped"), "{logs}");

    // The resume tokens Sent handed out, from the simulator's own record.
    let resume_tokens: Vec<String> = sim
        .recorder()
        .since(0, |r| r.json().is_some())
        .iter()
        .filter_map(|r| r.json()?["resume"]["token"].as_str().map(str::to_string))
        .collect();
    assert!(!resume_tokens.is_empty(), "the calls had resume tokens");
    assert!(
        logs.contains("session started"),
        "the log is the host's: {logs}"
    );
    let everything = said.join("\n") + &logs;
    for secret in [KEY, &token]
        .into_iter()
        .chain(resume_tokens.iter().map(String::as_str))
    {
        assert!(
            !everything.contains(secret),
            "a secret ({}…) appears in what the host printed or answered",
            &secret[..6]
        );
    }
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory `name` under the tests' temporary directory, with a config for one tenant `t` whose
/// admin token is `token`, and whose Sent is an address where nothing listens (its active agents keep
/// dialling; only the admin API matters). Returns the directory and the config's path.
pub(crate) fn one_tenant(name: &str, token: &str) -> (PathBuf, PathBuf) {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key"), KEY).unwrap();
    let config = dir.join("voicehost.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\nsent_url = \"ws://127.0.0.1:9/never\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nid = \"t\"\ntoken_sha256 = \"{}\"\napi_key_file = \"{}\"\n",
            voicehost::tenancy::token_sha256(token),
            dir.join("key").display()
        ),
    )
    .unwrap();
    (dir, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_while_the_first_waits_for_a_slow_client() {
    // One tenant with no agent: nothing connects anywhere; only the admin API listens.
    let token = "vh_signal_test_token";
    let (dir, config) = one_tenant("operator-signal", token);
    let served = Served::start(&config);
    served.healthy().await;
    // A client that starts an upload and never sends its body: the first signal's graceful stop waits
    // for it (up to its grace period); the second does not.
    let address = served.admin.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut slow,
        format!(
            "POST /v1/agents/agent_x/versions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Length: 1000000\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (status, log) = tokio::task::spawn_blocking(move || served.stop_with(&["TERM", "TERM"]))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("a second signal: exiting at once"), "{log}");
    // Not by the first signal's path, which ends in "stopped" or in the grace period's warning.
    assert!(
        !log.contains("stopped") && !log.contains("grace period"),
        "{log}"
    );
    drop(slow);
    let _ = std::fs::remove_dir_all(&dir);
}
