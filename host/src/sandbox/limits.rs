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

/// Connections to Sent per active agent (`connections`, `run`'s `--connections`).
pub const CONNECTIONS: usize = 1;

/// Saved state per call (`save`): keys and values together, in bytes.
pub const STATE_BYTES: usize = 64 << 10;

/// The timeout of a guest's HTTP request (connect, first byte, between bytes, and the whole request),
/// when its tenant allows HTTP and sets no `timeout_ms`.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest response body a guest may receive over HTTP, when its tenant sets no `max_response_kib`.
pub const HTTP_MAX_RESPONSE_BYTES: u64 = 1 << 20;

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

/// What one component may instantiate, as the pooling allocator counts it: core module instances, linear
/// memories and tables. Measured (issue 11): a Rust agent has 3 instances, 1 memory and 2 tables;
/// componentize-py's Python 14, 1 and 2; componentize-qjs's QuickJS 9, 2 and 2; StarlingMonkey 4, 1 and 2.
/// A component over any of these is refused when it is uploaded. The pool holds, per slot of `max_calls`,
/// this many core instances (a count, no memory), [`MEMORIES_PER_CALL`] memories and [`TABLES_PER_CALL`]
/// tables: a call of a component that declares more memories or tables takes more slots
/// ([`pool_slots`]), so that every slot admitted has its room in the pool whoever holds the others.
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;
/// See [`MAX_CORE_INSTANCES_PER_COMPONENT`].
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
/// See [`MAX_CORE_INSTANCES_PER_COMPONENT`].
pub const MAX_TABLES_PER_COMPONENT: u32 = 8;

/// The pool slots (of `max_calls`) one call of a component with `memories` memories and `tables` tables
/// takes: 1 for every agent measured (QuickJS has 2 memories, Python 2 tables), up to 2 at the
/// per-component maxima.
pub fn pool_slots(memories: u32, tables: u32) -> u32 {
    memories
        .div_ceil(MEMORIES_PER_CALL)
        .max(tables.div_ceil(TABLES_PER_CALL))
        .max(1)
}

/// Live calls one host holds at once by default (`max_calls`): the size of the shared instance pool.
pub const MAX_CALLS: usize = 1_000;
/// The most `max_calls` may be. Each call's room in the pool reserves address space, not memory:
/// [`MEMORIES_PER_CALL`] linear-memory slots of 4 GiB and 32 MiB of guard each (wasmtime's default
/// reservation, which spares 32-bit guests their bounds checks) and [`TABLES_PER_CALL`] table slots of
/// [`MAX_TABLE_ELEMENTS`] elements, about 8.3 TiB per 1,000 calls; 10,000 calls take 83 TiB of the
/// 128 TiB an x86-64 process may map.
pub const MAX_CALLS_CAP: usize = 12_000;
/// Memory slots per call in the pool: a Rust, Python or StarlingMonkey agent has one, QuickJS two.
pub const MEMORIES_PER_CALL: u32 = 2;
/// Table slots per call in the pool: every agent measured has two.
pub const TABLES_PER_CALL: u32 = 4;
/// Core instances per call in the pool: as many as a component may have (a Rust agent has 3, QuickJS 9,
/// Python 14); the pool only counts them.
pub const CORE_INSTANCES_PER_CALL: u32 = MAX_CORE_INSTANCES_PER_COMPONENT;

/// Why `max_calls` cannot be used, if it cannot.
pub fn check_max_calls(max_calls: usize) -> Result<(), LimitError> {
    if (1..=MAX_CALLS_CAP).contains(&max_calls) {
        return Ok(());
    }
    Err(LimitError {
        key: "max_calls",
        problem: format!("= {max_calls}: use 1 to {MAX_CALLS_CAP}"),
    })
}

/// The most `guest_memory_mib` may be: 16 TiB.
pub const GUEST_MEMORY_MIB_CAP: u64 = 1 << 24;

/// Why `guest_memory_mib` cannot be used, if it cannot.
pub fn check_guest_memory_mib(mib: u64) -> Result<(), LimitError> {
    if (16..=GUEST_MEMORY_MIB_CAP).contains(&mib) {
        return Ok(());
    }
    Err(LimitError {
        key: "guest_memory_mib",
        problem: format!("= {mib}: use 16 to {GUEST_MEMORY_MIB_CAP}"),
    })
}

/// The guests' linear memory across every call when the config sets no `guest_memory_mib`: three quarters
/// of the memory this process may use (the machine's, or its cgroups' limit when lower), leaving the rest
/// to the host's own work (connections, buffers, compiled code); 4 GiB when neither can be read.
pub fn default_guest_memory_mib() -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        });
    let bytes = match (machine, cgroup_memory_limit()) {
        (Some(m), Some(c)) => m.min(c),
        (Some(m), None) => m,
        (None, Some(c)) => c,
        (None, None) => 4 << 30,
    };
    ((bytes / 4 * 3) >> 20).clamp(16, GUEST_MEMORY_MIB_CAP)
}

/// The smallest memory limit of the cgroups this process is in, from its own up to the root of the
/// hierarchy (a container's, or a systemd service's `MemoryMax=`): cgroup v2's `memory.max`, or v1's
/// `memory.limit_in_bytes`. `None` when none is set or readable.
fn cgroup_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut least: Option<u64> = None;
    for line in text.lines() {
        // v2: `0::/path`; v1: `N:memory:/path` (the controllers may be listed together).
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let root = std::path::Path::new(root);
        let mut dir = root.join(path.trim_start_matches('/'));
        loop {
            // "max" (v2), or a number near 2^63 (v1), when there is no limit: not a number, or above
            // the machine's memory anyway.
            let limit = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok());
            if let Some(limit) = limit {
                least = Some(least.map_or(limit, |least| least.min(limit)));
            }
            if dir == root || !dir.pop() {
                break;
            }
        }
    }
    least
}

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
    /// Every value, in [`RANGES`]' order.
    pub fn values(&self) -> [u64; 6] {
        [
            self.memory_mib,
            self.cpu_ms,
            self.wall_ms,
            self.max_sessions as u64,
            u64::from(self.log_lines_per_second),
            self.component_mib,
        ]
    }

    /// [`ResolvedLimits::component_mib`] in bytes.
    pub fn component_bytes(&self) -> u64 {
        self.component_mib << 20
    }

    /// What in these limits the engine cannot run, or that would leave every call unservable or nothing
    /// bounded, said as the setting's name and the bound: every value is within its range in [`RANGES`].
    pub fn check(&self) -> Result<(), LimitError> {
        for ((key, min, max, why), value) in RANGES.iter().zip(self.values()) {
            if value < *min {
                return Err(LimitError {
                    key,
                    problem: format!("must be at least {min}"),
                });
            }
            if value > *max {
                return Err(LimitError {
                    key,
                    problem: format!("= {value} is over its maximum, {max} ({why})"),
                });
            }
        }
        Ok(())
    }
}

/// The least and the most each limit may be set to, with why the most, in [`ResolvedLimits`]' order. A
/// bound of 0 would leave every call unservable, but for the log, which 0 silences; past the most a
/// setting no longer bounds anything (and values near `u64::MAX` would overflow where they are turned into
/// bytes or deadlines).
pub const RANGES: [(&str, u64, u64, &str); 6] = [
    (
        "memory_mib",
        1,
        MAX_MEMORY_MIB,
        "the pool reserves this much address space per memory",
    ),
    ("cpu_ms", 1, 60_000, "a minute of CPU for one handler call"),
    ("wall_ms", 1, 3_600_000, "an hour for one handler call"),
    ("max_sessions", 1, 100_000, "calls at once"),
    (
        "log_lines_per_second",
        0,
        1_000,
        "guest log lines a second, per call",
    ),
    (
        "component_mib",
        1,
        1_024,
        "an upload is held in memory while it is checked",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_guest_memory_is_three_quarters_of_what_the_process_may_use_at_most() {
        let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap();
        let mib = default_guest_memory_mib();
        assert!(
            (16..=(total_kib >> 10) / 4 * 3 + 1).contains(&mib),
            "{mib} MiB"
        );
    }

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
            "cpu_ms must be at least 1"
        );
        let no_calls = ResolvedLimits {
            max_sessions: 0,
            ..DEFAULTS
        };
        assert_eq!(no_calls.check().unwrap_err().key, "max_sessions");
    }

    #[test]
    fn each_limit_is_accepted_at_both_ends_of_its_range_and_refused_past_them() {
        for (at, (key, min, max, _)) in RANGES.iter().enumerate() {
            let set = |value: u64| {
                let mut limits = DEFAULTS;
                match at {
                    0 => limits.memory_mib = value,
                    1 => limits.cpu_ms = value,
                    2 => limits.wall_ms = value,
                    3 => limits.max_sessions = value as usize,
                    4 => limits.log_lines_per_second = value as u32,
                    _ => limits.component_mib = value,
                }
                limits
            };
            assert_eq!(set(*max).check(), Ok(()), "{key} at its maximum");
            assert_eq!(set(*min).check(), Ok(()), "{key} at its minimum");
            let error = set(max + 1).check().unwrap_err();
            assert_eq!(error.key, *key);
            assert!(error.problem.contains("over its maximum"), "{error}");
            if *min > 0 {
                let error = set(min - 1).check().unwrap_err();
                assert_eq!(error.to_string(), format!("{key} must be at least {min}"));
            }
        }
    }
}
