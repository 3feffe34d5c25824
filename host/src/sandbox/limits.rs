//! The limits' one table: the defaults that `voicehost run`'s flags, the config of `voicehost serve` and the
//! sandbox all start from, and the engine's caps that no setting may pass. A leaf: it imports nothing of
//! the host's.

use std::time::Duration;

/// The limits of one agent's calls, every value known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLimits {
    /// Linear memory per call's instance.
    pub memory_mib: u64,
    /// Guest CPU time per handler call.
    pub cpu_ms: u64,
    /// Wall-clock time per handler call, waits in `tool` and HTTP included.
    pub wall_ms: u64,
    /// Concurrent calls.
    pub max_sessions: usize,
    /// Guest log lines per second per call.
    pub log_lines_per_second: u32,
    /// The largest component an upload may be.
    pub component_mib: u64,
}

/// The defaults, for a voice agent: a handler answers within a turn (200 ms of CPU is far more than a
/// reply needs), 64 MiB holds a Python or JavaScript runtime with room, a component up to 40 MiB fits
/// Python (18 MB) and StarlingMonkey (12 MB).
pub const DEFAULTS: ResolvedLimits = ResolvedLimits {
    memory_mib: 64,
    cpu_ms: 200,
    wall_ms: 60_000,
    max_sessions: 100,
    log_lines_per_second: 20,
    component_mib: 40,
};

/// Traps within [`TRAP_WINDOW`] after which a call gets its failure policy.
pub const MAX_TRAPS: usize = 3;
/// How far back traps count towards [`MAX_TRAPS`]: older ones are forgotten.
pub const TRAP_WINDOW: Duration = Duration::from_secs(60);

/// The most linear memory one instance's memory may have: the pooling allocator reserves this much
/// address space per memory slot, so no limit may be set above it.
pub const MAX_MEMORY_MIB: u64 = 1024;

/// Handles one instance may hold in its resource table at once: `wasi:http` fields, requests, responses
/// and bodies, streams, pollables. One more traps the instance (`host_resources`). With
/// [`MAX_FIELDS_BYTES`] and [`HTTP_BODY_CHUNK_BYTES`] it bounds what an instance makes the host keep for it
/// beside its linear memory: at most 256 × 16 KiB = 4 MiB of header fields, or 256 × 2 × 16 KiB = 8 MiB of
/// unsent request bodies. A guest that uses `wasi:http` as agents do holds about ten.
pub const MAX_HANDLES: usize = 256;

/// The most one `wasi:http` fields (headers or trailers) may hold, counted as wasmtime-wasi-http counts
/// it (names and values with their in-memory overhead); appending past it fails for the guest.
pub const MAX_FIELDS_BYTES: usize = 16 << 10;

/// The most one write to an outgoing `wasi:http` body may carry; a body buffers at most two such chunks
/// until the request is sent.
pub const HTTP_BODY_CHUNK_BYTES: usize = 16 << 10;

/// The most one `get-random-bytes` (or the insecure one) may ask for: the host makes the bytes before the
/// guest's memory takes them. More traps the instance.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The most data one call from the guest to the host may carry (a `say`'s text, a `send-audio`'s samples,
/// a `log` line, …): the host copies it out of the guest before any other check, in time not charged to
/// the guest's CPU. More traps the instance (`host_resources`). 4 MiB is two minutes of 16 kHz audio.
pub const MAX_HOSTCALL_BYTES: usize = 4 << 20;

/// Elements one table of an instance may grow to (the pool reserves this many per table slot).
pub const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Component-model handles an instance may hold at once (to host resources and its own): a guest makes
/// these without host code in the loop (`resource.new`). More traps the instance.
pub const MAX_COMPONENT_HANDLES: usize = 1_000;

/// A limit the engine cannot run: its key in `voicehost.toml` (`run`'s flag is the same with `-`), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} {problem}")]
pub struct LimitError {
    /// The key, e.g. `memory_mib`.
    pub key: &'static str,
    /// What is wrong with its value.
    pub problem: String,
}

impl ResolvedLimits {
    /// [`ResolvedLimits::component_mib`] in bytes.
    pub fn component_bytes(&self) -> u64 {
        self.component_mib << 20
    }

    /// What in these limits the engine cannot run, or that would leave every call unservable, said as
    /// the setting's name and the bound.
    pub fn check(&self) -> Result<(), LimitError> {
        let positive = [
            ("memory_mib", self.memory_mib),
            ("cpu_ms", self.cpu_ms),
            ("wall_ms", self.wall_ms),
            ("component_mib", self.component_mib),
            ("max_sessions", self.max_sessions as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(LimitError {
                key: name,
                problem: "must be more than 0".into(),
            });
        }
        if self.memory_mib > MAX_MEMORY_MIB {
            return Err(LimitError {
                key: "memory_mib",
                problem: format!(
                    "= {} is over the engine's cap of {MAX_MEMORY_MIB} MiB per memory",
                    self.memory_mib
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_their_own_check() {
        assert_eq!(DEFAULTS.check(), Ok(()));
    }

    #[test]
    fn memory_over_the_engines_cap_or_a_zero_bound_is_refused() {
        let over = ResolvedLimits {
            memory_mib: MAX_MEMORY_MIB + 1,
            ..DEFAULTS
        };
        assert_eq!(over.check().unwrap_err().key, "memory_mib");
        let at = ResolvedLimits {
            memory_mib: MAX_MEMORY_MIB,
            ..DEFAULTS
        };
        assert_eq!(at.check(), Ok(()));
        let zero = ResolvedLimits {
            cpu_ms: 0,
            ..DEFAULTS
        };
        assert_eq!(
            zero.check().unwrap_err().to_string(),
            "cpu_ms must be more than 0"
        );
        let no_calls = ResolvedLimits {
            max_sessions: 0,
            ..DEFAULTS
        };
        assert_eq!(no_calls.check().unwrap_err().key, "max_sessions");
    }
}
