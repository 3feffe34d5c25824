//! Counters of what the host did, for logs, the demo's summary and (later) metrics.

use crate::sandbox::TrapKind;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// One monotonically increasing count.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything one host counts.
#[derive(Default, Debug)]
pub struct Stats {
    pub connections_opened: Counter,
    pub sessions_started: Counter,
    pub sessions_ended: Counter,
    pub sessions_lost: Counter,
    pub frames_in: Counter,
    pub frames_out: Counter,
    pub audio_in: Counter,
    pub audio_out: Counter,
    pub audio_dropped: Counter,
    pub resumes: Counter,
    pub handler_errors: Counter,
    pub traps_panic: Counter,
    pub traps_cpu: Counter,
    pub traps_wall: Counter,
    pub traps_memory: Counter,
    pub traps_stack: Counter,
    pub traps_other: Counter,
    pub restarts: Counter,
    pub policies_applied: Counter,
}

impl Stats {
    pub fn trap(&self, kind: TrapKind) {
        match kind {
            TrapKind::Panic => &self.traps_panic,
            TrapKind::CpuDeadline => &self.traps_cpu,
            TrapKind::WallDeadline => &self.traps_wall,
            TrapKind::Memory => &self.traps_memory,
            TrapKind::StackOverflow => &self.traps_stack,
            TrapKind::Other => &self.traps_other,
        }
        .inc();
    }

    pub fn traps(&self) -> u64 {
        [
            &self.traps_panic,
            &self.traps_cpu,
            &self.traps_wall,
            &self.traps_memory,
            &self.traps_stack,
            &self.traps_other,
        ]
        .iter()
        .map(|c| c.get())
        .sum()
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "connections opened  {}", self.connections_opened.get())?;
        writeln!(
            f,
            "sessions            {} started, {} ended, {} lost",
            self.sessions_started.get(),
            self.sessions_ended.get(),
            self.sessions_lost.get()
        )?;
        writeln!(
            f,
            "frames              {} in, {} out",
            self.frames_in.get(),
            self.frames_out.get()
        )?;
        writeln!(
            f,
            "audio messages      {} in, {} out, {} dropped",
            self.audio_in.get(),
            self.audio_out.get(),
            self.audio_dropped.get()
        )?;
        writeln!(f, "resumes             {}", self.resumes.get())?;
        writeln!(f, "handler errors      {}", self.handler_errors.get())?;
        writeln!(
            f,
            "traps contained     {} (panic {}, cpu {}, memory {}, stack {}, wall {}, other {})",
            self.traps(),
            self.traps_panic.get(),
            self.traps_cpu.get(),
            self.traps_memory.get(),
            self.traps_stack.get(),
            self.traps_wall.get(),
            self.traps_other.get()
        )?;
        writeln!(f, "restarts            {}", self.restarts.get())?;
        write!(f, "failure policies    {}", self.policies_applied.get())
    }
}
