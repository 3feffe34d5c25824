//! An agent compiled into the host instead of loaded as a component: it gets the same events and reaches
//! its call through the same [`GuestImports`] as a guest, with no Wasm between. It exists to measure what
//! the sandbox costs (the load bench runs the same agent both ways, side by side); tenants' agents are
//! always components. It runs under the wall-clock bound of every handler call, but nothing else of the
//! sandbox contains it.

use super::{Event, GuestImports, Outcome};
use std::future::Future;
use std::pin::Pin;

/// An agent's handlers as host code: one call of [`NativeAgent::call`] per event, as a guest's handler.
pub trait NativeAgent: Send + Sync + 'static {
    /// Handles `event` of the call `imports` serves.
    fn call<'a>(
        &'a self,
        imports: &'a dyn GuestImports,
        event: &'a Event,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;
}
