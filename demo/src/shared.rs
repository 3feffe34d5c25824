//! What both parts of the demo use ([`crate::calls`] and [`crate::tenants`]): the example agents'
//! components and a call's transcript. A leaf, so that the two parts do not import each other for it.

use anyhow::{Context as _, Result};
use sentsim::{Call, Dir, Sim, What};

/// The example agent `name`'s component, as `voicehost-test-programs` built it.
pub fn component(name: &str) -> Result<Vec<u8>> {
    let path = voicehost_test_programs::path(name);
    std::fs::read(path).with_context(|| format!("cannot read the example agent {path}"))
}

/// Prints a call as the two sides saw it, from the simulator's recorder.
pub fn transcript(sim: &Sim, call: &Call) {
    let recorder = sim.recorder();
    let records = recorder.since(0, |r| r.session.as_deref() == Some(call.id.as_str()));
    let (mut audio_in, mut audio_out) = (0, 0);
    for record in &records {
        let Some(json) = record.json() else {
            match (&record.what, record.dir) {
                (What::Audio { .. }, Dir::ToAgent) => audio_in += 1,
                (What::Audio { .. }, Dir::FromAgent) => audio_out += 1,
                _ => {}
            }
            continue;
        };
        let at = recorder.elapsed_ms(record);
        let text = |key: &str| json[key].as_str().unwrap_or_default().to_string();
        let line = match record.frame_type().unwrap_or_default() {
            "session.start" => format!("sent   call starts ({} session)", text("session_type")),
            "user.said" => format!("caller {:?}", text("text")),
            "agent.say" => {
                let more = if json["last"] == false { " …" } else { "" };
                format!("agent  {:?}{more}", text("text"))
            }
            "agent.clear" => "agent  (clears its speech)".into(),
            "tool.call" => format!(
                "agent  uses {} {}",
                text("name"),
                json.get("arguments")
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            ),
            "tool.result" => format!(
                "sent   {} {}",
                text("call_ref"),
                if json["ok"] == true { "ok" } else { "failed" }
            ),
            "session.end" => format!("sent   call ends: {}", text("reason")),
            "session.resume" => format!("agent  resumes the call on connection {}", record.conn),
            "session.resumed" => {
                "sent   call resumed (replaying what the agent missed)".to_string()
            }
            other => other.to_string(),
        };
        println!("  {at:>6} ms  {line}");
    }
    if audio_in + audio_out > 0 {
        println!(
            "            audio: {audio_in} frames from the caller, {audio_out} echoed by the agent"
        );
    }
}
