//! The Sent Voice Agents protocol core of voicehost, sans-IO: every rule of the protocol (0.2.0,
//! `sent.voice.v1`) that the host keeps, and nothing that touches a socket, a clock, a task or a lock.
//!
//! - [`wire`]: the official codec (`sentdm_voice_agents::frames`), the binary audio header, the size
//!   limits of what Sent may send, and the intake that turns a message into a frame the core acts on;
//! - [`call`]: one call's machine: counting, retention and replay, the resume hold, the stream number,
//!   tool calls, the end and the loss, the resume window, the failure policy, its bounds;
//! - [`router`]: one agent's connections and calls: dialling with [`backoff`], routing by session and
//!   stream, draining, `connection_full`, carrying calls between connections, retiring connections;
//! - [`Stats`]: what they count, as plain numbers.
//!
//! Inputs carry the time (`now`) they happen at; outputs are polled ([`Router::poll_output`],
//! [`Router::deadline`]). The host (`voicehost::agent`) moves inputs in and carries outputs out.

pub mod backoff;
pub mod call;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod router;
mod stats;
pub mod wire;

pub use router::Router;
pub use stats::Stats;
