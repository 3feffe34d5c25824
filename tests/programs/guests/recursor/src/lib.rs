//! A text agent that recurses without bound on request, so tests can watch the host trap a stack
//! overflow.
//!
//! * session start: says "Hello from the recursor." (text calls);
//! * "recurse": unbounded, non-tail recursion (`black_box` keeps it from becoming a loop);
//! * "echo <text>": says `<text>`;
//! * anything else: nothing.

use core::hint::black_box;

use voicehost_agent::{export_agent, Agent, Error, Media, Session, UserSaid};

/// The recursor agent.
#[derive(Default)]
pub struct Recursor;

/// Never returns in practice: the stop condition is opaque to the optimiser and never true, and the
/// call is not in tail position, so every level takes a frame on the wasm call stack until the host's
/// stack limit traps ("call stack exhausted"). The frames keep little in linear memory (Rust's shadow
/// stack, 1 MiB), so the wasm stack runs out first.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == black_box(u64::MAX) {
        return depth;
    }
    let below = recurse(depth + 1);
    black_box(below.wrapping_mul(3).wrapping_sub(depth))
}

impl Agent for Recursor {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say("Hello from the recursor.")?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        if said.text == "recurse" {
            let depth = recurse(black_box(0));
            return Err(format!("recursion returned at depth {depth}").into());
        }
        if let Some(text) = said.text.strip_prefix("echo ") {
            session.say(text)?;
        }
        Ok(())
    }
}

export_agent!(Recursor);
