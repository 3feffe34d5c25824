//! A minimal text agent that panics on request, so tests can watch the host replace a trapped instance.
//!
//! * session start: says "Hello from the panicker." (text calls);
//! * "panic": `panic!` (the instance traps);
//! * "echo <text>": says `<text>`;
//! * anything else: nothing;
//! * audio: echoed back.

use voicehost_agent::{export_agent, Agent, Media, Session, UserSaid};

/// The panicker agent.
#[derive(Default)]
pub struct Panicker;

impl Agent for Panicker {
    fn on_session_start(&self, session: &Session) -> Result<(), String> {
        if session.info().media == Media::Text {
            session.say("Hello from the panicker.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), String> {
        if said.text == "panic" {
            panic!("the panicker was asked to panic");
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }

    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), String> {
        session.send_audio(&samples);
        Ok(())
    }
}

export_agent!(Panicker);
