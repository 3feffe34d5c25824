//! # voicehost-agent: write a Sent voice agent for voicehost in Rust
//!
//! voicehost runs one instance of an agent's WebAssembly component per phone call. It owns the connection
//! to Sent (heartbeats, reconnects, resumes, replays, tool-call bookkeeping); the agent only sees its own
//! call. This crate is the Rust side of that contract (the world `agent` of the WIT package
//! `voicehost:agent@0.3.0`):
//!
//! * implement the [`Agent`] trait (every method has a default that does nothing), named after the
//!   official Sent SDK's `Handler`;
//! * act on the call through the [`Session`] handed to every method: [`Session::say`],
//!   [`Session::clear`], [`Session::send_audio`], [`Session::tool`] and its wrappers
//!   ([`Session::transfer`], [`Session::transfer_number`], [`Session::hangup`], [`Session::send_dtmf`],
//!   [`Session::hold`]), and per-call state that survives a restart ([`Session::save`],
//!   [`Session::load`]);
//! * log into the host's log with the [`log`] module;
//! * export the agent with [`export_agent!`].
//!
//! ## A complete agent
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "my-agent"
//! version = "0.1.0"
//! edition = "2021"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! voicehost-agent = { path = "../guest-sdk" }
//!
//! [profile.release]
//! opt-level = "s"
//! lto = true
//! strip = true
//! codegen-units = 1
//! ```
//!
//! `src/lib.rs`:
//!
//! ```no_run
//! use std::cell::Cell;
//!
//! use voicehost_agent::{
//!     export_agent, log, Agent, Error, Media, RestartReason, Session, ToolResult, UserSaid,
//! };
//!
//! /// One value per call: the host creates it when the call's instance starts.
//! #[derive(Default)]
//! struct Receptionist {
//!     /// Per-call state lives in fields, behind interior mutability (an instance is single-threaded).
//!     turns: Cell<u32>,
//! }
//!
//! impl Agent for Receptionist {
//!     fn on_session_start(&self, session: &Session) -> Result<(), Error> {
//!         if session.info().media == Media::Text {
//!             session.say("Hello, how can I help?")?;
//!         }
//!         Ok(())
//!     }
//!
//!     fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
//!         self.turns.set(self.turns.get() + 1);
//!         log::info!("turn {}: {:?}", self.turns.get(), said.text);
//!         if said.text.contains("human") {
//!             session.say("Putting you through.")?;
//!             // Waits for Sent's answer; a successful transfer ends the call.
//!             let result = session.transfer_number("+14155550100")?;
//!             if result.outcome.is_err() {
//!                 session.say("Sorry, nobody is available.")?;
//!             }
//!         } else if said.text.contains("bye") {
//!             session.say("Goodbye!")?;
//!             session.hangup()?;
//!         } else {
//!             // Stream a reply in two pieces: `last: false` says more follows.
//!             session.say_with("You said:", Some(false), None)?;
//!             session.say(&said.text)?;
//!         }
//!         Ok(())
//!     }
//!
//!     fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), Error> {
//!         // Audio calls: play the caller's audio back (never fails).
//!         session.send_audio(&samples);
//!         Ok(())
//!     }
//!
//!     fn on_tool_result(&self, _session: &Session, result: ToolResult) -> Result<(), Error> {
//!         log::debug(&format!("tool {}: {:?}", result.call_ref, result.outcome));
//!         Ok(())
//!     }
//!
//!     fn on_restart(&self, session: &Session, reason: RestartReason) -> Result<(), Error> {
//!         // A fresh instance took over after a trap: fields start anew, saved state is still there.
//!         log::warn!("restarted after: {reason:?}");
//!         if let Some(turns) = session.load("turns") {
//!             log::info!("had {} bytes of saved state", turns.len());
//!         }
//!         Ok(())
//!     }
//! }
//!
//! export_agent!(Receptionist);
//! ```
//!
//! Build it as a component with `cargo build --target wasm32-wasip2 --release` (after
//! `rustup target add wasm32-wasip2`); the agent is `target/wasm32-wasip2/release/my_agent.wasm`.
//!
//! ## Errors and traps
//!
//! Handlers return [`Error`]: an `Err` is logged and counted by the host, and the call goes on. A
//! [`Refused`] converts into it, and so do a `String`, a `&str` and a `serde_json::Error`, so `?` works on
//! session calls and the agent's own failures alike. When a session call is refused with
//! [`Refused::Ended`] ([`Error::is_ended`]), nothing more can be done on the call: stop.
//!
//! A panic (or running past the host's CPU deadline, memory cap or stack) traps the instance: the host
//! replaces it with a fresh one, which gets [`Agent::on_restart`] before the next event. Fields of the
//! agent value start anew; what was kept with [`Session::save`] is still there.
//!
//! ## Unit tests without Wasm
//!
//! With the feature `testing` (`[dev-dependencies] voicehost-agent = { …, features = ["testing"] }`),
//! [`testing::TestCall`] plays the host natively: `cargo test` calls the agent's methods, and the test
//! looks at what it said, sent, called and saved. `voicehost test` then runs the component itself on the
//! real host.

#![warn(missing_docs)]

// Lets the generated bindings (and `export_agent!`) name this crate by the same path from inside it and
// from the agent's crate.
extern crate self as voicehost_agent;

/// The raw bindings generated by `wit-bindgen` from `wit/agent.wit`. Use the re-exports at the crate root
/// instead.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "agent",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_agent_bindings",
        default_bindings_module: "::voicehost_agent::bindings",
        runtime_path: "::voicehost_agent::__private::wit_bindgen::rt",
        additional_derives: [PartialEq, Eq],
        // The world includes WASI and `wasi:http`: their bindings are the `wasip2` crate's (re-exported
        // as `voicehost_agent::wasip2`), so an agent's own WASI calls and the SDK share types.
        with: {
            "wasi:cli/environment@0.2.12": ::voicehost_agent::wasip2::cli::environment,
            "wasi:cli/exit@0.2.12": ::voicehost_agent::wasip2::cli::exit,
            "wasi:cli/stdin@0.2.12": ::voicehost_agent::wasip2::cli::stdin,
            "wasi:cli/stdout@0.2.12": ::voicehost_agent::wasip2::cli::stdout,
            "wasi:cli/stderr@0.2.12": ::voicehost_agent::wasip2::cli::stderr,
            "wasi:cli/terminal-input@0.2.12": ::voicehost_agent::wasip2::cli::terminal_input,
            "wasi:cli/terminal-output@0.2.12": ::voicehost_agent::wasip2::cli::terminal_output,
            "wasi:cli/terminal-stdin@0.2.12": ::voicehost_agent::wasip2::cli::terminal_stdin,
            "wasi:cli/terminal-stdout@0.2.12": ::voicehost_agent::wasip2::cli::terminal_stdout,
            "wasi:cli/terminal-stderr@0.2.12": ::voicehost_agent::wasip2::cli::terminal_stderr,
            "wasi:clocks/monotonic-clock@0.2.12": ::voicehost_agent::wasip2::clocks::monotonic_clock,
            "wasi:clocks/wall-clock@0.2.12": ::voicehost_agent::wasip2::clocks::wall_clock,
            "wasi:filesystem/types@0.2.12": ::voicehost_agent::wasip2::filesystem::types,
            "wasi:filesystem/preopens@0.2.12": ::voicehost_agent::wasip2::filesystem::preopens,
            "wasi:io/error@0.2.12": ::voicehost_agent::wasip2::io::error,
            "wasi:io/poll@0.2.12": ::voicehost_agent::wasip2::io::poll,
            "wasi:io/streams@0.2.12": ::voicehost_agent::wasip2::io::streams,
            "wasi:random/random@0.2.12": ::voicehost_agent::wasip2::random::random,
            "wasi:random/insecure@0.2.12": ::voicehost_agent::wasip2::random::insecure,
            "wasi:random/insecure-seed@0.2.12": ::voicehost_agent::wasip2::random::insecure_seed,
            "wasi:sockets/network@0.2.12": ::voicehost_agent::wasip2::sockets::network,
            "wasi:sockets/instance-network@0.2.12": ::voicehost_agent::wasip2::sockets::instance_network,
            "wasi:sockets/udp@0.2.12": ::voicehost_agent::wasip2::sockets::udp,
            "wasi:sockets/udp-create-socket@0.2.12": ::voicehost_agent::wasip2::sockets::udp_create_socket,
            "wasi:sockets/tcp@0.2.12": ::voicehost_agent::wasip2::sockets::tcp,
            "wasi:sockets/tcp-create-socket@0.2.12": ::voicehost_agent::wasip2::sockets::tcp_create_socket,
            "wasi:sockets/ip-name-lookup@0.2.12": ::voicehost_agent::wasip2::sockets::ip_name_lookup,
            "wasi:http/types@0.2.12": ::voicehost_agent::wasip2::http::types,
            "wasi:http/outgoing-handler@0.2.12": ::voicehost_agent::wasip2::http::outgoing_handler,
            "wasi:logging/logging@0.1.0-draft": generate,
        },
    });
}

mod error;
pub mod log;
mod session;
#[cfg(feature = "testing")]
pub mod testing;

pub use bindings::voicehost::agent::types::{
    CallInfo, Direction, Media, Party, Refused, RestartReason, SessionEnd, ToolError, ToolResult,
    UnknownFrame, UserSaid,
};
pub use error::Error;
pub use session::Session;

/// `serde_json`, re-exported for building [`Session::tool`] arguments (`serde_json::json!`).
pub use serde_json;

/// The `wasip2` crate: bindings of WASI 0.2 and `wasi:http` (`wasip2::http::outgoing_handler`), which the
/// world includes; its version is the world's WASI (0.2.12).
pub use wasip2;

/// What an agent does on its call. voicehost calls these one at a time, in the order Sent's frames
/// arrived, each with the [`Session`] of the instance's call.
///
/// Every method defaults to doing nothing and returning `Ok(())`. An `Err` is logged and counted by the
/// host and the call goes on; a panic traps the instance, which the host replaces with a fresh one (see
/// [`Agent::on_restart`]).
///
/// The value is created once per instance (one call, or what is left of it after a restart) by
/// [`export_agent!`]. Keep per-call state in its fields with interior mutability (`Cell`, `RefCell`): an
/// instance is single-threaded and its methods take `&self`.
pub trait Agent: 'static {
    /// The call reached the agent. A text agent usually greets here ([`Session::say`]).
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        let _ = session;
        Ok(())
    }

    /// Text calls: the caller said something. With `said.correction` true it replaces the previous
    /// utterance, and what the agent did about that one may be moot ([`Session::clear`]).
    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        let _ = (session, said);
        Ok(())
    }

    /// Audio calls: the caller's audio, 16-bit mono PCM at the call's sample rate ([`CallInfo::media`]),
    /// usually 20 ms.
    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), Error> {
        let _ = (session, samples);
        Ok(())
    }

    /// Sent answered a tool call. The [`Session::tool`] call waiting for it got the same answer.
    fn on_tool_result(&self, session: &Session, result: ToolResult) -> Result<(), Error> {
        let _ = (session, result);
        Ok(())
    }

    /// A session frame of a type the host does not know, as JSON.
    fn on_frame(&self, session: &Session, frame: UnknownFrame) -> Result<(), Error> {
        let _ = (session, frame);
        Ok(())
    }

    /// The call left the agent (`end.reason` says why). Nothing can be done on it any more; this is the
    /// last call.
    fn on_session_end(&self, session: &Session, end: SessionEnd) -> Result<(), Error> {
        let _ = (session, end);
        Ok(())
    }

    /// The connection to Sent was lost and the call could not be moved: Sent ends it. This is the last
    /// call; no [`Agent::on_session_end`] follows.
    fn on_session_lost(&self, session: &Session) -> Result<(), Error> {
        let _ = session;
        Ok(())
    }

    /// The instance before this one is gone (`reason` says why: it trapped, was replaced, or the call moved
    /// from another host) and this fresh one takes over the call. This value's fields start anew; state
    /// kept with [`Session::save`] is still there.
    fn on_restart(&self, session: &Session, reason: RestartReason) -> Result<(), Error> {
        let _ = (session, reason);
        Ok(())
    }
}

impl RestartReason {
    /// The reason as the WIT names it: `panic`, `cpu-deadline`, `forced`, ….
    pub fn name(self) -> &'static str {
        match self {
            RestartReason::Panic => "panic",
            RestartReason::CpuDeadline => "cpu-deadline",
            RestartReason::WallDeadline => "wall-deadline",
            RestartReason::Memory => "memory",
            RestartReason::HostMemory => "host-memory",
            RestartReason::StackOverflow => "stack-overflow",
            RestartReason::HostResources => "host-resources",
            RestartReason::Other => "other",
            RestartReason::Forced => "forced",
            RestartReason::Moved => "moved",
        }
    }
}

impl Party {
    /// A Sent user, by identity (`{"kind":"user","value":…}`).
    pub fn user(identity: impl Into<String>) -> Party {
        Party {
            kind: "user".into(),
            value: Some(identity.into()),
        }
    }

    /// A phone number in E.164 form, e.g. `+14155550100` (`{"kind":"number","value":…}`).
    pub fn number(e164: impl Into<String>) -> Party {
        Party {
            kind: "number".into(),
            value: Some(e164.into()),
        }
    }

    /// Another Sent agent, by id `agent_…` (`{"kind":"agent","value":…}`).
    pub fn agent(agent_id: impl Into<String>) -> Party {
        Party {
            kind: "agent".into(),
            value: Some(agent_id.into()),
        }
    }
}

impl Media {
    /// The audio sample rate in Hz for an audio call, `None` for a text call.
    pub fn sample_rate(&self) -> Option<u32> {
        match self {
            Media::Text => None,
            Media::Audio(rate) => Some(*rate),
        }
    }
}

/// Exports an [`Agent`] as the component's `voicehost:agent/handler` interface. Use it once, in the
/// agent's `cdylib` crate.
///
/// * `export_agent!(MyAgent);` creates the agent with `MyAgent::default()`;
/// * `export_agent!(MyAgent, MyAgent::new(42));` creates it with the given expression.
///
/// The value is created lazily, on the instance's first event, and lives as long as the instance.
///
/// ```no_run
/// #[derive(Default)]
/// struct Quiet;
/// impl voicehost_agent::Agent for Quiet {}
/// voicehost_agent::export_agent!(Quiet);
/// ```
///
/// With a constructor:
///
/// ```no_run
/// use std::cell::Cell;
///
/// struct Countdown {
///     left: Cell<u32>,
/// }
///
/// impl Countdown {
///     fn new(from: u32) -> Countdown {
///         Countdown { left: Cell::new(from) }
///     }
/// }
///
/// impl voicehost_agent::Agent for Countdown {
///     fn on_user_said(
///         &self,
///         session: &voicehost_agent::Session,
///         _said: voicehost_agent::UserSaid,
///     ) -> Result<(), voicehost_agent::Error> {
///         self.left.set(self.left.get().saturating_sub(1));
///         if self.left.get() == 0 {
///             session.hangup()?;
///         }
///         Ok(())
///     }
/// }
///
/// voicehost_agent::export_agent!(Countdown, Countdown::new(3));
/// ```
#[macro_export]
macro_rules! export_agent {
    ($agent:ty) => {
        $crate::export_agent!($agent, <$agent as ::core::default::Default>::default());
    };
    ($agent:ty, $new:expr) => {
        const _: () = {
            ::std::thread_local! {
                static __VOICEHOST_AGENT: $agent = $new;
            }

            fn __with_agent<R>(f: impl ::core::ops::FnOnce(&$agent, &$crate::Session) -> R) -> R {
                __VOICEHOST_AGENT.with(|agent| f(agent, &$crate::__private::SESSION))
            }

            struct __VoicehostAgentExport;

            impl $crate::__private::Guest for __VoicehostAgentExport {
                fn on_session_start() -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_session_start(a, s))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_user_said(
                    said: $crate::UserSaid,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_user_said(a, s, said))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_audio(
                    samples: ::std::vec::Vec<i16>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_audio(a, s, samples))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_tool_result(
                    result: $crate::ToolResult,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_tool_result(a, s, result))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_frame(
                    frame: $crate::UnknownFrame,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_frame(a, s, frame))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_session_end(
                    end: $crate::SessionEnd,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_session_end(a, s, end))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_session_lost() -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_session_lost(a, s))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
                fn on_restart(
                    reason: $crate::RestartReason,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __with_agent(|a, s| $crate::Agent::on_restart(a, s, reason))
                        .map_err(|e| ::std::string::ToString::to_string(&e))
                }
            }

            $crate::bindings::__export_agent_bindings!(__VoicehostAgentExport with_types_in $crate::bindings);
        };
    };
}

/// Implementation details used by [`export_agent!`] and the generated bindings; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::exports::voicehost::agent::handler::Guest;
    pub use wit_bindgen;

    /// The session handle every handler gets.
    pub static SESSION: crate::Session = crate::Session::new();
}
