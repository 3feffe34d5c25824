//! A test guest built against `voicehost:agent@0.2.0` (`host/wit-0.2/`), the world before 0.3.0: what a
//! component uploaded before `moved` was a restart reason is. It greets a text call, echoes `echo <text>`,
//! panics on `panic`, and after a restart says the reason it was given.

wit_bindgen::generate!({
    world: "agent-without-http",
    path: "../../../../host/wit-0.2",
    generate_all,
});

use exports::voicehost::agent::handler::Guest;
use voicehost::agent::session;
use voicehost::agent::types::{
    Media, RestartReason, SessionEnd, ToolResult, UnknownFrame, UserSaid,
};

struct Previous;

fn say(text: &str) {
    let _ = session::say(text, None, None);
}

impl Guest for Previous {
    fn on_session_start() -> Result<(), String> {
        if matches!(session::info().media, Media::Text) {
            say("Hello from a 0.2.0 agent.");
        }
        Ok(())
    }

    fn on_user_said(said: UserSaid) -> Result<(), String> {
        let (command, rest) = said.text.split_once(' ').unwrap_or((&said.text, ""));
        match command {
            "echo" => say(rest),
            "panic" => panic!("asked to panic"),
            _ => {}
        }
        Ok(())
    }

    fn on_audio(samples: Vec<i16>) -> Result<(), String> {
        session::send_audio(&samples);
        Ok(())
    }

    fn on_tool_result(_answer: ToolResult) -> Result<(), String> {
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

    fn on_restart(reason: RestartReason) -> Result<(), String> {
        let name = match reason {
            RestartReason::Panic => "panic",
            RestartReason::CpuDeadline => "cpu-deadline",
            RestartReason::WallDeadline => "wall-deadline",
            RestartReason::Memory => "memory",
            RestartReason::HostMemory => "host-memory",
            RestartReason::StackOverflow => "stack-overflow",
            RestartReason::HostResources => "host-resources",
            RestartReason::Other => "other",
            RestartReason::Forced => "forced",
        };
        say(&format!("restarted after {name}"));
        Ok(())
    }
}

export!(Previous);
