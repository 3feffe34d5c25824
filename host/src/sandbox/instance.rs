//! The instance serving one call: one Store at a time, its handlers called one event at a time under the
//! call's limits, and a fresh Store after a trap.

use super::cpu::{self, Share};
use super::engine::{AgentCode, Form};
use super::guest_log::{clip, GuestOutput};
use super::imports::HostState;
use super::limits::{MAX_COMPONENT_HANDLES, MAX_HOSTCALL_BYTES};
use super::native::NativeAgent;
use super::trap::{classify, TrapKind, TrapReport};
use super::wit::{RestartReason, SessionEnd, ToolResult, UnknownFrame, UserSaid};
use super::world::Guest;
use super::{GuestImports, Limits};
use anyhow::Result;
use std::future::Future;
use std::sync::Arc;
use wasmtime::{Store, UpdateDeadline};

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
    /// A fresh instance after a trap, told the trap's kind: `on-restart`.
    Restart(RestartReason),
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
        /// For the log: its cause and where in the guest; or which handler took too long, or why no
        /// instance could be made.
        report: TrapReport,
    },
}

/// A call's instance: a Store and the guest in it, or host code (no Store to poison).
enum Live {
    Wasm(Store<HostState>, Guest),
    Native(Arc<dyn NativeAgent>),
}

/// The instance serving one call. After a trap it is rebuilt from the same `InstancePre` on the next call.
pub struct Instance {
    code: AgentCode,
    imports: Arc<dyn GuestImports>,
    limits: Limits,
    live: Option<Live>,
    /// Guest output shared by every Store of this call, so a rebuilt instance keeps the rate limit.
    output: GuestOutput,
    /// What the call's handler calls use of the guest CPU, kept by every Store of this call.
    cpu: Share,
}

impl Instance {
    /// Instantiates the agent for one call.
    pub async fn new(
        code: &AgentCode,
        imports: Arc<dyn GuestImports>,
        limits: Limits,
    ) -> Result<Instance, Unmade> {
        let output = GuestOutput::new(imports.clone(), limits.log_lines_per_second);
        let mut instance = Instance {
            code: code.clone(),
            imports,
            limits,
            live: None,
            output,
            cpu: Share::default(),
        };
        instance.live = Some(instance.instantiate().await?);
        Ok(instance)
    }

    // Not `&self` across the await: a Store is Send but not Sync. Under the wall-clock bound of a handler
    // call: a component's start functions run guest code, which could wait in an import for ever.
    fn instantiate(&self) -> impl Future<Output = Result<Live, Unmade>> + Send + 'static {
        let (code, imports, limits, output, cpu) = (
            self.code.clone(),
            self.imports.clone(),
            self.limits.clone(),
            self.output.clone(),
            self.cpu.clone(),
        );
        async move {
            let within = limits.wall_per_call;
            cpu.restart();
            let instantiating = instantiate(&code, imports, &limits, output, cpu.clone());
            tokio::time::timeout(within, cpu::run(&cpu, instantiating))
                .await
                .unwrap_or_else(|_| {
                    Err(Unmade {
                        kind: TrapKind::WallDeadline,
                        cause: format!("instantiating took longer than {within:?}"),
                    })
                })
        }
    }
}

/// An instance that could not be made, and the kind of trap it counts as (its start functions trapped,
/// or it was refused memory).
#[derive(Debug, thiserror::Error)]
#[error("could not instantiate: {cause}")]
pub struct Unmade {
    /// What it counts as.
    pub kind: TrapKind,
    /// Why, with its causes.
    pub cause: String,
}

async fn instantiate(
    code: &AgentCode,
    imports: Arc<dyn GuestImports>,
    limits: &Limits,
    output: GuestOutput,
    cpu: Share,
) -> Result<Live, Unmade> {
    let (engine, pre, pre_without_http) = match &code.form {
        Form::Wasm {
            engine,
            pre,
            pre_without_http,
            ..
        } => (engine, pre, pre_without_http),
        Form::Native(agent) => return Ok(Live::Native(agent.clone())),
    };
    let state = HostState::new(imports, limits, output, cpu);
    let mut store = Store::new(engine, state);
    store.limiter(|state| state);
    store.set_hostcall_fuel(MAX_HOSTCALL_BYTES);
    store.set_max_component_handles(MAX_COMPONENT_HANDLES);
    store.epoch_deadline_callback(|context| {
        let state = context.data();
        // What the handler call's polls took so far (the one running now is counted when it ends).
        if state.cpu.used() > state.cpu_budget {
            return Ok(UpdateDeadline::Interrupt);
        }
        // Yield: the guest's worker goes to the next call at least once a tick, and its core to the
        // host's I/O threads (`cpu.rs`).
        cpu::at_tick();
        Ok(UpdateDeadline::Yield(1))
    });
    store.set_epoch_deadline(1);
    let pre = if limits.http.allow.is_empty() {
        pre_without_http
    } else {
        pre
    };
    match pre.instantiate_async(&mut store).await {
        Ok(agent) => Ok(Live::Wasm(store, agent)),
        Err(error) => Err(Unmade {
            kind: classify(&error, store.data().memory_hit),
            // With its causes, which may hold the guest's own names: a log line's length at most.
            cause: clip(&format!("{error:#}")).to_string(),
        }),
    }
}

impl Instance {
    /// Whether the host may log a line the guest caused (its handler's error): such lines share the
    /// call's `log_lines_per_second` with the guest's own, and past it are dropped and counted.
    pub fn may_log(&self) -> bool {
        self.output.admit()
    }

    /// Calls the handler for `event`. A trap replaces the instance; the caller then delivers
    /// [`Event::Restart`].
    pub async fn call(&mut self, event: &Event) -> Outcome {
        if self.live.is_none() {
            match self.instantiate().await {
                Ok(live) => self.live = Some(live),
                Err(unmade) => {
                    return Outcome::Trapped {
                        kind: unmade.kind,
                        report: TrapReport::outside(unmade.to_string()),
                    }
                }
            }
        }
        self.cpu.restart();
        if let Some(Live::Native(agent)) = &self.live {
            // Host code, but measured as a guest's is (so the native handler of the benchmarks costs
            // what the Wasm one does beside its guest code).
            let call = cpu::run(&self.cpu, agent.call(&*self.imports, event));
            return match tokio::time::timeout(self.limits.wall_per_call, call).await {
                Ok(outcome) => outcome,
                Err(_) => self.over_wall(event),
            };
        }
        let Some(Live::Wasm(store, agent)) = self.live.as_mut() else {
            return Outcome::Trapped {
                kind: TrapKind::Other,
                report: TrapReport::outside("no instance"),
            };
        };
        store.set_epoch_deadline(1);
        let call = agent.call(store, event);
        let call = cpu::run(&self.cpu, call);
        let result = tokio::time::timeout(self.limits.wall_per_call, call).await;
        let outcome = match result {
            Ok(Ok(Ok(()))) => Outcome::Ok,
            Ok(Ok(Err(message))) => Outcome::Failed(clip(&message).to_string()),
            Ok(Err(error)) => {
                let memory = match &self.live {
                    Some(Live::Wasm(store, _)) => store.data().memory_hit,
                    _ => None,
                };
                Outcome::Trapped {
                    kind: classify(&error, memory),
                    report: TrapReport::of(&error),
                }
            }
            Err(_) => self.over_wall(event),
        };
        if matches!(outcome, Outcome::Trapped { .. }) {
            // A trap poisons the whole Store: the next call gets a fresh one.
            self.live = None;
        }
        outcome
    }

    /// Drops the instance as a trap would: the next call gets a fresh one.
    pub fn discard(&mut self) {
        self.live = None;
    }

    fn over_wall(&self, event: &Event) -> Outcome {
        Outcome::Trapped {
            kind: TrapKind::WallDeadline,
            report: TrapReport::outside(format!(
                "{} took longer than {:?}",
                event.name(),
                self.limits.wall_per_call
            )),
        }
    }
}
