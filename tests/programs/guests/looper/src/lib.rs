//! A text agent that spins forever on request, so tests can watch the host's CPU deadline trap it.
//!
//! * session start: says "Hello from the looper." (text calls);
//! * "loop": an infinite loop that the optimiser cannot remove;
//! * "loop-through <import>": an infinite loop that calls one import each time round: `info`, `load`,
//!   `save`, `log`, `say`, `send-audio` (1 MiB of samples), `clock` (WASI's monotonic clock) or `random`
//!   (WASI's `get-random-u64`), whatever they answer;
//! * "echo <text>": says `<text>`;
//! * anything else: nothing.

use core::hint::black_box;

use voicehost_agent::{export_agent, log, Agent, Error, Media, Session, UserSaid};

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

/// Never returns: calls `import` forever, ignoring what it answers.
fn spin_through(session: &Session, import: &str) -> ! {
    let samples = vec![7i16; 512 << 10];
    loop {
        match import {
            "info" => drop(black_box(session.info())),
            "load" => drop(black_box(session.load("key"))),
            "save" => drop(black_box(session.save("key", b"value"))),
            "log" => log::info!("looping"),
            "say" => drop(black_box(session.say("looping"))),
            "send-audio" => session.send_audio(&samples),
            "clock" => drop(black_box(std::time::Instant::now())),
            "random" => drop(black_box(wasip2::random::random::get_random_u64())),
            _ => {}
        }
    }
}

impl Agent for Looper {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say("Hello from the looper.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        if said.text == "loop" {
            spin();
        }
        if let Some(import) = said.text.strip_prefix("loop-through ") {
            spin_through(session, import);
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }
}

export_agent!(Looper);
