//! A text agent that spins forever on request, so tests can watch the host's CPU deadline trap it.
//!
//! * session start: says "Hello from the looper." (text calls);
//! * "loop": an infinite loop that the optimiser cannot remove;
//! * "echo <text>": says `<text>`;
//! * anything else: nothing.

use core::hint::black_box;

use voicehost_agent::{export_agent, Agent, Media, Session, UserSaid};

/// The looper agent.
#[derive(Default)]
pub struct Looper;

/// Never returns: counts forever through `black_box`, so the loop is neither removed nor folded.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

impl Agent for Looper {
    fn on_session_start(&self, session: &Session) -> Result<(), String> {
        if session.info().media == Media::Text {
            session.say("Hello from the looper.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), String> {
        if said.text == "loop" {
            spin();
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }
}

export_agent!(Looper);
