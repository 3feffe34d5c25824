//! wasmtime: one engine with the pooling allocator and an epoch ticker, one `InstancePre` per agent
//! component, one Store per call. A call's handlers run under a CPU deadline (the time its polls take,
//! checked at every epoch tick: not the time it waits in `tool`), a wall-clock bound, and a linear-memory
//! cap; the calls' tasks run on a runtime of their own, beside the host's I/O (`cpu.rs`). A
//! trap poisons the whole Store, so [`Instance`] drops it and builds a fresh one from the same
//! `InstancePre`; the call's task then calls `on-restart`. Guests may make HTTP requests through
//! `wasi:http`, only to the origins of [`Limits::http`] (see [`crate::sandbox::outbound`]); by default
//! none, and then `wasi:http` is not linked at all: its imports trap. What an instance may hold on the
//! host's side beside its memory (handles, header fields, body chunks, random bytes) is capped in
//! [`limits`].
//!
//! By concern: `engine.rs` (the engine, compiling and the compiled cache), `compiler.rs` (compiling an
//! upload in a child process under bounds), `compile_input.rs` (what both take: the engine's settings, a
//! component's bytes), `imports.rs` (the host's side of
//! the guest's imports, and the meters behind the limits), `instance.rs` (one call's instance and its
//! handler calls), `native.rs` (an agent as host code, to measure the sandbox against), `trap.rs` (what
//! kind of trap ended a handler), `guest_log.rs` (the guest's log, rate
//! limited), `limits.rs` (the limits' defaults), `budget.rs` (the pool's slots and the guests' memory,
//! shared by the tenants with parts reserved), `cpu.rs` (the guests' CPU: the calls' runtime, what a guest used), `egress.rs`
//! (where a request may connect), `outbound.rs` (its HTTP requests) and `world.rs` (what the `agent`
//! world does not give a component, in words).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use limits::ResolvedLimits;

pub mod budget;
mod compile_input;
pub mod compiler;
mod cpu;
pub mod egress;
mod engine;
mod guest_log;
mod imports;
mod instance;
mod legacy;
pub mod limits;
mod native;
pub mod outbound;
mod trap;
mod v0_2;
mod world;

pub use compile_input::Wasm;
pub use compiler::{ChildCompiler, CompileBounds};
pub use cpu::spawn_call;
pub use engine::{blocking, AgentCode, LoadError, Sandbox};
pub use instance::{Event, Instance, Outcome, Unmade, HANDLERS};
pub use native::NativeAgent;
pub use outbound::{HttpPolicy, Origin};
pub use trap::{TrapKind, TrapReport};
pub use world::World;

// Generated from wit/agent.wit (voicehost:agent@0.3.0), whose doc comments become the docs; the WIT leaves
// a few items bare, and the generated helpers (`Refused::name`, `Refused::message`) can have none. WASI and
// `wasi:http` are wasmtime's own bindings: the world includes them, the host links them from there.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "agent",
        path: "../wit",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "wasi:cli": wasmtime_wasi::p2::bindings::cli,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "wasi:filesystem": wasmtime_wasi::p2::bindings::filesystem,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:random": wasmtime_wasi::p2::bindings::random,
            "wasi:sockets": wasmtime_wasi::p2::bindings::sockets,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        },
    });
}

/// The WIT types, as the rest of the host uses them.
///
/// The core's types for the same ideas (`voicehost_proto::call`'s `Media`, `Refused`, `ToolAnswer`,
/// `GuestEvent`) cannot be these: the core names no wasmtime, and bindgen makes these from the WIT. So each
/// idea has the core's type and the WIT's, and they are converted here and nowhere else.
pub mod wit {
    pub use super::bindings::voicehost::agent::types::{
        CallInfo, Direction, Media, Party, Refused, RestartReason, SessionEnd, ToolError,
        ToolResult, UnknownFrame, UserSaid,
    };
    pub use super::bindings::wasi::logging::logging::Level;

    use super::Event;
    use voicehost_proto::call::{self, GuestEvent, ToolAnswer};

    impl From<call::Media> for Media {
        fn from(media: call::Media) -> Media {
            match media {
                call::Media::Text => Media::Text,
                call::Media::Audio { sample_rate } => Media::Audio(sample_rate),
            }
        }
    }

    impl From<Media> for call::Media {
        fn from(media: Media) -> call::Media {
            match media {
                Media::Text => call::Media::Text,
                Media::Audio(sample_rate) => call::Media::Audio { sample_rate },
            }
        }
    }

    impl From<call::Refused> for Refused {
        fn from(refused: call::Refused) -> Refused {
            match refused {
                call::Refused::Ended => Refused::Ended,
                call::Refused::Invalid => Refused::Invalid,
                call::Refused::WrongMedia => Refused::WrongMedia,
                call::Refused::OverLimit => Refused::OverLimit,
                call::Refused::TimedOut => Refused::TimedOut,
            }
        }
    }

    impl From<ToolAnswer> for ToolResult {
        fn from(answer: ToolAnswer) -> ToolResult {
            let outcome = match (answer.ok, answer.error) {
                (true, _) => Ok(()),
                (false, Some((code, message))) => Err(ToolError { code, message }),
                // Sent's `ok: false` always carries an error; the core keeps it so.
                (false, None) => Err(ToolError {
                    code: "failed".into(),
                    message: String::new(),
                }),
            };
            ToolResult {
                call_ref: answer.call_ref,
                outcome,
            }
        }
    }

    impl From<super::TrapKind> for RestartReason {
        fn from(kind: super::TrapKind) -> RestartReason {
            use super::TrapKind;
            match kind {
                TrapKind::Panic => RestartReason::Panic,
                TrapKind::CpuDeadline => RestartReason::CpuDeadline,
                TrapKind::WallDeadline => RestartReason::WallDeadline,
                TrapKind::Memory => RestartReason::Memory,
                TrapKind::HostMemory => RestartReason::HostMemory,
                TrapKind::StackOverflow => RestartReason::StackOverflow,
                TrapKind::HostResources => RestartReason::HostResources,
                TrapKind::Other => RestartReason::Other,
                TrapKind::Forced => RestartReason::Forced,
            }
        }
    }

    // `Event` is the handler call's shape rather than the protocol's: it has `Restart`, which only the
    // sandbox makes, and audio as the WIT's samples rather than the wire's bytes.
    impl From<GuestEvent> for Event {
        fn from(event: GuestEvent) -> Event {
            match event {
                GuestEvent::Start => Event::SessionStart,
                // The call moved here from another host: this instance takes over from that host's.
                GuestEvent::Moved => Event::Restart(RestartReason::Moved),
                GuestEvent::UserSaid { text, correction } => {
                    Event::UserSaid(UserSaid { text, correction })
                }
                GuestEvent::Audio(samples) => Event::Audio(
                    samples
                        .chunks_exact(2)
                        .map(|b| i16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ),
                GuestEvent::ToolResult(answer) => Event::ToolResult(answer.into()),
                GuestEvent::Unknown { frame_type, json } => {
                    Event::Frame(UnknownFrame { frame_type, json })
                }
                GuestEvent::End {
                    reason,
                    duration_ms,
                } => Event::SessionEnd(SessionEnd {
                    reason,
                    duration_ms,
                }),
                GuestEvent::Lost => Event::SessionLost,
            }
        }
    }
}

use wit::*;

/// How often the engine's epoch advances while every worker of the calls' runtime is in a guest: a running
/// guest yields its worker at every tick (see `cpu.rs`), and its CPU deadline is checked.
pub const TICK: Duration = Duration::from_millis(1);

/// How often it advances otherwise (a worker is free for a call that becomes runnable): the CPU
/// deadlines' grain then.
pub const IDLE_TICK: Duration = Duration::from_millis(10);

/// The limits one call's instance runs under.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Guest running time allowed for one handler call.
    pub cpu_per_call: Duration,
    /// Wall-clock time one handler call may take, waits in `tool` included.
    pub wall_per_call: Duration,
    /// Linear memory per instance, in bytes.
    pub memory_bytes: usize,
    /// Guest log lines (stdout, stderr, the `log` import) per second; more are dropped and counted.
    pub log_lines_per_second: u32,
    /// Where the guest may send HTTP requests (`wasi:http`), how long and how large they may be.
    pub http: Arc<HttpPolicy>,
    /// The tenant's share of the host's guest memory (`guest_memory_mib`), which every byte of linear
    /// memory the instance gets is taken from; `None`: only `memory_bytes` bounds it.
    pub host_memory: Option<budget::Part>,
}

impl Limits {
    /// The sandbox's side of `limits`, with an HTTP policy.
    pub fn of(limits: &ResolvedLimits, http: Arc<HttpPolicy>) -> Limits {
        Limits {
            cpu_per_call: Duration::from_millis(limits.cpu_ms),
            wall_per_call: Duration::from_millis(limits.wall_ms),
            memory_bytes: (limits.memory_mib as usize) << 20,
            log_lines_per_second: limits.log_lines_per_second,
            http,
            host_memory: None,
        }
    }
}

/// [`limits::DEFAULTS`], with no HTTP allowed.
impl Default for Limits {
    fn default() -> Self {
        Limits::of(&limits::DEFAULTS, Arc::new(HttpPolicy::default()))
    }
}

/// What a guest's imports reach: its call, on the host's side. The call's task implements it
/// (`agent/call_task.rs`).
pub trait GuestImports: Send + Sync + 'static {
    /// The call the instance serves, as it started (the `info` import).
    fn info(&self) -> CallInfo;
    /// Speaks `text` on a text call (the `say` import): an `agent.say` frame. Resolves once it is queued
    /// for Sent (it may wait while Sent reads the call's backlog).
    fn say(
        &self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Pin<Box<dyn Future<Output = Result<(), Refused>> + Send>>;
    /// Drops what Sent has not played yet (the `clear` import): an `agent.clear` frame, queued as `say`'s.
    fn clear(&self) -> Pin<Box<dyn Future<Output = Result<(), Refused>> + Send>>;
    /// Plays these samples on an audio call (the `send-audio` import); dropped when they cannot go.
    fn send_audio(&self, samples: Vec<i16>);
    /// Uses one of Sent's tools with `arguments` as a JSON object (the `tool` import); resolves with Sent's
    /// answer.
    fn tool(
        &self,
        name: String,
        arguments: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<ToolResult, Refused>> + Send>>;
    /// Keeps `value` under `key` for the call (the `save` import); refused past the call's state bound.
    fn save(&self, key: String, value: Vec<u8>) -> Result<(), Refused>;
    /// The value saved under `key` for the call, if any (the `load` import).
    fn load(&self, key: &str) -> Option<Vec<u8>>;
    /// A line the guest logged (with `log`, or on stdout or stderr), after rate limiting.
    fn log(&self, level: Level, message: &str);
    /// A line the guest logged over its rate limit, dropped.
    fn log_dropped(&self);
}
