//! What kind of trap ended a handler call, for logs, metrics and `on-restart`.

use wasmtime::Trap;

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

/// The kind of the trap `error` reports; `memory` when the instance hit its memory cap first.
pub(super) fn classify(error: &wasmtime::Error, memory: bool) -> TrapKind {
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
