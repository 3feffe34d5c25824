//! The engine all agents share, with the host's imports linked, and compiling: a component checked against
//! the `agent` world, pre-linked, and kept compiled in the cache.

use super::compile_input::{config, Wasm};
use super::compiler::{ChildCompiler, ChildFailure};
use super::guest_log::clip;
use super::imports::HostState;
use super::native::NativeAgent;
use super::world::{Pre, World};
use super::{limits, outbound, Limits, IDLE_TICK, TICK};
use crate::content::{remove_partials, write_atomically, Digest, TempFile};
use anyhow::Result;
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceType};
use wasmtime::Engine;

/// The engine all agents share, with the epoch ticker that drives CPU deadlines.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    /// WASI, `wasi:http` and the agent's imports: what an upload is checked against, and what agents
    /// allowed HTTP get.
    linker: Arc<Linker<HostState>>,
    /// The same without `wasi:http`: for agents allowed no origin, whose `wasi:http` imports trap.
    without_http: Arc<Linker<HostState>>,
    /// Where compiled components are kept, by content hash, when set.
    cache: Option<PathBuf>,
    /// Compiles in a child process under bounds, when set; else in this process, unbounded (tests,
    /// benches, `voicehost run` of the operator's own file).
    compiler: Option<ChildCompiler>,
    /// Live calls the pool has room for.
    max_calls: usize,
}

impl Sandbox {
    /// A new engine (pooling allocator for [`limits::MAX_CALLS`] calls, epoch interruption) with the
    /// host's imports linked, and its epoch ticker thread; no cache.
    pub fn new() -> Result<Sandbox> {
        Sandbox::for_calls(limits::MAX_CALLS)
    }

    /// [`Sandbox::new`] with room in the pool for `max_calls` live calls (see
    /// [`limits::check_max_calls`]). Instantiating past them fails: whoever admits calls keeps them
    /// within it (`serve` counts every call under the host's `max_calls`).
    pub fn for_calls(max_calls: usize) -> Result<Sandbox> {
        limits::check_max_calls(max_calls)?;
        let engine = Engine::new(&config(Some(max_calls)))?;
        let mut without_http: Linker<HostState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut without_http)?;
        super::imports::add_to_linker(&mut without_http)?;
        super::v0_2::add_to_linker(&mut without_http)?;
        super::legacy::add_to_linker(&mut without_http)?;
        let mut linker = without_http.clone();
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        outbound::cap_request_strings(&mut linker)?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("voicehost-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    // A tick at its finest only while every calls' worker is in a guest (each waking
                    // costs the host's CPU, even when every guest is idle).
                    let contended = super::cpu::contended();
                    std::thread::sleep(if contended { TICK } else { IDLE_TICK });
                }
            })?;
        Ok(Sandbox {
            engine,
            linker: Arc::new(linker),
            without_http: Arc::new(without_http),
            cache: None,
            compiler: None,
            max_calls,
        })
    }

    /// Live calls the pool has room for (see [`Sandbox::for_calls`]).
    pub fn max_calls(&self) -> usize {
        self.max_calls
    }

    /// Compiles in a child process under `compiler`'s bounds (see [`compiler`](super::compiler)) rather
    /// than in this one: what `serve` does with uploads.
    pub fn with_compiler(mut self, compiler: ChildCompiler) -> Sandbox {
        self.compiler = Some(compiler);
        self
    }

    /// Keeps what it compiles in `dir`, by the hash of the component and of the engine's settings, so a
    /// large component (Python, JavaScript) is compiled once per host, not once per start. What compiles
    /// cut short by a crash left there is removed.
    pub fn with_cache(mut self, dir: impl Into<PathBuf>) -> Sandbox {
        let dir = dir.into();
        match remove_partials(&dir) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(dir = %dir.display(), removed, "removed files left by writes cut short")
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "could not clean the compiled cache")
            }
        }
        self.cache = Some(dir);
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
        check_header(wasm)?;
        match self.load_cached(digest) {
            Some(loaded) => loaded,
            None => self.compile_here(wasm, digest),
        }
    }

    /// Compiles `wasm` in this process, checks it against the world, and keeps it in the cache.
    fn compile_here(&self, wasm: &[u8], digest: &Digest) -> Result<AgentCode, LoadError> {
        let component = Component::from_binary(&self.engine, wasm).map_err(|e| {
            let why = detail(e);
            match over_instance_limits(&why) {
                true => LoadError::OverInstanceLimits(why),
                false => LoadError::Invalid(why),
            }
        })?;
        let code = self.checked(&component, false)?;
        if let Some(path) = self.cache_path(digest) {
            if let Err(error) = store_atomically(&path, &component) {
                tracing::warn!(path = %path.display(), error = %format!("{error:#}"), "could not cache a compiled component");
            }
        }
        Ok(code)
    }

    /// The component at `digest` from the compiled cache, checked against the world, if it is there: no
    /// compiling, so never waits for one.
    pub fn load_cached(&self, digest: &Digest) -> Option<Result<AgentCode, LoadError>> {
        let path = self.cache_path(digest)?;
        let component = self.cached(&path)?;
        Some(self.checked(&component, true))
    }

    /// Compiles `wasm` under the compiler's bounds in a child process when the sandbox has one (else in
    /// this process, off the async workers), checks it against the world, and keeps it in the cache. The
    /// child is killed if this future is dropped.
    pub async fn compile(&self, wasm: Wasm, digest: &Digest) -> Result<AgentCode, LoadError> {
        let sandbox = self.clone();
        let digest = digest.clone();
        let Some(compiler) = &self.compiler else {
            return blocking(move || {
                let bytes = match wasm {
                    Wasm::Bytes(bytes) => bytes.to_vec(),
                    Wasm::File(path) => std::fs::read(&path).map_err(|e| {
                        LoadError::Compiler(format!("cannot read {}: {e}", path.display()))
                    })?,
                };
                check_header(&bytes)?;
                sandbox.compile_here(&bytes, &digest)
            })
            .await?;
        };
        let header = match &wasm {
            Wasm::Bytes(bytes) => bytes.slice(..bytes.len().min(8)).to_vec(),
            Wasm::File(path) => {
                blocking({
                    let path = path.clone();
                    move || {
                        use std::io::Read as _;
                        let mut header = Vec::with_capacity(8);
                        std::fs::File::open(&path)
                            .and_then(|file| file.take(8).read_to_end(&mut header))
                            .map(|_| header)
                            .map_err(|e| {
                                LoadError::Compiler(format!("cannot read {}: {e}", path.display()))
                            })
                    }
                })
                .await??
            }
        };
        check_header(&header)?;
        // Written beside its final name (a file name `remove_partials` knows), renamed once it passed.
        let dir = self.cache.clone().unwrap_or_else(std::env::temp_dir);
        let name = self.cache_name(&digest);
        let output = TempFile::new_in(&dir, &name);
        blocking({
            let dir = dir.clone();
            move || crate::content::private_dir(&dir)
        })
        .await?
        .map_err(|e| LoadError::Compiler(format!("cannot create {}: {e}", dir.display())))?;
        compiler
            .compile(&wasm, output.path())
            .await
            .map_err(|failure| match failure {
                ChildFailure::Refused(why) => LoadError::Invalid(why),
                ChildFailure::TooCostly(why) => LoadError::TooCostly(why),
                ChildFailure::Failed(why) => LoadError::Compiler(why),
            })?;
        // Mapping and checking a compiled form of megabytes: off the async workers.
        blocking(move || {
            // SAFETY: written just now by a child process of this host's own binary (`/proc/self/exe`),
            // compiling on this host with this engine's code settings; nothing from outside is
            // deserialized, and wasmtime checks the settings the form was compiled with.
            #[allow(unsafe_code)]
            let component = unsafe { Component::deserialize_file(&sandbox.engine, output.path()) }
                .map_err(|e| {
                    // The child compiles without the pool; the pool's limits are checked here.
                    let why = detail(e);
                    match over_instance_limits(&why) {
                        true => LoadError::OverInstanceLimits(why),
                        false => {
                            LoadError::Compiler(format!("the compiled form does not load: {why}"))
                        }
                    }
                })?;
            let code = sandbox.checked(&component, false)?;
            if sandbox.cache.is_some() {
                if let Err(error) = std::fs::rename(output.path(), dir.join(&name)) {
                    tracing::warn!(%error, "could not cache a compiled component");
                }
            }
            Ok(code)
        })
        .await?
    }

    /// Checks a compiled component against the `agent` world, with and without `wasi:http`.
    fn checked(&self, component: &Component, from_cache: bool) -> Result<AgentCode, LoadError> {
        let pre = self.linker.instantiate_pre(component).map_err(|e| {
            // What the host does not provide first, in words; then the linker's first mismatch; all of
            // it within a log line's length.
            let unprovided = super::world::unprovided(&self.engine, component);
            let why = match unprovided.is_empty() {
                true => format!("its imports: {e:#}"),
                false => format!(
                    "its imports: not provided: {}; the linker: {e:#}",
                    unprovided.join("; ")
                ),
            };
            LoadError::WrongWorld(clipped(why))
        })?;
        let pre = Pre::new(pre)
            .map_err(|e| LoadError::WrongWorld(format!("its exports: {}", detail(e))))?;
        // It fits the world with `wasi:http`; without it, the only imports left undefined are
        // `wasi:http`'s, which trap when called (an agent allowed no origin gets nothing of it).
        let mut without_http = (*self.without_http).clone();
        let pre_without_http = trap_http_imports(&mut without_http, component)
            .and_then(|()| without_http.instantiate_pre(component))
            .and_then(Pre::new)
            .map_err(|e| LoadError::WrongWorld(format!("without wasi:http: {}", detail(e))))?;
        // Wasm pages are 64 KiB (the custom-page-sizes proposal is not enabled).
        let needs = component.resources_required();
        let least_memory_bytes = needs
            .as_ref()
            .and_then(|needs| needs.max_initial_memory_size)
            .map_or(0, |pages| pages.saturating_mul(64 << 10));
        // Unknown when the component instantiates a module it imports: as many as it may have.
        let pool_slots = match &needs {
            Some(needs) => limits::pool_slots(needs.num_memories, needs.num_tables),
            None => limits::pool_slots(
                limits::MAX_MEMORIES_PER_COMPONENT,
                limits::MAX_TABLES_PER_COMPONENT,
            ),
        };
        let image = component.image_range();
        Ok(AgentCode {
            form: Form::Wasm {
                engine: self.engine.clone(),
                pre,
                pre_without_http,
                world: World::of(&self.engine, component),
            },
            cached: from_cache,
            least_memory_bytes,
            compiled_bytes: (image.end.addr() - image.start.addr()) as u64,
            pool_slots,
        })
    }

    /// Where the compiled form of `wasm` is kept: by the hash of the component and of the engine's settings.
    fn cache_path(&self, digest: &Digest) -> Option<PathBuf> {
        self.cache
            .as_ref()
            .map(|dir| dir.join(self.cache_name(digest)))
    }

    fn cache_name(&self, digest: &Digest) -> String {
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut settings);
        format!("{}-{:016x}.cwasm", digest.hex(), settings.finish())
    }

    /// Deletes from the compiled cache everything but the compiled forms of `keep` made by this engine's
    /// settings (those of components deleted while the host was down, or compiled by an older host, are
    /// never read again); returns how many files went.
    pub fn collect_cache(&self, keep: &BTreeSet<Digest>) -> std::io::Result<usize> {
        let Some(dir) = &self.cache else {
            return Ok(0);
        };
        let wanted: BTreeSet<String> = keep.iter().map(|d| self.cache_name(d)).collect();
        let mut removed = 0;
        let entries = match std::fs::read_dir(dir) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            entries => entries?,
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_str().is_some_and(|name| wanted.contains(name))
                || !entry.file_type()?.is_file()
            {
                continue;
            }
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Deletes the compiled form of a component no version refers to any more.
    pub fn forget(&self, digest: &Digest) {
        if let Some(path) = self.cache_path(digest) {
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), %error, "could not delete a compiled component")
                }
                _ => {}
            }
        }
    }

    fn cached(&self, path: &Path) -> Option<Component> {
        // (A cache hit must not wait on anything: this is a stat and an mmap.)
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

/// Runs `work` on the blocking pool: compiling, hashing, mapping and checking take milliseconds to seconds,
/// and the async workers carry the calls. (A panic in it is the host's failure.)
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LoadError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LoadError::Compiler(format!("a blocking task stopped: {e}")))
}

/// What the first bytes say: WebAssembly, and a component rather than a core module.
fn check_header(wasm: &[u8]) -> Result<(), LoadError> {
    if !wasm.starts_with(b"\0asm") {
        return Err(LoadError::NotWasm);
    }
    if wasm.get(4..8) == Some(&[0x01, 0x00, 0x00, 0x00]) {
        return Err(LoadError::CoreModule);
    }
    Ok(())
}

/// Defines every `wasi:http` import of `component` in `linker` as a function that traps (and its resources
/// as types nothing can make): the agent instantiates, and its first use of `wasi:http` ends the handler
/// call. Only `wasi:http`'s: `wasmtime`'s `define_unknown_imports_as_traps` would also redefine the
/// `wasi:io` resources that `wasi:http` shares, under a newer minor version than the linker's.
fn trap_http_imports(
    linker: &mut Linker<HostState>,
    component: &Component,
) -> wasmtime::Result<()> {
    /// The resource type of `wasi:http`'s resources when it is not linked: none is ever made.
    struct NotLinked;
    let engine = linker.engine().clone();
    let world = component.component_type();
    // The resources of the other imports (`wasi:io`'s streams and pollable): `wasi:http` uses them, and
    // they are linked already.
    let mut linked = Vec::new();
    for (name, import) in world.imports(&engine) {
        if let (false, ComponentItem::ComponentInstance(instance)) =
            (name.starts_with("wasi:http/"), &import.ty)
        {
            for (_, item) in instance.exports(&engine) {
                if let ComponentItem::Resource(ty) = item.ty {
                    linked.push(ty);
                }
            }
        }
    }
    for (name, import) in world.imports(&engine) {
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        if !name.starts_with("wasi:http/") {
            continue;
        }
        let mut stubs = linker.instance(name)?;
        for (export, item) in instance.exports(&engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => {
                    let what = format!("{name}#{export}");
                    stubs.func_new(export, move |_, _, _, _| {
                        wasmtime::bail!("{what}: wasi:http is not linked: the agent's tenant allows it no origin")
                    })?;
                }
                ComponentItem::Resource(ty) if !linked.contains(&ty) => {
                    stubs.resource(export, ResourceType::host::<NotLinked>(), |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// wasmtime's reason for refusing a component, cut to [`MAX_LINE`](super::guest_log::MAX_LINE) bytes: it may quote the component's own
/// names (of any length), and it goes back to the uploader and into the log.
fn detail(error: wasmtime::Error) -> String {
    clipped(format!("{error:#}"))
}

/// `text` cut to a log line's length, with `…` when cut.
fn clipped(text: String) -> String {
    let cut = clip(&text);
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        text
    }
}

/// Whether wasmtime refused a component because its memories or tables do not fit the pool's slots
/// (`limits::MAX_TABLE_ELEMENTS`, `MAX_MEMORIES_PER_COMPONENT`, …). wasmtime gives this no error type of its
/// own: its message is matched (wasmtime is pinned; a test uploads such a component).
fn over_instance_limits(why: &str) -> bool {
    // "… does not fit in pooling allocator requirements" (a module's), "… exceeds the configured maximum
    // of N in the pooling allocator" (the component's counts).
    why.contains("pooling allocator")
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
    /// Compiling it went over a bound of time or memory (see [`CompileBounds`](super::CompileBounds)).
    #[error("the component costs too much to compile: {0}")]
    TooCostly(String),
    /// It declares more memories, tables or table elements than an instance may have: which.
    #[error("the component declares more than an instance may have: {0}")]
    OverInstanceLimits(String),
    /// The compiler itself failed (the host's fault, not the component's): why.
    #[error("the compiler failed: {0}")]
    Compiler(String),
    /// Its imports or exports are not the `agent` world's: why.
    #[error("the component does not fit the voicehost:agent world: {0}")]
    WrongWorld(String),
}

/// One agent version, compiled and pre-linked: instances are cheap to make from it.
#[derive(Clone)]
pub struct AgentCode {
    pub(super) form: Form,
    cached: bool,
    least_memory_bytes: u64,
    compiled_bytes: u64,
    pool_slots: u32,
}

/// What an agent's calls run: its component, or host code (see [`super::native`]).
// One per agent version and per live call's instance: 328 bytes each is not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum Form {
    Wasm {
        engine: Engine,
        pre: Pre,
        /// For calls whose HTTP policy allows no origin: `wasi:http` is not linked, its imports trap.
        pre_without_http: Pre,
        /// The world it speaks (0.1.0 when it uses any interface of it).
        world: World,
    },
    Native(Arc<dyn NativeAgent>),
}

impl AgentCode {
    /// An agent that is host code, not a component: for measuring what the sandbox costs.
    pub fn native(agent: Arc<dyn NativeAgent>) -> AgentCode {
        AgentCode {
            form: Form::Native(agent),
            cached: false,
            least_memory_bytes: 0,
            compiled_bytes: 0,
            pool_slots: 1,
        }
    }

    /// The version of the `voicehost:agent` world it speaks; `None` for host code.
    pub fn world(&self) -> Option<World> {
        match &self.form {
            Form::Wasm { world, .. } => Some(*world),
            Form::Native(_) => None,
        }
    }

    /// The initial size of its largest memory, in bytes.
    pub fn least_memory_bytes(&self) -> u64 {
        self.least_memory_bytes
    }

    /// The slots of the shared pool one call of this code takes (see [`limits::pool_slots`]).
    pub fn pool_slots(&self) -> u32 {
        self.pool_slots
    }

    /// Whether the compiled code came from the cache rather than a compilation.
    pub fn from_cache(&self) -> bool {
        self.cached
    }

    /// The size of the compiled code (its image, as the cache keeps it), in bytes.
    pub fn compiled_bytes(&self) -> u64 {
        self.compiled_bytes
    }

    /// Why an instance of this code could never start under `limits`, if so: the initial size its largest
    /// memory declares is over the memory limit. (The limit counts all its memories together, so code that
    /// passes may still need more; wasmtime cannot tell when the component instantiates an imported module.)
    pub fn never_fits(&self, limits: &Limits) -> Option<String> {
        (self.least_memory_bytes > limits.memory_bytes as u64).then(|| {
            format!(
                "the component's initial memory is {:.1} MiB, over the agent's memory_mib = {}",
                self.least_memory_bytes as f64 / (1 << 20) as f64,
                limits.memory_bytes >> 20
            )
        })
    }
}

/// Writes a compiled component next to its final name, then renames it: a reader never sees half a file.
fn store_atomically(path: &Path, component: &Component) -> Result<()> {
    let bytes = component.serialize().map_err(anyhow::Error::from)?;
    if let Some(dir) = path.parent() {
        crate::content::private_dir(dir)?;
    }
    write_atomically(path, &bytes)?;
    Ok(())
}
