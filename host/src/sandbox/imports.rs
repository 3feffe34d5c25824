//! The host's side of the guest's imports: the state of one Store, whose WASI, `wasi:http` and `voicehost`
//! imports reach the call through [`GuestImports`], and the meters behind the limits.

use super::budget::Part;
use super::cpu::Share;
use super::guest_log::GuestOutput;
use super::limits::{MAX_FIELDS_BYTES, MAX_HANDLES, MAX_RANDOM_BYTES, MAX_TABLE_ELEMENTS};
use super::outbound::PolicyHooks;
use super::wit::{CallInfo, Level, Refused, ToolResult};
use super::{bindings, GuestImports, Limits, TrapKind};
use bindings::voicehost::agent::{session, types};
use bindings::wasi::logging::logging;
use std::sync::Arc;
use wasmtime::component::ResourceTable;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::ResourceLimiter;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// The state of one Store: WASI (`wasi:http` with the call's policy), the call's side, and the meters
/// behind the limits.
pub(crate) struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    http_hooks: PolicyHooks,
    table: ResourceTable,
    pub(super) imports: Arc<dyn GuestImports>,
    /// The call's log, rate-limited: `wasi:logging` (or 0.1's `log`) and stdout/stderr share it.
    pub(super) output: GuestOutput,
    memory: MemoryMeter,
    /// Why the instance was refused memory, if it was: over its own cap ([`TrapKind::Memory`]), or
    /// its tenant's share of the host's guest memory spent ([`TrapKind::HostMemory`]).
    pub(super) memory_hit: Option<TrapKind>,
    /// The guest time a handler call may take, in nanoseconds.
    pub(super) cpu_budget: u64,
    /// What the running handler call has used of the guest CPU.
    pub(super) cpu: Share,
}

impl HostState {
    /// The state of a fresh Store for the call behind `imports`: stdout and stderr go to `output`.
    pub(super) fn new(
        imports: Arc<dyn GuestImports>,
        limits: &Limits,
        output: GuestOutput,
        cpu: Share,
    ) -> HostState {
        let wasi = WasiCtx::builder()
            .stdout(output.clone())
            .stderr(output.clone())
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(MAX_FIELDS_BYTES);
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_HANDLES);
        HostState {
            wasi,
            http,
            http_hooks: PolicyHooks::new(limits.http.clone(), imports.info().session_id)
                .charged_to(cpu.clone()),
            table,
            imports,
            output,
            memory: MemoryMeter::new(limits.memory_bytes, limits.host_memory.clone()),
            memory_hit: None,
            cpu_budget: u64::try_from(limits.cpu_per_call.as_nanos()).unwrap_or(u64::MAX),
            cpu,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        match self.memory.grow(current, desired) {
            Ok(()) => Ok(true),
            Err(TrapKind::HostMemory) => {
                self.memory_hit = Some(TrapKind::HostMemory);
                wasmtime::bail!(
                    "the host's guest memory (guest_memory_mib) has no room for the tenant: \
                     its reserved part is in use and the rest is taken"
                )
            }
            Err(kind) => {
                self.memory_hit = Some(kind);
                wasmtime::bail!(
                    "the memory limit of {} bytes (all the instance's memories together) was reached",
                    self.memory.cap
                )
            }
        }
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory.grow_failed();
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The linear memory of all an instance's memories together, against its cap (`memory_mib` bounds the
/// instance, however many memories its component declares) and taken from its tenant's share of the
/// host's guest memory, given back when the Store is dropped.
#[derive(Debug)]
struct MemoryMeter {
    cap: usize,
    used: usize,
    /// What the last growth allowed added, taken back if the growth then fails.
    last: usize,
    host: Option<Part>,
}

impl MemoryMeter {
    fn new(cap: usize, host: Option<Part>) -> MemoryMeter {
        MemoryMeter {
            cap,
            used: 0,
            last: 0,
            host,
        }
    }

    /// Whether one memory may grow from `current` to `desired` bytes (counted if so), or which bound
    /// refuses it.
    fn grow(&mut self, current: usize, desired: usize) -> Result<(), TrapKind> {
        let more = desired.saturating_sub(current);
        if self.used.saturating_add(more) > self.cap {
            return Err(TrapKind::Memory);
        }
        if let Some(host) = &self.host {
            if !host.take(more as u64) {
                return Err(TrapKind::HostMemory);
            }
        }
        self.used += more;
        self.last = more;
        Ok(())
    }

    fn grow_failed(&mut self) {
        let last = std::mem::take(&mut self.last);
        self.used -= last;
        if let Some(host) = &self.host {
            host.give(last as u64);
        }
    }
}

impl Drop for MemoryMeter {
    fn drop(&mut self) {
        if let Some(host) = &self.host {
            host.give(self.used as u64);
        }
    }
}

impl types::Host for HostState {}

impl session::Host for HostState {
    async fn info(&mut self) -> wasmtime::Result<CallInfo> {
        Ok(self.imports.info())
    }

    async fn say(
        &mut self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> wasmtime::Result<Result<(), Refused>> {
        // May wait while Sent reads the call's backlog (the wall-clock bound of the call covers it).
        Ok(self.imports.say(text, last, interruptible).await)
    }

    async fn clear(&mut self) -> wasmtime::Result<Result<(), Refused>> {
        Ok(self.imports.clear().await)
    }

    async fn send_audio(&mut self, samples: Vec<i16>) -> wasmtime::Result<()> {
        self.imports.send_audio(samples);
        Ok(())
    }

    async fn tool(
        &mut self,
        name: String,
        arguments: Option<String>,
    ) -> wasmtime::Result<Result<ToolResult, Refused>> {
        // The guest is suspended while Sent answers: the epoch callback does not run, so the wait costs it
        // at most one tick of its CPU budget. The wall-clock bound of the whole call covers the wait.
        Ok(self.imports.tool(name, arguments).await)
    }

    async fn save(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), Refused>> {
        Ok(self.imports.save(key, value))
    }

    async fn load(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.imports.load(&key))
    }
}

impl logging::Host for HostState {
    async fn log(
        &mut self,
        level: Level,
        context: String,
        message: String,
    ) -> wasmtime::Result<()> {
        // The host's log has no level above error: `critical` says so in the line. A context is cut to
        // its first 64 bytes, so that the message (cut at a log line's length) survives a long one.
        let critical = if level == Level::Critical {
            "critical: "
        } else {
            ""
        };
        let context = super::guest_log::clip_to(&context, MAX_CONTEXT_BYTES);
        if context.is_empty() {
            self.output.log(level, &format!("{critical}{message}"));
        } else {
            self.output
                .log(level, &format!("{critical}{context}: {message}"));
        }
        Ok(())
    }
}

/// The most of a `wasi:logging` context a log line keeps, in bytes.
const MAX_CONTEXT_BYTES: usize = 64;

/// Defines the `voicehost:agent@0.3.0` imports (`types`, `session`) and `wasi:logging` in `linker`; WASI
/// and `wasi:http` are wasmtime's to link.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    session::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    logging::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MemoryMeter, TrapKind};
    use crate::sandbox::budget::Budget;

    #[test]
    fn the_memory_cap_holds_for_all_the_memories_of_an_instance_together() {
        let mut meter = MemoryMeter::new(64, None);
        assert!(meter.grow(0, 40).is_ok(), "the first memory's initial size");
        assert_eq!(
            meter.grow(0, 40),
            Err(TrapKind::Memory),
            "a second memory of 40 is over 64 in all"
        );
        assert!(
            meter.grow(0, 24).is_ok(),
            "a second memory of 24 fits exactly"
        );
        assert!(meter.grow(40, 41).is_err(), "no byte more for either");
        meter.grow_failed();
        assert!(
            meter.grow(40, 64).is_ok(),
            "a growth that failed is taken back"
        );
    }

    #[test]
    fn an_instances_memory_comes_from_its_tenants_share_and_goes_back_when_it_is_dropped() {
        let host = Budget::new(100);
        host.reserve([("acme", 30)]);
        let mut globex = MemoryMeter::new(200, Some(host.part("globex")));
        assert!(globex.grow(0, 60).is_ok());
        assert_eq!(
            globex.grow(60, 80),
            Err(TrapKind::HostMemory),
            "under its own cap, but only 70 are not acme's"
        );
        let mut acme = MemoryMeter::new(200, Some(host.part("acme")));
        assert!(
            acme.grow(0, 30).is_ok(),
            "acme's reserved 30 were kept for it"
        );
        acme.grow_failed();
        assert_eq!(host.used(), 60, "a failed growth gives its bytes back");
        drop(globex);
        assert_eq!(host.used(), 0);
    }
}
