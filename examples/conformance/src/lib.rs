//! The conformance agent of the Sent Voice Agents protocol (protocol.md §9.2), on voicehost's guest SDK,
//! plus three commands voicehost's own tests use: `count`, `panic` and the saved utterance counter.
//!
//! | trigger | action |
//! |---|---|
//! | session start of a text call | say "Hello from the conformance agent." |
//! | user.said with `correction` | `clear()` first (stop if the call has ended), then the command below |
//! | "echo <text>" | say `<text>` |
//! | "stream <word> <rest>" | say `<word>` with `last: false`, then say `<rest>` |
//! | "transfer" | tool `transfer` `{"to":{"kind":"user","value":"conformance-desk"}}`, and wait |
//! | "hangup" | tool `hangup`, no arguments |
//! | "dtmf <digits>" | tool `send_dtmf` `{"digits":"<digits>"}` |
//! | "hold" | tool `hold` `{"held":true}` |
//! | "count" | say "utterances: N" (the saved counter, see below) |
//! | "panic" | `panic!("asked to panic")`: the instance traps |
//! | any other text | nothing |
//! | tool result with `ok: false` and an `error` | say "Tool failed: <error.code>" |
//! | audio | send the same samples back (echo) |
//!
//! The command is the text up to the first space. If an action is refused with `Ended`, the agent stops
//! processing the utterance; other refusals are logged and the next action goes on.
//!
//! Every user.said first adds one to a counter saved with `save("utterances", …)` as decimal ASCII (before
//! its command runs, so "panic" and "count" count too); "count" reads it back with `load`. Saved state
//! survives a restart, so "echo a", "panic", "count" says "utterances: 3" from the fresh instance.

use voicehost_agent::{
    export_agent, log, Agent, Media, Party, Refused, Session, ToolResult, UserSaid,
};

/// What the conformance agent says first in a text call.
pub const GREETING: &str = "Hello from the conformance agent.";

/// The key of the saved utterance counter.
pub const COUNTER_KEY: &str = "utterances";

/// The conformance agent; it keeps no state in memory, only the saved counter.
#[derive(Default)]
pub struct Conformance;

/// Adds one to the saved utterance counter and returns the new value.
fn count_utterance(session: &Session) -> Result<u64, Refused> {
    let count = saved_count(session) + 1;
    session.save(COUNTER_KEY, count.to_string().as_bytes())?;
    Ok(count)
}

/// The saved utterance counter, 0 when nothing (or something unreadable) is saved.
fn saved_count(session: &Session) -> u64 {
    session
        .load(COUNTER_KEY)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// Runs the command in `text`; an `Err` stops the utterance (the call has ended).
fn run_command(session: &Session, text: &str) -> Result<(), Refused> {
    let (command, rest) = text.split_once(' ').unwrap_or((text, ""));
    match command {
        "echo" => step(session.say(rest)),
        "stream" => {
            let (word, remainder) = rest.split_once(' ').unwrap_or((rest, ""));
            step(session.say_with(word, Some(false), None))?;
            step(session.say(remainder))
        }
        "transfer" => step(session.transfer(&Party::user("conformance-desk"))),
        "hangup" => step(session.hangup()),
        "dtmf" => step(session.send_dtmf(rest)),
        "hold" => step(session.hold(true)),
        "count" => step(session.say(&format!("utterances: {}", saved_count(session)))),
        "panic" => panic!("asked to panic"),
        _ => Ok(()),
    }
}

/// One action's outcome: `Ended` stops the utterance, other refusals are logged and ignored.
fn step<T>(result: Result<T, Refused>) -> Result<(), Refused> {
    match result {
        Ok(_) => Ok(()),
        Err(Refused::Ended) => Err(Refused::Ended),
        Err(refused) => {
            log::warn!("refused: {refused}");
            Ok(())
        }
    }
}

impl Agent for Conformance {
    fn on_session_start(&self, session: &Session) -> Result<(), String> {
        if session.info().media == Media::Text {
            let _ = step(session.say(GREETING));
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), String> {
        if step(count_utterance(session)).is_err() {
            return Ok(());
        }
        if said.correction && step(session.clear()).is_err() {
            return Ok(());
        }
        // Refused::Ended stops the utterance; there is nothing to report.
        let _ = run_command(session, &said.text);
        Ok(())
    }

    fn on_tool_result(&self, session: &Session, result: ToolResult) -> Result<(), String> {
        if !result.ok {
            if let Some(error) = result.error {
                let _ = step(session.say(&format!("Tool failed: {}", error.code)));
            }
        }
        Ok(())
    }

    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), String> {
        session.send_audio(&samples);
        Ok(())
    }
}

export_agent!(Conformance);
