//! A minimal text agent that panics on request, so tests can watch the host replace a trapped instance.
//!
//! * session start: says "Hello from the panicker." (text calls);
//! * "panic": `panic!` (the instance traps);
//! * "echo <text>": says `<text>`;
//! * "shout <n>": logs `n` lines with `log` and `n` on stdout (so tests can watch the log rate limit), then
//!   says "shouted";
//! * anything else: nothing;
//! * audio: echoed back.

use voicehost_agent::{export_agent, log, Agent, Error, Media, Session, UserSaid};

/// The panicker agent.
#[derive(Default)]
pub struct Panicker;

impl Agent for Panicker {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say("Hello from the panicker.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        if said.text == "panic" {
            panic!("the panicker was asked to panic");
        }
        if let Some(n) = said.text.strip_prefix("shout ") {
            for line in 0..n.parse::<u32>().map_err(|e| e.to_string())? {
                log::info!("shout {line} through the log import");
                println!("shout {line} on stdout");
            }
            session.say("shouted")?;
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }

    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), Error> {
        session.send_audio(&samples);
        Ok(())
    }
}

export_agent!(Panicker);
