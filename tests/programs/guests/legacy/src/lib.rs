//! A test guest built against `voicehost:agent@0.1.0` (`host/wit-0.1/`), the world before 0.2.0: what a
//! component uploaded to an older host is. It greets a text call, echoes `echo <text>`, asks for `hold`
//! and says a failed tool result, panics on `panic`, and after a restart says the reason it was given.

wit_bindgen::generate!({
    world: "agent",
    path: "../../../../host/wit-0.1",
});

use exports::voicehost::agent::handler::Guest;
use voicehost::agent::types::{Media, SessionEnd, ToolResult, UnknownFrame, UserSaid};
use voicehost::agent::{log, session};

struct Legacy;

fn say(text: &str) {
    let _ = session::say(text, None, None);
}

impl Guest for Legacy {
    fn on_session_start() -> Result<(), String> {
        if matches!(session::info().media, Media::Text) {
            say("Hello from a 0.1.0 agent.");
        }
        Ok(())
    }

    fn on_user_said(said: UserSaid) -> Result<(), String> {
        let (command, rest) = said.text.split_once(' ').unwrap_or((&said.text, ""));
        match command {
            "echo" => say(rest),
            "hold" => {
                session::tool("hold", Some(r#"{"held":true}"#)).map_err(|r| format!("{r:?}"))?;
            }
            "panic" => panic!("asked to panic"),
            _ => {}
        }
        Ok(())
    }

    fn on_audio(samples: Vec<i16>) -> Result<(), String> {
        session::send_audio(&samples);
        Ok(())
    }

    fn on_tool_result(answer: ToolResult) -> Result<(), String> {
        if !answer.ok {
            if let Some(error) = answer.error {
                say(&format!("Tool failed: {}", error.code));
            }
        }
        Ok(())
    }

    fn on_frame(_frame: UnknownFrame) -> Result<(), String> {
        Ok(())
    }

    fn on_session_end(_end: SessionEnd) -> Result<(), String> {
        Ok(())
    }

    fn on_session_lost() -> Result<(), String> {
        Ok(())
    }

    fn on_restart(reason: String) -> Result<(), String> {
        log::log(log::Level::Info, &format!("restarted after {reason}"));
        say(&format!("restarted after {reason}"));
        Ok(())
    }
}

export!(Legacy);
