//! What kind of trap ended a handler call, for logs, metrics and `on-restart`.

use super::guest_log::clip;
use wasmtime::component::ResourceTableError;
use wasmtime::{Trap, WasmBacktrace};
use wasmtime_wasi_http::FieldMapError;

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
    /// The instance asked for linear memory its tenant's share of the host's guest memory
    /// (`guest_memory_mib`) had no room for.
    HostMemory,
    /// The guest's call stack overflowed.
    StackOverflow,
    /// The instance held more handles on the host than [`super::limits::MAX_HANDLES`], filled a
    /// `wasi:http` fields past [`super::limits::MAX_FIELDS_BYTES`], or passed the host more than
    /// [`super::limits::MAX_HOSTCALL_BYTES`] in one call.
    HostResources,
    /// Any other trap, or an instance that could not be made.
    Other,
    /// Not the guest's doing: the host was asked to replace the call's instance as if it had trapped
    /// (`voicehost call`'s `/restart`).
    Forced,
}

impl TrapKind {
    /// Every kind, in the order stats, metrics and logs list them.
    pub const ALL: [TrapKind; 9] = [
        TrapKind::Panic,
        TrapKind::CpuDeadline,
        TrapKind::WallDeadline,
        TrapKind::Memory,
        TrapKind::HostMemory,
        TrapKind::StackOverflow,
        TrapKind::HostResources,
        TrapKind::Other,
        TrapKind::Forced,
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
            TrapKind::HostMemory => "host_memory",
            TrapKind::StackOverflow => "stack_overflow",
            TrapKind::HostResources => "host_resources",
            TrapKind::Panic => "panic",
            TrapKind::Other => "other",
            TrapKind::Forced => "forced",
        }
    }
}

/// The kind of the trap `error` reports; `memory` when the instance was refused memory first.
pub(super) fn classify(error: &wasmtime::Error, memory: Option<TrapKind>) -> TrapKind {
    if let Some(kind) = memory {
        return kind;
    }
    // A host call over one of the instance's caps returns its error up through the guest, under context
    // (the import's, the backtrace's): look through the whole chain. wasmtime's error for a host call
    // carrying more than `MAX_HOSTCALL_BYTES` is a private type, known by its message (a test pins it).
    let over_a_cap = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ResourceTableError>(),
            Some(ResourceTableError::Full)
        ) || matches!(
            cause.downcast_ref::<FieldMapError>(),
            Some(FieldMapError::TotalSizeTooBig | FieldMapError::TooManyFields)
        ) || cause.to_string().contains("fuel allocated for hostcalls")
    });
    if over_a_cap {
        return TrapKind::HostResources;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => TrapKind::CpuDeadline,
        Some(Trap::StackOverflow) => TrapKind::StackOverflow,
        Some(Trap::UnreachableCodeReached) => TrapKind::Panic,
        _ => TrapKind::Other,
    }
}

/// A trap as the log tells it: one line at `warn` (its cause and the guest function it happened in), the
/// whole wasm backtrace at `debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrapReport {
    /// What stopped the guest, in one line: the trap (`wasm trap: …`), or the error of the host call or
    /// limit that ended it.
    pub cause: String,
    /// The guest function running when it happened (the innermost frame): its name when the component
    /// carries names, else `wasm function N` (and its module's name, if any).
    pub function: Option<String>,
    /// Every frame, innermost first, one per line; empty when there is none (a wall-clock bound, an
    /// instance that could not be made).
    pub backtrace: String,
}

impl TrapReport {
    /// A report of `cause` with no guest frames (the trap did not come from inside the guest).
    pub fn outside(cause: impl Into<String>) -> TrapReport {
        TrapReport {
            cause: clip(&cause.into()).to_string(),
            function: None,
            backtrace: String::new(),
        }
    }

    /// The report of the error a handler call returned.
    pub(super) fn of(error: &wasmtime::Error) -> TrapReport {
        let cause = error.root_cause().to_string();
        let Some(backtrace) = error.downcast_ref::<WasmBacktrace>() else {
            return TrapReport::outside(cause);
        };
        let frame = |f: &wasmtime::FrameInfo| {
            // A name section is the guest's to write: kept to a log line's length.
            let function = match f.func_name() {
                Some(name) => clip(name).to_string(),
                None => format!("wasm function {}", f.func_index()),
            };
            match f.module().name() {
                Some(module) => format!("{module}!{function}"),
                None => function,
            }
        };
        TrapReport {
            cause: clip(&cause).to_string(),
            function: backtrace.frames().first().map(frame),
            backtrace: backtrace
                .frames()
                .iter()
                .map(frame)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}
