//! A failure policy's transfer must be one Sent's codec can send: the protocol's `transfer` tool takes a
//! party of kind `user`, `number` or `agent`, a number in E.164 form (`^\+[1-9][0-9]{6,14}$`). A policy
//! to any other party is accepted today by the policy's own text and JSON (what `voicehost run`, the CLI,
//! the admin API and the registry read), then fails to encode when a call needs it: no transfer and no
//! hangup, and the caller waits in silence (the pressure scenario `unsendable_policy_transfer_hangs_up`
//! shows that from Sent's side). Every way in must refuse such a party.

use crate::operator::{BIN, KEY};
use sentdm_voice_agents::frames::{self, Frame, ToolCall};
use sentsim::sim::Account;
use sentsim::{Sim, SimConfig};
use serde_json::{json, Map, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use voicehost::agent::FailurePolicy;
use voicehost_testkit::{Hosting, ACME_TOKEN};

/// Parties the codec refuses as a transfer's `to`: a kind it does not transfer to, numbers that are not
/// E.164.
const UNSENDABLE: &[(&str, &str)] = &[
    ("sip", "sip:desk@example.com"),
    ("number", "14155550100"),
    ("number", "+1"),
    ("number", "+1 415 555 0100"),
    ("conference", "room-7"),
];

/// Parties it sends.
const SENDABLE: &[(&str, &str)] = &[
    ("number", "+14155550100"),
    ("user", "conformance-desk"),
    ("agent", "agent_backup"),
];

/// Whether the official codec encodes a `transfer` tool call to this party.
fn codec_sends(kind: &str, value: &str) -> bool {
    let mut to = Map::new();
    to.insert("kind".into(), Value::String(kind.into()));
    to.insert("value".into(), Value::String(value.into()));
    let mut arguments = Map::new();
    arguments.insert("to".into(), Value::Object(to));
    let call = Frame::ToolCall(ToolCall {
        session_id: "vs_policy-1".into(),
        call_ref: "t1".into(),
        name: "transfer".into(),
        arguments: Some(arguments),
    });
    frames::encode(&call).is_ok()
}

#[test]
fn the_policys_text_and_json_refuse_a_party_the_codec_cannot_send() {
    for &(kind, value) in SENDABLE {
        assert!(codec_sends(kind, value), "the codec refuses {kind}:{value}");
        assert!(
            format!("transfer:{kind}:{value}")
                .parse::<FailurePolicy>()
                .is_ok(),
            "{kind}:{value}"
        );
    }
    let mut accepted = Vec::new();
    for &(kind, value) in UNSENDABLE {
        assert!(!codec_sends(kind, value), "the codec sends {kind}:{value}");
        let text = format!("transfer:{kind}:{value}");
        let json = json!({"action": "transfer", "to": {"kind": kind, "value": value}});
        if text.parse::<FailurePolicy>().is_ok() {
            accepted.push(format!("the text {text:?}"));
        }
        if serde_json::from_value::<FailurePolicy>(json.clone()).is_ok() {
            accepted.push(format!("the JSON {json}"));
        }
        if FailurePolicy::transfer(kind, value).is_ok() {
            accepted.push(format!("FailurePolicy::transfer({kind:?}, {value:?})"));
        }
    }
    assert!(
        accepted.is_empty(),
        "failure policies whose transfer the codec cannot send were accepted:\n    {}",
        accepted.join("\n    ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_failure_policy_the_codec_cannot_send() {
    let hosting = Hosting::start("policy-party", "").await;
    hosting
        .deploy(ACME_TOKEN, "agent_acme", "conformance")
        .await;
    let path = "/v1/agents/agent_acme/failure-policy";
    let mut accepted = Vec::new();
    for &(kind, value) in UNSENDABLE {
        let policy = json!({"action": "transfer", "to": {"kind": kind, "value": value}});
        let (status, answer) = hosting
            .api(
                "PUT",
                path,
                Some(ACME_TOKEN),
                policy.to_string().into_bytes(),
            )
            .await;
        if status != 400 || answer["error"]["code"] != "bad_request" {
            let now = &answer["failure_policy"];
            accepted.push(format!("{policy}: {status}, the agent's policy now {now}"));
        }
    }
    let (_, agent) = hosting
        .api("GET", "/v1/agents/agent_acme", Some(ACME_TOKEN), vec![])
        .await;
    hosting.finish().await;
    assert!(
        accepted.is_empty(),
        "PUT {path} took policies whose transfer the codec cannot send (400 bad_request wanted):\n    {}\nthe agent now: {}",
        accepted.join("\n    "),
        agent["failure_policy"]
    );
}

/// How `voicehost` with these arguments ended: its exit status and what it wrote to stderr, or `None`
/// when it was still running after `within`.
fn exit_of(command: &mut Command, within: Duration) -> Option<(i32, String)> {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    status.map(|s| (s.code().unwrap_or(-1), stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_on_repeated_traps_to_a_party_the_codec_cannot_send() {
    let sim = Sim::start_local(SimConfig {
        heartbeat_interval_ms: 1000,
        accounts: vec![Account {
            api_key: KEY.into(),
            agents: vec!["agent_policy".into()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let url = sim.url();
    for policy in [
        "transfer:sip:sip:desk@example.com",
        "transfer:number:14155550100",
    ] {
        let before = sim.attempts();
        let mut run = Command::new(BIN)
            .args(["run", "--agent", voicehost_test_programs::CONFORMANCE])
            .args(["--agent-id", "agent_policy", "--url", &url])
            .args(["--on-repeated-traps", policy])
            .env("SENT_API_KEY", KEY)
            .env_remove("VOICEHOST_CACHE_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Refused, it stops at once; taken, it dials Sent to serve (the deadline is only a bound).
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = run.try_wait().unwrap() {
                break Some(status);
            }
            if sim.attempts() > before || Instant::now() > deadline {
                let _ = run.kill();
                let _ = run.wait();
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
        let dialled = sim.attempts() - before;
        assert!(
            status.is_some_and(|s| !s.success()) && dialled == 0,
            "voicehost run took --on-repeated-traps {policy}, a transfer the codec cannot send ({dialled} handshake(s) with Sent, exit {status:?})\n{stderr}"
        );
    }
    sim.shutdown();
}

#[test]
fn the_cli_refuses_a_failure_policy_the_codec_cannot_send_before_asking_the_api() {
    // An admin API that counts the connections it gets, and answers none.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    for policy in [
        "transfer:sip:sip:desk@example.com",
        "transfer:number:14155550100",
    ] {
        let mut cli = Command::new(BIN);
        cli.args(["agents", "--admin", &admin, "--timeout", "3"])
            .args(["policy", "agent_policy", policy])
            .env("VOICEHOST_TOKEN", "vh_policy_test_token")
            .env_remove("VOICEHOST_ADMIN");
        let ended = exit_of(&mut cli, Duration::from_secs(20));
        let asked = std::iter::from_fn(|| listener.accept().ok()).count();
        let (code, stderr) = ended.expect("the CLI did not end");
        assert!(
            code != 0 && asked == 0,
            "voicehost agents policy agent_policy {policy}: exit {code}, {asked} connection(s) to the admin API\n{stderr}"
        );
    }
}
