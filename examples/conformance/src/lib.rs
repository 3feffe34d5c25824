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
    export_agent, log, Agent, Error, Media, Party, Refused, RestartReason, Session, ToolResult,
    UserSaid,
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
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            let _ = step(session.say(GREETING));
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
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

    fn on_tool_result(&self, session: &Session, result: ToolResult) -> Result<(), Error> {
        if let Err(error) = result.outcome {
            let _ = step(session.say(&format!("Tool failed: {}", error.code)));
        }
        Ok(())
    }

    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), Error> {
        session.send_audio(&samples);
        Ok(())
    }

    fn on_restart(&self, _session: &Session, reason: RestartReason) -> Result<(), Error> {
        log::info!("restarted after: {}", reason.name());
        Ok(())
    }
}

export_agent!(Conformance);

/// The agent's logic, natively: the SDK's `testing::TestCall` plays the host (`cargo test`).
#[cfg(test)]
mod tests {
    use super::*;
    use voicehost_agent::serde_json::json;
    use voicehost_agent::testing::{TestCall, ToolAnswer};

    #[test]
    fn a_text_call_is_greeted_and_echo_says_the_rest() {
        let call = TestCall::text();
        Conformance.on_session_start(&call.session()).unwrap();
        call.user_said(&Conformance, "echo hello there").unwrap();
        assert_eq!(call.said(), [GREETING, "hello there"]);
    }

    #[test]
    fn stream_says_its_first_word_with_more_to_come() {
        let call = TestCall::text();
        call.user_said(&Conformance, "stream Let me think").unwrap();
        let speech = call.speech();
        assert_eq!((speech[0].text.as_str(), speech[0].last), ("Let", false));
        assert_eq!(
            (speech[1].text.as_str(), speech[1].last),
            ("me think", true)
        );
    }

    #[test]
    fn dtmf_and_transfer_call_their_tools() {
        let call = TestCall::text();
        call.user_said(&Conformance, "dtmf 42#").unwrap();
        call.user_said(&Conformance, "transfer").unwrap();
        let tools = call.tool_calls();
        assert_eq!(tools[0].name, "send_dtmf");
        assert_eq!(tools[0].arguments, Some(json!({"digits": "42#"})));
        assert_eq!(
            tools[1].arguments,
            Some(json!({"to": {"kind": "user", "value": "conformance-desk"}}))
        );
        // A transfer Sent accepts ends the call, as it would on the host.
        assert!(call.ended());
    }

    #[test]
    fn a_failed_tool_result_is_said() {
        let call = TestCall::text();
        call.answer_tool(
            "hold",
            ToolAnswer::Failed("hold_unsupported".into(), "no hold here".into()),
        );
        call.user_said(&Conformance, "hold").unwrap();
        // The host hands the same answer to on_tool_result; here the test does.
        let result = call.tool_results().remove(0);
        Conformance.on_tool_result(&call.session(), result).unwrap();
        assert_eq!(call.said(), ["Tool failed: hold_unsupported"]);
    }

    #[test]
    fn the_count_is_saved_so_a_fresh_instance_reads_it() {
        let call = TestCall::text();
        call.user_said(&Conformance, "echo a").unwrap();
        // A fresh instance (a new agent value) finds what the one before saved.
        call.user_said(&Conformance, "count").unwrap();
        assert_eq!(call.said(), ["a", "utterances: 2"]);
        assert_eq!(call.saved(COUNTER_KEY).as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn audio_is_echoed_and_an_audio_call_gets_no_greeting() {
        let call = TestCall::audio(16000);
        Conformance.on_session_start(&call.session()).unwrap();
        Conformance
            .on_audio(&call.session(), vec![1, -2, 3])
            .unwrap();
        assert_eq!(call.audio_sent(), [1, -2, 3]);
        assert!(call.said().is_empty());
    }

    #[test]
    fn after_the_end_the_agent_says_nothing_more() {
        let call = TestCall::text();
        call.end(&Conformance, "caller_hung_up").unwrap();
        call.user_said(&Conformance, "echo too late").unwrap();
        assert!(call.said().is_empty());
    }
}
