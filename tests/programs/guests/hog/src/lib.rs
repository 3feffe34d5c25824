//! A text agent that allocates memory without bound on request, so tests can watch the host's memory cap
//! trap it.
//!
//! * session start: says "Hello from the hog." (text calls);
//! * "grow": keeps 1 MiB chunks, each filled with data, until the allocator fails (a trap);
//! * "take <n>": keeps n more 1 MiB chunks, then says "took <n>";
//! * "echo <text>": says `<text>`;
//! * anything else: nothing.

use core::hint::black_box;
use std::cell::RefCell;

use voicehost_agent::{export_agent, Agent, Error, Media, Session, UserSaid};

/// The size of one chunk.
const CHUNK: usize = 1 << 20;

/// The hog agent: what it grabbed stays in its field for the life of the instance.
#[derive(Default)]
pub struct Hog {
    chunks: RefCell<Vec<Vec<u8>>>,
}

impl Hog {
    /// Never returns: grabs and touches 1 MiB after 1 MiB.
    fn grow(&self) -> ! {
        let mut fill: u8 = 1;
        loop {
            let chunk = vec![fill; CHUNK];
            self.chunks.borrow_mut().push(black_box(chunk));
            fill = fill.wrapping_add(1).max(1);
        }
    }
}

impl Agent for Hog {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say("Hello from the hog.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        if said.text == "grow" {
            self.grow();
        }
        if let Some(n) = said.text.strip_prefix("take ") {
            let n: usize = n.parse().map_err(|_| format!("take {n}: not a number"))?;
            for _ in 0..n {
                self.chunks.borrow_mut().push(black_box(vec![1; CHUNK]));
            }
            session.say(&format!("took {n}"))?;
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }
}

export_agent!(Hog);
