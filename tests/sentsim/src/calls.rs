//! `sentsim calls`: the simulator with the operator's own accounts, placing text calls on every agent they
//! name and printing what each agent answers, so someone trying `voicehost serve` can watch calls arrive.
//!
//! Only the simulator's public API is used: [`Sim::connection_for`], [`ConnHandle::start_text`],
//! [`Call::say`] and [`Call::end`], and the recorder for what the agent sends. Refused frames (protocol
//! violations) are never part of the transcript; the simulator logs them, and `sentsim calls` counts them at
//! the end.

use crate::record::{Dir, Record, What};
use crate::sim::{Account, Call, ConnHandle, Sim};
use anyhow::{bail, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long the agent has to start answering the caller.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// A pause this long after the agent's last frame ends its answer (or its greeting).
pub const QUIET: Duration = Duration::from_millis(700);

/// How an API key is shown, whatever it is.
pub const MASKED_KEY: &str = "sk_…";

/// The calls to place on each agent.
#[derive(Debug, Clone)]
pub struct Plan {
    /// How many calls per agent; `None`: until the program is stopped.
    pub calls: Option<u64>,
    /// A new call this often.
    pub every: Duration,
    /// What the caller says, one `user.said` each, in order.
    pub says: Vec<String>,
    /// How long a call stays open after the caller's last line.
    pub hold: Duration,
    /// How long the agent has to connect, before its first call and between calls.
    pub connect_within: Duration,
}

/// `KEY=AGENT[,AGENT...]`. An error never repeats the text: it holds a key.
pub fn parse_account(text: &str) -> Result<Account> {
    let Some((key, agents)) = text.split_once('=') else {
        bail!("--account takes KEY=AGENT[,AGENT...]: an API key, '=', and the agent ids it owns");
    };
    let agents: Vec<String> = agents
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    if key.is_empty() || agents.is_empty() {
        bail!("--account takes KEY=AGENT[,AGENT...]: the key or the agent ids are missing");
    }
    Ok(Account {
        api_key: key.to_string(),
        agents,
    })
}

/// Every agent the accounts name, once each, in order.
pub fn agents_of(accounts: &[Account]) -> Vec<String> {
    let mut agents: Vec<String> = Vec::new();
    for agent in accounts.iter().flat_map(|a| &a.agents) {
        if !agents.contains(agent) {
            agents.push(agent.clone());
        }
    }
    agents
}

/// Places `plan`'s calls on `agent`, each in its own task, and waits for them all. Fails when the agent has
/// no usable connection within `plan.connect_within`.
pub async fn serve_agent(sim: Sim, agent: String, plan: Plan) -> Result<()> {
    let mut calls = tokio::task::JoinSet::new();
    let mut placed = 0u64;
    let mut next_at = Instant::now();
    while plan.calls.is_none_or(|n| placed < n) {
        tokio::time::sleep_until(next_at).await;
        let Some(conn) = connection(&sim, &agent, plan.connect_within).await else {
            // Let the calls already placed finish before reporting.
            calls.join_all().await;
            let secs = plan.connect_within.as_secs();
            if placed > 0 {
                bail!("{agent} lost its connection and did not come back within {secs} s");
            }
            bail!(
                "{agent} never connected within {secs} s: the API key in the tenant's api_key_file and the \
                 agent id must match an --account KEY=AGENT, the agent must be uploaded and active, and \
                 voicehost's sent_url must be {}",
                sim.url()
            );
        };
        if placed == 0 {
            println!("{agent}: connected (connection {}), placing calls", conn.id);
        }
        placed += 1;
        next_at = Instant::now() + plan.every;
        let transcript = Transcript::start(sim.clone(), &conn);
        calls.spawn(one_call(transcript, agent.clone(), placed, plan.clone()));
    }
    calls.join_all().await;
    Ok(())
}

/// The agent's newest usable connection, waiting up to `within` for one.
async fn connection(sim: &Sim, agent: &str, within: Duration) -> Option<ConnHandle> {
    let deadline = Instant::now() + within;
    // `connection_for` gives up after its own deadline: ask again until ours.
    while Instant::now() < deadline {
        let conn = tokio::time::timeout_at(deadline, sim.connection_for(Some(agent))).await;
        if let Ok(Ok(conn)) = conn {
            return Some(conn);
        }
    }
    None
}

/// One text call: the greeting, each line and its answer, the hold, then `session.end` "completed".
async fn one_call(mut transcript: Transcript, agent: String, number: u64, plan: Plan) {
    let who = format!("[{agent} {}]", transcript.call.id);
    println!("{who} call {number} started");
    transcript.print_answer(&who, QUIET).await;
    for line in &plan.says {
        if let Some(reason) = transcript.ended() {
            println!("{who} the call ended ({reason}) before the caller said {line:?}");
            return;
        }
        println!("{who} caller: {line}");
        transcript.call.say(line);
        if transcript.print_answer(&who, ANSWER_WITHIN).await == 0 {
            println!("{who} (no answer within {} s)", ANSWER_WITHIN.as_secs());
        }
    }
    // Anything the agent says while the call is held still shows.
    let until = Instant::now() + plan.hold;
    while let Some(record) = transcript
        .next(until.saturating_duration_since(Instant::now()))
        .await
    {
        println!("{who} {}", describe(&record));
    }
    match transcript.ended() {
        Some(reason) => println!("{who} the call ended ({reason})"),
        None => {
            transcript.call.end("completed");
            println!("{who} ended: completed");
        }
    }
}

/// A call and a cursor on what its agent sent.
struct Transcript {
    sim: Sim,
    call: Call,
    next: usize,
}

impl Transcript {
    /// Starts a text call on `conn`.
    fn start(sim: Sim, conn: &ConnHandle) -> Transcript {
        let next = sim.recorder().len();
        let call = conn.start_text();
        Transcript { sim, call, next }
    }

    /// The next frame the agent sent for the call and Sent accepted, if one comes within `within`.
    async fn next(&mut self, within: Duration) -> Option<Arc<Record>> {
        let id = self.call.id.clone();
        let mine = move |r: &Record| {
            r.dir == Dir::FromAgent
                && r.session.as_deref() == Some(id.as_str())
                && matches!(r.what, What::Frame { .. })
                && r.frame_type() != Some("session.resume")
        };
        let record = self
            .sim
            .recorder()
            .wait_for(self.next, within, "the agent's answer", |_| false, mine)
            .await
            .ok()?;
        self.next = record.seq + 1;
        Some(record)
    }

    /// Prints the agent's frames: the first within `first`, the next ones until a pause of [`QUIET`] (or
    /// [`ANSWER_WITHIN`] after an `agent.say` that says more is coming). Returns how many.
    async fn print_answer(&mut self, who: &str, first: Duration) -> usize {
        let mut printed = 0;
        let mut within = first;
        while let Some(record) = self.next(within).await {
            println!("{who} {}", describe(&record));
            printed += 1;
            let more_coming = record
                .json()
                .is_some_and(|j| j["type"] == "agent.say" && j["last"] == false);
            within = if more_coming { ANSWER_WITHIN } else { QUIET };
        }
        printed
    }

    /// Why the call ended, if it has (the agent hung up or transferred it, or it was lost).
    fn ended(&self) -> Option<String> {
        let state = self.call.state()?;
        state
            .ended
            .or_else(|| state.lost.then(|| "lost with its connection".into()))
    }
}

/// One transcript line for a frame the agent sent: what it said or did, never a token.
pub fn describe(record: &Record) -> String {
    let Some(json) = record.json() else {
        return "agent: (not a frame)".into();
    };
    match json["type"].as_str().unwrap_or_default() {
        "agent.say" => {
            let text = json["text"].as_str().unwrap_or_default();
            let more = if json["last"] == false { " …" } else { "" };
            format!("agent: {text}{more}")
        }
        "agent.clear" => "agent: (clears what it was saying)".into(),
        "tool.call" => {
            let name = json["name"].as_str().unwrap_or_default();
            match json.get("arguments").filter(|a| !a.is_null()) {
                Some(arguments) => format!("agent: tool {name} {arguments}"),
                None => format!("agent: tool {name}"),
            }
        }
        other => format!("agent: {other} frame"),
    }
}

/// Prints each handshake the simulator refuses, as it happens: a wrong key or agent id shows at once.
pub async fn report_refusals(sim: Sim) {
    let mut from = 0;
    loop {
        let refused = sim
            .recorder()
            .wait_for(
                from,
                Duration::from_secs(3600),
                "a refused handshake",
                |_| false,
                |r| matches!(r.what, What::Refused { .. }),
            )
            .await;
        let Ok(record) = refused else {
            continue;
        };
        from = record.seq + 1;
        let What::Refused { status } = record.what else {
            continue;
        };
        let why = match status {
            401 => "the API key is not one given with --account",
            403 => "the API key does not own that agent id (another --account does)",
            404 => "no --account names that agent id",
            400 => "agent_id or the subprotocol sent.voice.v1 is missing",
            _ => "refused",
        };
        eprintln!(
            "sentsim: refused a connection with {status}: {why} (voicehost does not retry this; fix the \
             config, then activate the agent again or restart voicehost)"
        );
    }
}

/// The one line about violations, if the agents committed any.
pub fn violations_line(sim: &Sim) -> Option<String> {
    let count = sim.violations_since(0).len();
    (count > 0).then(|| {
        format!(
            "sentsim: the simulator recorded {count} protocol violation(s) by the agents (logged above as \
             \"protocol violation by the agent\")"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimConfig;
    use serde_json::{json, Value};

    #[test]
    fn accounts_parse_and_errors_never_repeat_the_key() {
        let account = parse_account("sk_secret=agent_a, agent_b").unwrap();
        assert_eq!(account.api_key, "sk_secret");
        assert_eq!(account.agents, ["agent_a", "agent_b"]);
        for bad in ["sk_secret", "sk_secret=", "=agent_a", "sk_secret=,"] {
            let error = parse_account(bad).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
        }
        let both = [
            parse_account("k1=a,b").unwrap(),
            parse_account("k2=b,c").unwrap(),
        ];
        assert_eq!(agents_of(&both), ["a", "b", "c"]);
    }

    #[test]
    fn transcript_lines_say_what_the_agent_did() {
        let line = |json: Value| {
            describe(&Record {
                seq: 0,
                at: std::time::Instant::now(),
                conn: 1,
                dir: Dir::FromAgent,
                session: Some("vs_1".into()),
                what: What::Frame {
                    frame_type: json["type"].as_str().unwrap().into(),
                    json,
                    counted: true,
                },
            })
        };
        assert_eq!(
            line(json!({"type": "agent.say", "session_id": "vs_1", "text": "hi"})),
            "agent: hi"
        );
        assert_eq!(
            line(json!({"type": "agent.say", "session_id": "vs_1", "text": "one", "last": false})),
            "agent: one …"
        );
        assert_eq!(
            line(
                json!({"type": "tool.call", "session_id": "vs_1", "call_ref": "c1",
                "name": "send_dtmf", "arguments": {"digits": "12"}})
            ),
            r#"agent: tool send_dtmf {"digits":"12"}"#
        );
        assert_eq!(
            line(
                json!({"type": "tool.call", "session_id": "vs_1", "call_ref": "c2", "name": "hangup"})
            ),
            "agent: tool hangup"
        );
    }

    #[tokio::test]
    async fn an_agent_that_never_connects_is_named_in_the_error() {
        let sim = Sim::start_local(SimConfig {
            accounts: vec![parse_account("sk_secret=agent_x").unwrap()],
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let plan = Plan {
            calls: Some(1),
            every: Duration::from_millis(10),
            says: vec!["hello".into()],
            hold: Duration::ZERO,
            connect_within: Duration::from_millis(100),
        };
        let error = format!(
            "{:#}",
            serve_agent(sim.clone(), "agent_x".into(), plan)
                .await
                .unwrap_err()
        );
        sim.shutdown();
        assert!(error.contains("agent_x never connected"), "{error}");
        assert!(!error.contains("secret"), "{error}");
    }

    /// A tiny agent: answers pings, breaks the protocol once at each session's start (an empty say), then
    /// greets, and echoes what the caller says.
    async fn sloppy_agent(url: String) {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        let mut request = format!("{url}?agent_id=agent_x")
            .into_client_request()
            .unwrap();
        let headers = request.headers_mut();
        headers.insert("Authorization", "Bearer sk_secret".parse().unwrap());
        headers.insert("Sec-WebSocket-Protocol", "sent.voice.v1".parse().unwrap());
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        while let Some(Ok(Message::Text(text))) = socket.next().await {
            let frame: Value = serde_json::from_str(&text).unwrap();
            let id = &frame["session_id"];
            let answers = match frame["type"].as_str().unwrap_or_default() {
                "ping" => vec![json!({"type": "pong", "ts": frame["ts"]})],
                "session.start" => vec![
                    json!({"type": "agent.say", "session_id": id, "text": ""}),
                    json!({"type": "agent.say", "session_id": id, "text": "hi"}),
                ],
                "user.said" => {
                    vec![json!({"type": "agent.say", "session_id": id, "text": frame["text"]})]
                }
                _ => vec![],
            };
            for answer in answers {
                let _ = socket.send(Message::Text(answer.to_string().into())).await;
            }
        }
    }

    #[tokio::test]
    async fn calls_reach_an_agent_end_completed_and_its_violations_are_counted() {
        let sim = Sim::start_local(SimConfig {
            heartbeat_interval_ms: 1000,
            accounts: vec![parse_account("sk_secret=agent_x").unwrap()],
            ..SimConfig::default()
        })
        .await
        .unwrap();
        tokio::spawn(sloppy_agent(sim.url()));
        let plan = Plan {
            calls: Some(2),
            every: Duration::from_millis(10),
            says: vec!["echo me".into()],
            hold: Duration::from_millis(10),
            connect_within: Duration::from_secs(10),
        };
        serve_agent(sim.clone(), "agent_x".into(), plan)
            .await
            .unwrap();
        for id in ["vs_sim-1", "vs_sim-2"] {
            let state = sim.call(id).state().unwrap();
            assert_eq!(state.ended.as_deref(), Some("completed"), "{id}");
        }
        let line = violations_line(&sim).unwrap();
        sim.shutdown();
        assert!(line.contains("2 protocol violation"), "{line}");
    }
}
