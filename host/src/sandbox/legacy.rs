//! `voicehost:agent@0.1.0`, the world before 0.2.0 (deprecated): components built against it are served
//! through the same host code, by this adapter. Its imports are the 0.3.0 ones with the old shapes (the
//! `call` record, a tool result with an `ok` flag, the `log` interface), and its handlers are called with
//! the 0.3.0 events converted back. Its WIT is kept in `host/wit-0.1/`, unchanged.

use super::imports::HostState;
use super::instance::Event;
use super::wit;
use super::TrapKind;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::Store;

// Generated from host/wit-0.1/agent.wit.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "agent",
        path: "wit-0.1",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

use bindings::voicehost::agent::{log, session, types};

/// The world's name, as the API's views, the log and the metrics give it.
pub const WORLD: &str = "voicehost:agent@0.1.0";

pub(super) type Agent = bindings::Agent;
pub(super) type AgentPre = bindings::AgentPre<HostState>;

/// Defines the 0.1.0 imports (`types`, `session`, `log`) in `linker`, beside the 0.3.0 ones: a component of
/// either version links against the same linker.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    session::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    log::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// Calls the 0.1.0 handler for `event`.
pub(super) async fn call(
    agent: &Agent,
    store: &mut Store<HostState>,
    event: &Event,
) -> wasmtime::Result<Result<(), String>> {
    let handler = agent.voicehost_agent_handler();
    match event {
        Event::SessionStart => handler.call_on_session_start(store).await,
        Event::UserSaid(said) => {
            let said = types::UserSaid {
                text: said.text.clone(),
                correction: said.correction,
            };
            handler.call_on_user_said(store, &said).await
        }
        Event::Audio(samples) => handler.call_on_audio(store, samples).await,
        Event::ToolResult(result) => {
            handler
                .call_on_tool_result(store, &tool_result(result.clone()))
                .await
        }
        Event::Frame(frame) => {
            let frame = types::UnknownFrame {
                frame_type: frame.frame_type.clone(),
                json: frame.json.clone(),
            };
            handler.call_on_frame(store, &frame).await
        }
        Event::SessionEnd(end) => {
            let end = types::SessionEnd {
                reason: end.reason.clone(),
                duration_ms: end.duration_ms,
            };
            handler.call_on_session_end(store, &end).await
        }
        Event::SessionLost => handler.call_on_session_lost(store).await,
        // 0.1.0 took the reason as the trap kind's name.
        Event::Restart(reason) => {
            handler
                .call_on_restart(store, restart_reason(*reason))
                .await
        }
    }
}

/// The reason as 0.1.0 gave it: the trap kind's name (`TrapKind::as_str`), or `moved` (0.1.0's reason is
/// a string, so a new one breaks nothing).
fn restart_reason(reason: wit::RestartReason) -> &'static str {
    use wit::RestartReason as R;
    let kind = match reason {
        R::Panic => TrapKind::Panic,
        R::CpuDeadline => TrapKind::CpuDeadline,
        R::WallDeadline => TrapKind::WallDeadline,
        R::Memory => TrapKind::Memory,
        R::HostMemory => TrapKind::HostMemory,
        R::StackOverflow => TrapKind::StackOverflow,
        R::HostResources => TrapKind::HostResources,
        R::Other => TrapKind::Other,
        R::Forced => TrapKind::Forced,
        R::Moved => return "moved",
    };
    kind.as_str()
}

fn tool_result(result: wit::ToolResult) -> types::ToolResult {
    let (ok, error) = match result.outcome {
        Ok(()) => (true, None),
        Err(error) => (
            false,
            Some(types::ToolError {
                code: error.code,
                message: error.message,
            }),
        ),
    };
    types::ToolResult {
        call_ref: result.call_ref,
        ok,
        error,
    }
}

fn refused(refused: wit::Refused) -> types::Refused {
    match refused {
        wit::Refused::Ended => types::Refused::Ended,
        wit::Refused::Invalid => types::Refused::Invalid,
        wit::Refused::WrongMedia => types::Refused::WrongMedia,
        wit::Refused::OverLimit => types::Refused::OverLimit,
        wit::Refused::TimedOut => types::Refused::TimedOut,
    }
}

fn party(party: wit::Party) -> types::Party {
    types::Party {
        kind: party.kind,
        value: party.value,
    }
}

fn call_info(info: wit::CallInfo) -> types::Call {
    types::Call {
        session_id: info.session_id,
        call_id: info.call_id,
        agent_id: info.agent_id,
        direction: match info.direction {
            wit::Direction::Inbound => types::Direction::Inbound,
            wit::Direction::Outbound => types::Direction::Outbound,
        },
        from: party(info.from),
        to: party(info.to),
        media: match info.media {
            wit::Media::Text => types::Media::Text,
            wit::Media::Audio(rate) => types::Media::Audio(rate),
        },
        language: info.language,
        context: info.context,
        started_at: info.started_at,
        max_duration_ms: info.max_duration_ms,
    }
}

impl types::Host for HostState {}

impl session::Host for HostState {
    async fn info(&mut self) -> wasmtime::Result<types::Call> {
        Ok(call_info(self.imports.info()))
    }

    async fn say(
        &mut self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> wasmtime::Result<Result<(), types::Refused>> {
        let said = self.imports.say(text, last, interruptible).await;
        Ok(said.map_err(refused))
    }

    async fn clear(&mut self) -> wasmtime::Result<Result<(), types::Refused>> {
        Ok(self.imports.clear().await.map_err(refused))
    }

    async fn send_audio(&mut self, samples: Vec<i16>) -> wasmtime::Result<()> {
        self.imports.send_audio(samples);
        Ok(())
    }

    async fn tool(
        &mut self,
        name: String,
        arguments: Option<String>,
    ) -> wasmtime::Result<Result<types::ToolResult, types::Refused>> {
        let answer = self.imports.tool(name, arguments).await;
        Ok(answer.map(tool_result).map_err(refused))
    }

    async fn save(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), types::Refused>> {
        Ok(self.imports.save(key, value).map_err(refused))
    }

    async fn load(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.imports.load(&key))
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            log::Level::Trace => wit::Level::Trace,
            log::Level::Debug => wit::Level::Debug,
            log::Level::Info => wit::Level::Info,
            log::Level::Warn => wit::Level::Warn,
            log::Level::Error => wit::Level::Error,
        };
        self.output.log(level, &message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_reason_has_the_name_0_1_gave_its_trap_kind() {
        for kind in TrapKind::ALL {
            assert_eq!(restart_reason(kind.into()), kind.as_str());
        }
    }
}
