//! wasmtime: one engine with the pooling allocator and an epoch ticker, one `InstancePre` per agent
//! component, one Store per call. A call's handlers run under a CPU deadline (epochs: only the guest's own
//! running time counts, not the time it waits in `tool`), a wall-clock bound, and a linear-memory cap. A
//! trap poisons the whole Store, so [`Instance`] drops it and builds a fresh one from the same
//! `InstancePre`; the session then calls `on-restart`. Guests may make HTTP requests through `wasi:http`,
//! only to the origins of [`Limits::http`] (see [`crate::sandbox::outbound`]); by default none.

use crate::content::{write_atomically, Digest};
use anyhow::Result;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::AsyncWrite;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap, UpdateDeadline,
};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use limits::ResolvedLimits;
use outbound::PolicyHooks;

pub mod limits;
pub mod outbound;

pub use outbound::{HttpPolicy, Origin};

// Generated from wit/agent.wit, whose doc comments become the docs; the WIT leaves a few items bare, and
// the generated helpers (`Refused::name`, `Refused::message`) can have none.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "agent",
        path: "../wit",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// The WIT types, as the rest of the host uses them.
pub mod wit {
    pub use super::bindings::voicehost::agent::log::Level;
    pub use super::bindings::voicehost::agent::types::{
        Call, Direction, Media, Party, Refused, SessionEnd, ToolError, ToolResult, UnknownFrame,
        UserSaid,
    };
}

use bindings::voicehost::agent::{log, session, types};
use wit::*;

/// How often the engine's epoch advances: the grain of the CPU deadline.
pub const TICK: Duration = Duration::from_millis(10);

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
        }
    }
}

/// [`limits::DEFAULTS`], with no HTTP allowed.
impl Default for Limits {
    fn default() -> Self {
        Limits::of(&limits::DEFAULTS, Arc::new(HttpPolicy::default()))
    }
}

/// What a guest's imports reach: its call, on the host's side. The session implements it.
pub trait GuestImports: Send + Sync + 'static {
    /// The call the instance serves, as it started (the `info` import).
    fn info(&self) -> Call;
    /// Speaks `text` on a text call (the `say` import): an `agent.say` frame.
    fn say(
        &self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Result<(), Refused>;
    /// Drops what Sent has not played yet (the `clear` import): an `agent.clear` frame.
    fn clear(&self) -> Result<(), Refused>;
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

/// The engine all agents share, with the epoch ticker that drives CPU deadlines.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    /// Where compiled components are kept, by content hash, when set.
    cache: Option<PathBuf>,
}

impl Sandbox {
    /// A new engine (pooling allocator, epoch interruption) with the host's imports linked, and its epoch
    /// ticker thread; no cache.
    pub fn new() -> Result<Sandbox> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(1000);
        pool.total_core_instances(10_000);
        pool.total_memories(2000);
        pool.total_tables(4000);
        pool.total_stacks(1000);
        pool.max_core_instances_per_component(64);
        pool.max_memories_per_component(16);
        pool.max_tables_per_component(32);
        pool.max_memory_size((limits::MAX_MEMORY_MIB as usize) << 20);
        pool.max_component_instance_size(1 << 20);
        pool.max_core_instance_size(1 << 20);
        pool.table_elements(100_000);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        let mut linker: Linker<HostState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        bindings::Agent::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("voicehost-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })?;
        Ok(Sandbox {
            engine,
            linker: Arc::new(linker),
            cache: None,
        })
    }

    /// Keeps what it compiles in `dir`, by the hash of the component and of the engine's settings, so a
    /// large component (Python, JavaScript) is compiled once per host, not once per start.
    pub fn with_cache(mut self, dir: impl Into<PathBuf>) -> Sandbox {
        self.cache = Some(dir.into());
        self
    }

    /// Compiles an agent's component on this host (a precompiled artifact from outside is never loaded)
    /// and checks that it fits the `agent` world. Only a component that passes every check is cached.
    pub fn load(&self, wasm: &[u8]) -> Result<AgentCode, LoadError> {
        self.load_digested(wasm, &Digest::of(wasm))
    }

    /// [`Sandbox::load`] for a component whose digest the caller has just checked (the registry does on
    /// every read), so an 18 MB component is not hashed twice on a restart.
    pub fn load_digested(&self, wasm: &[u8], digest: &Digest) -> Result<AgentCode, LoadError> {
        match wasm.get(..8) {
            Some([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]) => {
                return Err(LoadError::CoreModule)
            }
            Some([0x00, 0x61, 0x73, 0x6d, ..]) => {}
            _ => return Err(LoadError::NotWasm),
        }
        let path = self.cache_path(digest);
        let cached = path.as_deref().and_then(|path| self.cached(path));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => Component::from_binary(&self.engine, wasm)
                .map_err(|e| LoadError::Invalid(format!("{e:#}")))?,
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::WrongWorld(format!("its imports: {e:#}")))?;
        let pre = bindings::AgentPre::new(pre)
            .map_err(|e| LoadError::WrongWorld(format!("its exports: {e:#}")))?;
        if let (Some(path), false) = (path, from_cache) {
            if let Err(error) = store_atomically(&path, &component) {
                tracing::warn!(path = %path.display(), error = %format!("{error:#}"), "could not cache a compiled component");
            }
        }
        Ok(AgentCode {
            engine: self.engine.clone(),
            pre,
            cached: from_cache,
        })
    }

    /// Where the compiled form of `wasm` is kept: by the hash of the component and of the engine's settings.
    fn cache_path(&self, digest: &Digest) -> Option<PathBuf> {
        self.cache.as_ref().map(|dir| {
            let mut settings = std::collections::hash_map::DefaultHasher::new();
            self.engine
                .precompile_compatibility_hash()
                .hash(&mut settings);
            dir.join(format!("{}-{:016x}.cwasm", digest.hex(), settings.finish()))
        })
    }

    fn cached(&self, path: &Path) -> Option<Component> {
        if !path.exists() {
            return None;
        }
        // SAFETY: only this host writes this directory, with `Component::serialize` of what it compiled
        // itself, under the hash of the source and of the engine's settings. Nothing from outside is ever
        // deserialized: an upload is always compiled here.
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize_file(&self.engine, path) };
        match loaded {
            Ok(component) => Some(component),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "a cached component is unusable: compiling again");
                None
            }
        }
    }
}

/// Why a component cannot serve as an agent.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes do not start with WebAssembly's magic number.
    #[error("this is not WebAssembly")]
    NotWasm,
    /// A core module (binary version 1), not a component.
    #[error("this is a core WebAssembly module, not a component (build for wasm32-wasip2, or wrap it with `wasm-tools component new`)")]
    CoreModule,
    /// wasmtime refused to validate or compile it: why.
    #[error("the component does not validate or compile: {0}")]
    Invalid(String),
    /// Its imports or exports are not the `agent` world's: why.
    #[error("the component does not fit the voicehost:agent world: {0}")]
    WrongWorld(String),
}

/// One agent version, compiled and pre-linked: instances are cheap to make from it.
#[derive(Clone)]
pub struct AgentCode {
    engine: Engine,
    pre: bindings::AgentPre<HostState>,
    cached: bool,
}

impl AgentCode {
    /// Whether the compiled code came from the cache rather than a compilation.
    pub fn from_cache(&self) -> bool {
        self.cached
    }
}

/// Writes a compiled component next to its final name, then renames it: a reader never sees half a file.
fn store_atomically(path: &Path, component: &Component) -> Result<()> {
    let bytes = component.serialize().map_err(anyhow::Error::from)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomically(path, &bytes)?;
    Ok(())
}

/// The state of one Store: WASI (`wasi:http` with the call's policy), the call's side, and the meters
/// behind the limits.
pub struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    http_hooks: PolicyHooks,
    table: ResourceTable,
    imports: Arc<dyn GuestImports>,
    /// The call's log, rate-limited: the `log` import and stdout/stderr share it.
    output: GuestOutput,
    memory_cap: usize,
    memory_hit: bool,
    cpu_budget: u64,
    cpu_used: u64,
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
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.memory_hit = true;
            wasmtime::bail!("the memory limit of {} bytes was reached", self.memory_cap);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl types::Host for HostState {}

impl session::Host for HostState {
    async fn info(&mut self) -> wasmtime::Result<Call> {
        Ok(self.imports.info())
    }

    async fn say(
        &mut self,
        text: String,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> wasmtime::Result<Result<(), Refused>> {
        Ok(self.imports.say(text, last, interruptible))
    }

    async fn clear(&mut self) -> wasmtime::Result<Result<(), Refused>> {
        Ok(self.imports.clear())
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

impl log::Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.output.log(level, &message);
        Ok(())
    }
}

/// One event for the guest: one handler call.
#[derive(Debug, Clone)]
pub enum Event {
    /// The call has started: `on-session-start`.
    SessionStart,
    /// One utterance of the caller (text calls): `on-user-said`.
    UserSaid(UserSaid),
    /// Caller audio samples (audio calls): `on-audio`.
    Audio(Vec<i16>),
    /// Sent's answer to a tool call: `on-tool-result`.
    ToolResult(ToolResult),
    /// A session frame of a type the host does not know: `on-frame`.
    Frame(UnknownFrame),
    /// Sent ended the call: `on-session-end`.
    SessionEnd(SessionEnd),
    /// The call was lost: `on-session-lost`.
    SessionLost,
    /// A fresh instance after a trap, told the trap's kind ([`TrapKind::as_str`]): `on-restart`.
    Restart(String),
}

impl Event {
    /// The handler's name in the WIT (`on-user-said`, …).
    pub fn name(&self) -> &'static str {
        HANDLERS[self.handler()]
    }

    /// The handler's place in [`HANDLERS`].
    pub fn handler(&self) -> usize {
        match self {
            Event::SessionStart => 0,
            Event::UserSaid(_) => 1,
            Event::Audio(_) => 2,
            Event::ToolResult(_) => 3,
            Event::Frame(_) => 4,
            Event::SessionEnd(_) => 5,
            Event::SessionLost => 6,
            Event::Restart(_) => 7,
        }
    }
}

/// The guest's handlers, as the WIT names them.
pub const HANDLERS: [&str; 8] = [
    "on-session-start",
    "on-user-said",
    "on-audio",
    "on-tool-result",
    "on-frame",
    "on-session-end",
    "on-session-lost",
    "on-restart",
];

/// How a trap happened, for logs, metrics and `on-restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// A panic, an abort or an `unreachable`.
    Panic,
    /// The handler ran past its CPU deadline.
    CpuDeadline,
    /// The handler took longer than its wall-clock bound (blocked in a host call).
    WallDeadline,
    /// The instance asked for more linear memory than its cap.
    Memory,
    /// The guest's call stack overflowed.
    StackOverflow,
    /// Any other trap, or an instance that could not be made.
    Other,
}

impl TrapKind {
    /// Every kind, in the order stats, metrics and logs list them.
    pub const ALL: [TrapKind; 6] = [
        TrapKind::Panic,
        TrapKind::CpuDeadline,
        TrapKind::WallDeadline,
        TrapKind::Memory,
        TrapKind::StackOverflow,
        TrapKind::Other,
    ];

    /// Where the kind is in [`TrapKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind's name in logs, metrics (`kind` label) and `on-restart`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TrapKind::CpuDeadline => "cpu_deadline",
            TrapKind::WallDeadline => "wall_deadline",
            TrapKind::Memory => "memory_limit",
            TrapKind::StackOverflow => "stack_overflow",
            TrapKind::Panic => "panic",
            TrapKind::Other => "other",
        }
    }
}

/// What one handler call came to.
#[derive(Debug)]
pub enum Outcome {
    /// The handler returned normally.
    Ok,
    /// The handler returned an error: logged and counted; the instance goes on.
    Failed(String),
    /// The instance trapped and was replaced by a fresh one.
    Trapped {
        /// How it trapped.
        kind: TrapKind,
        /// For the log: the trap's whole error chain, which handler took too long, or why no instance could
        /// be made.
        detail: String,
    },
}

/// The instance serving one call. After a trap it is rebuilt from the same `InstancePre` on the next call.
pub struct Instance {
    code: AgentCode,
    imports: Arc<dyn GuestImports>,
    limits: Limits,
    live: Option<(Store<HostState>, bindings::Agent)>,
    /// Guest output shared by every Store of this call, so a rebuilt instance keeps the rate limit.
    output: GuestOutput,
}

impl Instance {
    /// Instantiates the agent for one call.
    pub async fn new(
        code: &AgentCode,
        imports: Arc<dyn GuestImports>,
        limits: Limits,
    ) -> Result<Instance> {
        let output = GuestOutput::new(imports.clone(), limits.log_lines_per_second);
        let mut instance = Instance {
            code: code.clone(),
            imports,
            limits,
            live: None,
            output,
        };
        instance.live = Some(instance.instantiate().await?);
        Ok(instance)
    }

    // Not `&self` across the await: a Store is Send but not Sync.
    fn instantiate(
        &self,
    ) -> impl Future<Output = Result<(Store<HostState>, bindings::Agent)>> + Send + 'static {
        let (code, imports, limits, output) = (
            self.code.clone(),
            self.imports.clone(),
            self.limits.clone(),
            self.output.clone(),
        );
        async move { instantiate(&code, imports, &limits, output).await }
    }
}

async fn instantiate(
    code: &AgentCode,
    imports: Arc<dyn GuestImports>,
    limits: &Limits,
    output: GuestOutput,
) -> Result<(Store<HostState>, bindings::Agent)> {
    {
        let wasi = WasiCtx::builder()
            .stdout(output.clone())
            .stderr(output.clone())
            .build();
        let state = HostState {
            wasi,
            http: WasiHttpCtx::new(),
            http_hooks: PolicyHooks::new(limits.http.clone(), imports.info().session_id),
            table: ResourceTable::new(),
            imports,
            output,
            memory_cap: limits.memory_bytes,
            memory_hit: false,
            cpu_budget: ticks(limits.cpu_per_call),
            cpu_used: 0,
        };
        let mut store = Store::new(&code.engine, state);
        store.limiter(|state| state);
        store.epoch_deadline_callback(|mut context| {
            let state = context.data_mut();
            state.cpu_used += 1;
            if state.cpu_used > state.cpu_budget {
                return Ok(UpdateDeadline::Interrupt);
            }
            // Yield so a busy guest never holds its worker thread for more than a tick.
            Ok(UpdateDeadline::Yield(1))
        });
        store.set_epoch_deadline(1);
        let agent = code.pre.instantiate_async(&mut store).await?;
        Ok((store, agent))
    }
}

impl Instance {
    /// Calls the handler for `event`. A trap replaces the instance; the caller then delivers
    /// [`Event::Restart`].
    pub async fn call(&mut self, event: &Event) -> Outcome {
        if self.live.is_none() {
            match self.instantiate().await {
                Ok(live) => self.live = Some(live),
                Err(error) => {
                    return Outcome::Trapped {
                        kind: TrapKind::Other,
                        detail: format!("could not instantiate: {error:#}"),
                    }
                }
            }
        }
        let Some((store, agent)) = self.live.as_mut() else {
            return Outcome::Trapped {
                kind: TrapKind::Other,
                detail: "no instance".into(),
            };
        };
        store.data_mut().cpu_used = 0;
        store.set_epoch_deadline(1);
        let handler = agent.voicehost_agent_handler();
        let call = async {
            match event {
                Event::SessionStart => handler.call_on_session_start(&mut *store).await,
                Event::UserSaid(said) => handler.call_on_user_said(&mut *store, said).await,
                Event::Audio(samples) => handler.call_on_audio(&mut *store, samples).await,
                Event::ToolResult(result) => handler.call_on_tool_result(&mut *store, result).await,
                Event::Frame(frame) => handler.call_on_frame(&mut *store, frame).await,
                Event::SessionEnd(end) => handler.call_on_session_end(&mut *store, end).await,
                Event::SessionLost => handler.call_on_session_lost(&mut *store).await,
                Event::Restart(reason) => handler.call_on_restart(&mut *store, reason).await,
            }
        };
        let result = tokio::time::timeout(self.limits.wall_per_call, call).await;
        let outcome = match result {
            Ok(Ok(Ok(()))) => Outcome::Ok,
            Ok(Ok(Err(message))) => Outcome::Failed(message),
            Ok(Err(error)) => {
                let memory = self.live.as_ref().is_some_and(|(s, _)| s.data().memory_hit);
                Outcome::Trapped {
                    kind: classify(&error, memory),
                    // The whole chain: the outermost context is only the wasm backtrace, the cause
                    // (the trap, or the limiter's message) is below it.
                    detail: format!("{error:#}"),
                }
            }
            Err(_) => Outcome::Trapped {
                kind: TrapKind::WallDeadline,
                detail: format!(
                    "{} took longer than {:?}",
                    event.name(),
                    self.limits.wall_per_call
                ),
            },
        };
        if matches!(outcome, Outcome::Trapped { .. }) {
            // A trap poisons the whole Store: the next call gets a fresh one.
            self.live = None;
        }
        outcome
    }
}

fn ticks(duration: Duration) -> u64 {
    (duration.as_millis() / TICK.as_millis()).max(1) as u64
}

fn classify(error: &wasmtime::Error, memory: bool) -> TrapKind {
    if memory {
        return TrapKind::Memory;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => TrapKind::CpuDeadline,
        Some(Trap::StackOverflow) => TrapKind::StackOverflow,
        Some(Trap::UnreachableCodeReached) => TrapKind::Panic,
        _ => TrapKind::Other,
    }
}

// ----- the guest's log -----

/// The guest's log: lines from the `log` import, stdout and stderr go to the call's log through one per-call
/// rate limit; lines over it are dropped and counted. A line is cut at [`MAX_LINE`] bytes.
#[derive(Clone)]
struct GuestOutput {
    shared: Arc<OutputShared>,
}

struct OutputShared {
    imports: Arc<dyn GuestImports>,
    per_second: u32,
    state: Mutex<OutputState>,
    warned: AtomicBool,
}

struct OutputState {
    line: Vec<u8>,
    window: Instant,
    lines: u32,
}

impl GuestOutput {
    fn new(imports: Arc<dyn GuestImports>, per_second: u32) -> GuestOutput {
        GuestOutput {
            shared: Arc::new(OutputShared {
                imports,
                per_second,
                state: Mutex::new(OutputState {
                    line: Vec::new(),
                    window: Instant::now(),
                    lines: 0,
                }),
                warned: AtomicBool::new(false),
            }),
        }
    }
}

/// The longest guest log line kept, in bytes.
const MAX_LINE: usize = 1024;

impl GuestOutput {
    /// A line from the `log` import.
    fn log(&self, level: Level, message: &str) {
        let mut cut = message.len().min(MAX_LINE);
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut state = self.shared.lock();
        self.shared.emit(&mut state, level, &message[..cut]);
    }
}

impl OutputShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, OutputState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes written to stdout or stderr, split into lines.
    fn write(&self, bytes: &[u8]) {
        let mut state = self.lock();
        for &byte in bytes {
            if byte == b'\n' || state.line.len() >= MAX_LINE {
                let line = String::from_utf8_lossy(&state.line).into_owned();
                state.line.clear();
                self.emit(&mut state, Level::Info, &line);
                if byte == b'\n' {
                    continue;
                }
            }
            state.line.push(byte);
        }
    }

    /// One line, if the second it falls in has room for it.
    fn emit(&self, state: &mut OutputState, level: Level, line: &str) {
        if state.window.elapsed() >= Duration::from_secs(1) {
            state.window = Instant::now();
            state.lines = 0;
        }
        state.lines += 1;
        if state.lines <= self.per_second {
            self.imports.log(level, line);
            return;
        }
        self.imports.log_dropped();
        if !self.warned.swap(true, Ordering::Relaxed) {
            self.imports
                .log(Level::Warn, "guest log over its rate limit: dropping lines");
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.shared.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
