//! What compiling takes, shared by `engine.rs` (which compiles in this process, or has `compiler.rs`
//! compile in a child) and `compiler.rs` (the child's side): the engine's settings and a component's
//! bytes. A leaf of its own, so that neither of the two imports the other for them.

use super::limits;
use std::path::PathBuf;
use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

/// The engine's settings: with `for_instances`, the shared pool and parallel compiling; without, what a
/// process that only compiles needs (no pool, one core). Compiled code depends only on what its hash
/// covers (target, Cranelift's flags, tunables, features), which both share: the compiling child's code
/// loads in the host.
pub(super) fn config(for_instances: bool) -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    if !for_instances {
        config.parallel_compilation(false);
        return config;
    }
    // The shared pool. A component over the per-component maxima is refused at upload; under them, one
    // tenant's calls (`max_sessions`, 100 by default) hold at most 3,200 core instances, 400 memories
    // and 800 tables of these totals.
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(1000);
    pool.total_core_instances(10_000);
    pool.total_memories(2000);
    pool.total_tables(4000);
    pool.total_stacks(1000);
    pool.max_core_instances_per_component(limits::MAX_CORE_INSTANCES_PER_COMPONENT);
    pool.max_memories_per_component(limits::MAX_MEMORIES_PER_COMPONENT);
    pool.max_tables_per_component(limits::MAX_TABLES_PER_COMPONENT);
    pool.max_memory_size((limits::MAX_MEMORY_MIB as usize) << 20);
    pool.max_component_instance_size(1 << 20);
    pool.max_core_instance_size(1 << 20);
    pool.table_elements(limits::MAX_TABLE_ELEMENTS);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// A component's bytes to compile: in memory, or in a file (an upload received into one) that stays until
/// the compile is done.
#[derive(Debug, Clone)]
pub enum Wasm {
    /// In memory (a stored version, read back and checked).
    Bytes(bytes::Bytes),
    /// In this file.
    File(PathBuf),
}
