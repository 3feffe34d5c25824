//! A call's host side that does nothing, for driving an [`voicehost::sandbox::Instance`] directly (the
//! benches' per-event cost, a trap's report): every import the guest calls returns at once.

use sentsim::sim::CONFORMANCE_AGENT;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use voicehost::sandbox::wit::{CallInfo, Direction, Level, Media, Party, Refused, ToolResult};
use voicehost::sandbox::GuestImports;

/// The host side of an audio call at 16 kHz that records nothing: `say`, `save` and the rest succeed and
/// are forgotten, `tool` is refused as ended, `load` finds nothing.
pub struct Quiet {
    info: CallInfo,
}

impl Quiet {
    /// A quiet call, as the guest's imports take it.
    pub fn imports() -> Arc<dyn GuestImports> {
        let party = |kind: &str, value: &str| Party {
            kind: kind.into(),
            value: Some(value.into()),
        };
        Arc::new(Quiet {
            info: CallInfo {
                session_id: "vs_quiet".into(),
                call_id: "call_quiet".into(),
                agent_id: CONFORMANCE_AGENT.into(),
                direction: Direction::Inbound,
                from: party("number", "+14155550100"),
                to: party("agent", CONFORMANCE_AGENT),
                media: Media::Audio(16_000),
                language: None,
                context: None,
                started_at: "2025-01-01T00:00:00Z".into(),
                max_duration_ms: None,
            },
        })
    }
}

impl GuestImports for Quiet {
    fn info(&self) -> CallInfo {
        self.info.clone()
    }

    fn say(
        &self,
        _: String,
        _: Option<bool>,
        _: Option<bool>,
    ) -> Pin<Box<dyn Future<Output = Result<(), Refused>> + Send>> {
        Box::pin(async { Ok(()) })
    }

    fn clear(&self) -> Pin<Box<dyn Future<Output = Result<(), Refused>> + Send>> {
        Box::pin(async { Ok(()) })
    }

    fn send_audio(&self, _: Vec<i16>) {}

    fn tool(
        &self,
        _: String,
        _: Option<String>,
    ) -> Pin<Box<dyn Future<Output = Result<ToolResult, Refused>> + Send>> {
        Box::pin(async { Err(Refused::Ended) })
    }

    fn save(&self, _: String, _: Vec<u8>) -> Result<(), Refused> {
        Ok(())
    }

    fn load(&self, _: &str) -> Option<Vec<u8>> {
        None
    }

    fn log(&self, _: Level, _: &str) {}

    fn log_dropped(&self) {}
}
