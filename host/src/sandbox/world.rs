//! The `agent` world a component speaks: which version ([`World`]: 0.3.0, or 0.2.0 or 0.1.0 through their
//! adapters),
//! its pre-linked form and its instances in that version ([`Pre`], [`Guest`]); and, in words, each import
//! the host does not provide, named with why and what to do instead, so an upload (or `voicehost check`)
//! refused for its imports says more than the linker's first mismatch.

use super::imports::HostState;
use super::instance::Event;
use super::{bindings, legacy, v0_2};
use std::sync::OnceLock;
use wasmtime::component::types::{self, ComponentFunc, ComponentItem};
use wasmtime::component::{Component, InstancePre, Type};
use wasmtime::{Engine, Store};

/// The version of the `voicehost:agent` world a component was built against.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
pub enum World {
    /// `voicehost:agent@0.3.0`, `wit/` of this repository.
    #[serde(rename = "voicehost:agent@0.3.0")]
    V0_3,
    /// `voicehost:agent@0.2.0`, served through an adapter (a moved call's restart reason is `forced`).
    #[serde(rename = "voicehost:agent@0.2.0")]
    V0_2,
    /// `voicehost:agent@0.1.0`, served through an adapter: deprecated.
    #[serde(rename = "voicehost:agent@0.1.0")]
    V0_1,
}

impl World {
    /// The world this host is built against, `wit/`'s.
    pub const CURRENT: World = World::V0_3;

    /// `voicehost:agent@0.3.0`, ….
    pub fn name(self) -> &'static str {
        match self {
            World::V0_3 => "voicehost:agent@0.3.0",
            World::V0_2 => v0_2::WORLD,
            World::V0_1 => legacy::WORLD,
        }
    }

    /// The version of its `voicehost:agent` package.
    fn version(self) -> &'static str {
        match self {
            World::V0_3 => "0.3.0",
            World::V0_2 => "0.2.0",
            World::V0_1 => "0.1.0",
        }
    }

    /// What a version stored before the world was recorded speaks: 0.1.0, the only world there was.
    pub fn recorded_before_0_2() -> World {
        World::V0_1
    }

    /// Whether the host serves it only so that components already uploaded keep working.
    pub fn deprecated(self) -> bool {
        self == World::V0_1
    }
}

/// A component pre-linked against its world: instances of it are cheap to make.
#[derive(Clone)]
pub(super) enum Pre {
    Current(bindings::AgentPre<HostState>),
    V0_2(v0_2::AgentPre),
    Legacy(legacy::AgentPre),
}

/// One instance of a component, in its world.
pub(super) enum Guest {
    Current(bindings::Agent),
    V0_2(v0_2::Agent),
    Legacy(legacy::Agent),
}

impl World {
    /// Every world the host serves, the newest first.
    const ALL: [World; 3] = [World::V0_3, World::V0_2, World::V0_1];

    /// The world `component` speaks: 0.1.0 when any of its `voicehost:agent` interfaces is of 0.1.x (a
    /// component half moved to 0.2.0 still needs that adapter), else the world whose handler it is
    /// served through ([`handler_world`]).
    pub(super) fn of(engine: &Engine, component: &Component) -> World {
        let ty = component.component_type();
        let mut names = ty
            .imports(engine)
            .map(|(name, _)| name)
            .chain(ty.exports(engine).map(|(name, _)| name));
        if names.any(|name| agent_version(name).is_some_and(|v| resolves(v, "0.1.0"))) {
            World::V0_1
        } else {
            handler_world(engine, &ty)
        }
    }
}

/// The world a component's handler is called in: the newest whose `handler` it exports (never a fallback
/// from a broken newer handler to an older one); the current one when it exports none (the bindings then
/// say so).
fn handler_world(engine: &Engine, ty: &types::Component) -> World {
    let versions: Vec<&str> = ty
        .exports(engine)
        .filter_map(|(name, _)| name.strip_prefix("voicehost:agent/handler@"))
        .collect();
    World::ALL
        .into_iter()
        .find(|world| versions.iter().any(|v| resolves(v, world.version())))
        .unwrap_or(World::CURRENT)
}

/// The version of a `voicehost:agent/…@version` name, if it is one.
fn agent_version(name: &str) -> Option<&str> {
    name.strip_prefix("voicehost:agent/")?
        .split_once('@')
        .map(|(_, v)| v)
}

impl Pre {
    /// The component's `handler` export of its [`handler_world`], checked against that world's (the error
    /// names the version the component exports). Its functions' types are checked here, where an upload
    /// is, not at the first call's instantiation.
    pub(super) fn new(pre: InstancePre<HostState>) -> wasmtime::Result<Pre> {
        let component = pre.component();
        let engine = component.engine();
        let ty = component.component_type();
        let world = handler_world(engine, &ty);
        let handlers: Vec<(&str, &str)> = ty
            .exports(engine)
            .filter_map(|(name, _)| Some((name, name.strip_prefix("voicehost:agent/handler@")?)))
            .collect();
        // Every export the bindings might take for the world's handler (wasmtime takes the exact version,
        // else the highest that resolves to it): each must have the world's types.
        for (export, _) in handlers
            .iter()
            .filter(|(_, v)| resolves(v, world.version()))
        {
            handler_fits(engine, &ty, export, world)?;
        }
        match world {
            World::V0_1 => legacy::AgentPre::new(pre).map(Pre::Legacy),
            World::V0_2 => v0_2::AgentPre::new(pre).map(Pre::V0_2),
            World::V0_3 => bindings::AgentPre::new(pre).map(Pre::Current),
        }
    }

    pub(super) async fn instantiate_async(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Guest> {
        Ok(match self {
            Pre::Current(pre) => Guest::Current(pre.instantiate_async(store).await?),
            Pre::V0_2(pre) => Guest::V0_2(pre.instantiate_async(store).await?),
            Pre::Legacy(pre) => Guest::Legacy(pre.instantiate_async(store).await?),
        })
    }
}

impl Guest {
    /// Calls the handler for `event`: the guest's `err`, or a trap.
    pub(super) async fn call(
        &self,
        store: &mut Store<HostState>,
        event: &Event,
    ) -> wasmtime::Result<Result<(), String>> {
        let agent = match self {
            Guest::Current(agent) => agent,
            Guest::V0_2(agent) => return v0_2::call(agent, store, event).await,
            Guest::Legacy(agent) => return legacy::call(agent, store, event).await,
        };
        let handler = agent.voicehost_agent_handler();
        match event {
            Event::SessionStart => handler.call_on_session_start(store).await,
            Event::UserSaid(said) => handler.call_on_user_said(store, said).await,
            Event::Audio(samples) => handler.call_on_audio(store, samples).await,
            Event::ToolResult(result) => handler.call_on_tool_result(store, result).await,
            Event::Frame(frame) => handler.call_on_frame(store, frame).await,
            Event::SessionEnd(end) => handler.call_on_session_end(store, end).await,
            Event::SessionLost => handler.call_on_session_lost(store).await,
            Event::Restart(reason) => handler.call_on_restart(store, *reason).await,
        }
    }
}

/// The functions of `handler` as each world's WIT states them, from components build.rs makes of the WIT.
static STATED: OnceLock<Result<[Stated; 3], String>> = OnceLock::new();

type Stated = Vec<(String, ComponentFunc)>;

fn stated(world: World) -> wasmtime::Result<&'static Stated> {
    let stated = STATED.get_or_init(|| {
        let engine = Engine::default();
        let read = |wasm: &[u8], world: World| -> wasmtime::Result<Stated> {
            let component = Component::new(&engine, wasm)?;
            let ty = component.component_type();
            let name = format!("voicehost:agent/handler@{}", world.version());
            let Some(ComponentItem::ComponentInstance(handler)) =
                ty.get_export(&engine, &name).map(|e| e.ty)
            else {
                wasmtime::bail!("the stated {name} is not an instance");
            };
            Ok(handler
                .exports(&engine)
                .filter_map(|(name, e)| match e.ty {
                    ComponentItem::ComponentFunc(func) => Some((name.to_string(), func)),
                    _ => None,
                })
                .collect())
        };
        let v0_3 = include_bytes!(concat!(env!("OUT_DIR"), "/handler-0.3.wasm"));
        let v0_2 = include_bytes!(concat!(env!("OUT_DIR"), "/handler-0.2.wasm"));
        let v0_1 = include_bytes!(concat!(env!("OUT_DIR"), "/handler-0.1.wasm"));
        (|| {
            Ok([
                read(v0_3, World::V0_3)?,
                read(v0_2, World::V0_2)?,
                read(v0_1, World::V0_1)?,
            ])
        })()
        .map_err(|e: wasmtime::Error| format!("{e:#}"))
    });
    match stated {
        Ok([v0_3, v0_2, v0_1]) => Ok(match world {
            World::V0_3 => v0_3,
            World::V0_2 => v0_2,
            World::V0_1 => v0_1,
        }),
        Err(e) => wasmtime::bail!("the host's own handler types: {e}"),
    }
}

/// Whether the component's `export` (a `voicehost:agent/handler` of `world`'s version) has the types the
/// world states for each of its functions; a function it lacks is left to the bindings, which name it.
fn handler_fits(
    engine: &Engine,
    component: &types::Component,
    export: &str,
    world: World,
) -> wasmtime::Result<()> {
    let Some(ComponentItem::ComponentInstance(handler)) =
        component.get_export(engine, export).map(|e| e.ty)
    else {
        wasmtime::bail!("{export} is not an instance of functions");
    };
    for (name, want) in stated(world)? {
        let Some(e) = handler.get_export(engine, name) else {
            continue;
        };
        let ComponentItem::ComponentFunc(got) = e.ty else {
            wasmtime::bail!("{export}: `{name}` is not a function");
        };
        let params = |f: &ComponentFunc| f.params().map(|(_, ty)| ty).collect::<Vec<_>>();
        let results = |f: &ComponentFunc| f.results().collect::<Vec<_>>();
        if params(&got) != params(want) || results(&got) != results(want) || got.async_() {
            wasmtime::bail!(
                "{export}: `{name}` is {}, where {} states {}",
                signature(&got),
                world.name(),
                signature(want)
            );
        }
    }
    Ok(())
}

/// A function's type in WIT's words, nested types spelled out until about a log line's worth is written
/// (a component's types may be huge: what is written is bounded, not what they hold).
fn signature(func: &ComponentFunc) -> String {
    let mut out = Wit::default();
    if func.async_() {
        out.put("async ");
    }
    out.put("func(");
    for (i, (name, ty)) in func.params().enumerate() {
        if i > 0 {
            out.put(", ");
        }
        out.name(name);
        out.put(": ");
        out.ty(&ty);
    }
    out.put(")");
    for (i, ty) in func.results().enumerate() {
        out.put(if i == 0 { " -> " } else { ", " });
        out.ty(&ty);
    }
    out.text
}

/// WIT text written within [`Wit::BUDGET`] bytes: past it, `…` and nothing more.
#[derive(Default)]
struct Wit {
    text: String,
    full: bool,
}

impl Wit {
    const BUDGET: usize = 480;
    /// How much of a name is written.
    const NAME: usize = 40;

    fn put(&mut self, text: &str) {
        if self.full {
            return;
        }
        if self.text.len() + text.len() > Self::BUDGET {
            self.text.push('…');
            self.full = true;
        } else {
            self.text.push_str(text);
        }
    }

    fn name(&mut self, name: &str) {
        match name.char_indices().nth(Self::NAME) {
            Some((cut, _)) => {
                self.put(&name[..cut]);
                self.put("…");
            }
            None => self.put(name),
        }
    }

    fn list<T>(&mut self, items: impl Iterator<Item = T>, mut each: impl FnMut(&mut Self, T)) {
        for (i, item) in items.enumerate() {
            if self.full {
                return;
            }
            if i > 0 {
                self.put(", ");
            }
            each(self, item);
        }
    }

    fn ty(&mut self, ty: &Type) {
        if self.full {
            return;
        }
        let primitive = match ty {
            Type::Bool => "bool",
            Type::S8 => "s8",
            Type::U8 => "u8",
            Type::S16 => "s16",
            Type::U16 => "u16",
            Type::S32 => "s32",
            Type::U32 => "u32",
            Type::S64 => "s64",
            Type::U64 => "u64",
            Type::Float32 => "f32",
            Type::Float64 => "f64",
            Type::Char => "char",
            Type::String => "string",
            Type::Own(_) | Type::Borrow(_) => "a resource",
            Type::ErrorContext => "error-context",
            _ => "",
        };
        if !primitive.is_empty() {
            return self.put(primitive);
        }
        let optional = |out: &mut Self, ty: Option<Type>| match ty {
            Some(ty) => out.ty(&ty),
            None => out.put("_"),
        };
        match ty {
            Type::List(l) => {
                self.put("list<");
                self.ty(&l.ty());
                self.put(">");
            }
            Type::Option(o) => {
                self.put("option<");
                self.ty(&o.ty());
                self.put(">");
            }
            Type::Result(r) => {
                self.put("result<");
                optional(self, r.ok());
                self.put(", ");
                optional(self, r.err());
                self.put(">");
            }
            Type::Tuple(t) => {
                self.put("tuple<");
                self.list(t.types(), |out, ty| out.ty(&ty));
                self.put(">");
            }
            Type::Record(r) => {
                self.put("record { ");
                self.list(r.fields(), |out, field| {
                    out.name(field.name);
                    out.put(": ");
                    out.ty(&field.ty);
                });
                self.put(" }");
            }
            Type::Variant(v) => {
                self.put("variant { ");
                self.list(v.cases(), |out, case| {
                    out.name(case.name);
                    if let Some(ty) = case.ty {
                        out.put("(");
                        out.ty(&ty);
                        out.put(")");
                    }
                });
                self.put(" }");
            }
            Type::Enum(e) => {
                self.put("enum { ");
                self.list(e.names(), Self::name);
                self.put(" }");
            }
            Type::Flags(f) => {
                self.put("flags { ");
                self.list(f.names(), Self::name);
                self.put(" }");
            }
            _ => self.put("another type"),
        }
    }
}

/// The component's imports the host does not provide, each as `name: why, and what to do`.
pub(super) fn unprovided(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .filter_map(|(name, _)| explain(name).map(|why| format!("{name}: {why}")))
        .collect()
}

/// The core WASI packages the host links (wasmtime 48's WASI 0.2.12), with `wasi:http`'s `types` and
/// `outgoing-handler`.
const CORE_WASI: [&str; 7] = [
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
    "wasi:http",
];

/// Whether an import's `version` resolves to a package the host links at `linked`, as wasmtime's linker
/// matches them: the same version, or one on the same semver track (the same major, or for 0.x the same
/// minor) when neither is a pre-release.
fn resolves(version: &str, linked: &str) -> bool {
    let version = version.split('+').next().unwrap_or_default();
    if version == linked {
        return true;
    }
    let track = |v: &str| -> Option<(u64, u64)> {
        if v.contains('-') {
            return None;
        }
        let mut parts = v.split('.').map(str::parse::<u64>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(_)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        // 0.0.z matches only itself; 0.y.z its minor; x.y.z its major.
        Some(if major > 0 {
            (major, u64::MAX)
        } else {
            (0, minor)
        })
        .filter(|t| *t != (0, 0))
    };
    matches!((track(version), track(linked)), (Some(a), Some(b)) if a == b)
}

/// Why the host does not provide the import `name` (`namespace:package/interface@version`), or `None`
/// when it does.
fn explain(name: &str) -> Option<String> {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    let (package, interface) = path.split_once('/').unwrap_or((path, ""));
    let why = match package {
        "voicehost:agent"
            if World::ALL
                .iter()
                .any(|world| resolves(version, world.version())) =>
        {
            return None
        }
        "voicehost:agent" => "this host speaks voicehost:agent@0.3.0 (and 0.2.0; 0.1.0, deprecated): \
                              build against the wit/ of the host you upload to"
            .to_string(),
        "wasi:logging" if path == "wasi:logging/logging" && version == "0.1.0-draft" => return None,
        "wasi:http" if interface == "incoming-handler" => {
            "an agent serves no HTTP: Sent's events reach its `handler` export".into()
        }
        "wasi:http" if !matches!(interface, "types" | "outgoing-handler") => {
            "only wasi:http's `types` and `outgoing-handler` are linked".into()
        }
        core if CORE_WASI.contains(&core) && resolves(version, "0.2.12") => return None,
        core if CORE_WASI.contains(&core) => format!(
            "{} is not linked, only WASI 0.2 releases (0.2.0 to 0.2.12; no release candidate): build for \
             wasm32-wasip2 with a WASI 0.2 toolchain",
            if version.is_empty() {
                "an import without a version".to_string()
            } else {
                format!("WASI {version}")
            }
        ),
        "wasi:keyvalue" => {
            "no key-value store: keep a call's state with `save` and `load` (voicehost:agent/session)"
                .into()
        }
        "wasi:config" => "no runtime config: read the call's `context` (`info`)".into(),
        "wasi:logging" => {
            "only wasi:logging/logging@0.1.0-draft is linked (or write to stdout and stderr)".into()
        }
        proposal if proposal.starts_with("wasi:") => {
            "a WASI proposal the host does not link: agents get WASI 0.2's core interfaces only".into()
        }
        spin if spin.starts_with("fermyon:") || spin.starts_with("spin:") => {
            "a Spin SDK import: build the agent with voicehost-agent (or bindings of wit/), not Spin's SDK"
                .into()
        }
        _ => "not in the voicehost:agent world (WASI 0.2, wasi:http/outgoing-handler, wasi:logging and \
              voicehost:agent): remove what imports it"
            .into(),
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::{explain, resolves};

    #[test]
    fn an_agent_interfaces_version_is_read_from_its_name() {
        assert_eq!(
            super::agent_version("voicehost:agent/session@0.1.0"),
            Some("0.1.0")
        );
        assert_eq!(
            super::agent_version("voicehost:agent/handler@0.2.1"),
            Some("0.2.1")
        );
        assert_eq!(super::agent_version("wasi:io/poll@0.2.12"), None);
    }

    #[test]
    fn versions_resolve_as_wasmtimes_linker_matches_them() {
        for (version, linked) in [
            ("0.2.0", "0.2.12"),
            ("0.2.12", "0.2.12"),
            ("0.2.13", "0.2.12"),
            ("0.1.1", "0.1.0"),
            ("0.1.0+build.5", "0.1.0"),
        ] {
            assert!(resolves(version, linked), "{version} → {linked}");
        }
        for (version, linked) in [
            ("0.2.0-rc-2023-11-10", "0.2.12"),
            ("0.3.0", "0.2.12"),
            ("1.0.0", "0.2.12"),
            ("0.0.1", "0.0.2"),
            ("", "0.2.12"),
            ("0.2", "0.2.12"),
        ] {
            assert!(!resolves(version, linked), "{version} → {linked}");
        }
    }

    #[test]
    fn what_the_host_links_needs_no_word_and_the_rest_says_what_to_do() {
        for provided in [
            "wasi:cli/environment@0.2.0",
            "wasi:io/streams@0.2.6",
            "wasi:filesystem/preopens@0.2.3",
            "wasi:http/outgoing-handler@0.2.0",
            "voicehost:agent/session@0.1.0",
            "voicehost:agent/log@0.1.1",
            "voicehost:agent/session@0.2.0",
            "voicehost:agent/handler@0.3.0",
            "wasi:logging/logging@0.1.0-draft",
        ] {
            assert_eq!(explain(provided), None, "{provided}");
        }
        for (import, says) in [
            ("wasi:keyvalue/store@0.2.0-draft", "`save` and `load`"),
            (
                "wasi:cli/environment@0.3.0-rc-2025-09-16",
                "only WASI 0.2 releases",
            ),
            (
                "wasi:io/streams@0.2.0-rc-2023-11-10",
                "no release candidate",
            ),
            ("wasi:http/incoming-handler@0.2.0", "serves no HTTP"),
            (
                "wasi:logging/logging@0.2.0",
                "only wasi:logging/logging@0.1.0-draft",
            ),
            ("wasi:nn/tensor@0.2.0-rc-2024-10-28", "a WASI proposal"),
            ("fermyon:spin/llm@2.0.0", "Spin SDK"),
            ("voicehost:agent/session@0.4.0", "voicehost:agent@0.3.0"),
            ("acme:tools/lookup@1.0.0", "remove what imports it"),
        ] {
            let why = explain(import).unwrap_or_else(|| panic!("{import} is not linked"));
            assert!(why.contains(says), "{import}: {why}");
        }
    }
}
