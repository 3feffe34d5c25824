//! `voicehost:agent@0.2.0`, the world before 0.3.0: components built against it are served through the
//! same host code, by this adapter. 0.2.0 is 0.3.0 without the restart reason `moved`, so its imports are
//! 0.3.0's with the same shapes (converted one to one), and a call moved here reaches its handler as
//! `forced`, the reason 0.2.0 has for a restart that was not the agent's doing. Its WIT is kept in
//! `host/wit-0.2/`, unchanged.

use super::imports::HostState;
use super::instance::Event;
use super::wit;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::Store;

// Generated from host/wit-0.2/agent.wit: only `voicehost:agent`'s own interfaces; WASI and `wasi:logging`
// are the ones the host links for 0.3.0.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "agent",
        path: "wit-0.2",
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
            "wasi:logging": crate::sandbox::bindings::wasi::logging,
        },
    });
}

use bindings::voicehost::agent::{session, types};

/// The world's name, as the API's views, the log and the metrics give it.
pub const WORLD: &str = "voicehost:agent@0.2.0";

pub(super) type Agent = bindings::Agent;
pub(super) type AgentPre = bindings::AgentPre<HostState>;

/// Defines the 0.2.0 imports (`types`, `session`) in `linker`, beside the 0.3.0 ones: a component of either
/// version links against the same linker.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    session::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// Calls the 0.2.0 handler for `event`.
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
        Event::Restart(reason) => {
            handler
                .call_on_restart(store, restart_reason(*reason))
                .await
        }
    }
}

/// The reason as 0.2.0 has it: `moved` is `forced` there.
fn restart_reason(reason: wit::RestartReason) -> types::RestartReason {
    use types::RestartReason as Old;
    use wit::RestartReason as R;
    match reason {
        R::Panic => Old::Panic,
        R::CpuDeadline => Old::CpuDeadline,
        R::WallDeadline => Old::WallDeadline,
        R::Memory => Old::Memory,
        R::HostMemory => Old::HostMemory,
        R::StackOverflow => Old::StackOverflow,
        R::HostResources => Old::HostResources,
        R::Other => Old::Other,
        R::Forced | R::Moved => Old::Forced,
    }
}

fn tool_result(result: wit::ToolResult) -> types::ToolResult {
    types::ToolResult {
        call_ref: result.call_ref,
        outcome: result.outcome.map_err(|error| types::ToolError {
            code: error.code,
            message: error.message,
        }),
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

fn call_info(info: wit::CallInfo) -> types::CallInfo {
    types::CallInfo {
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
    async fn info(&mut self) -> wasmtime::Result<types::CallInfo> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_call_reaches_a_0_2_handler_as_forced_and_every_other_reason_as_itself() {
        use super::super::TrapKind;
        assert_eq!(
            restart_reason(wit::RestartReason::Moved),
            types::RestartReason::Forced
        );
        for kind in TrapKind::ALL {
            let reason = wit::RestartReason::from(kind);
            assert_eq!(
                format!("{:?}", restart_reason(reason)),
                format!("{reason:?}")
            );
        }
    }
}
