//! What compiling takes, shared by `engine.rs` (which compiles in this process, or has `compiler.rs`
//! compile in a child) and `compiler.rs` (the child's side): the engine's settings and a component's
//! bytes. A leaf of its own, so that neither of the two imports the other for them.

use super::limits;
use std::path::PathBuf;
use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

/// The engine's settings: with `max_calls`, the shared pool for that many live calls and parallel
/// compiling; without, what a process that only compiles needs (no pool, one core). Compiled code depends
/// only on what its hash covers (target, Cranelift's flags, tunables, features), which both share and the
/// pool's size is not part of: the compiling child's code loads in the host, whatever `max_calls` is.
pub(super) fn config(max_calls: Option<usize>) -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    // Pages are 64 KiB (`AgentCode`'s memory checks count on it), and wasmtime pairs every
    // `memory_grow_failed` with a `memory_growing` only without custom page sizes.
    config.wasm_custom_page_sizes(false);
    let Some(max_calls) = max_calls else {
        config.parallel_compilation(false);
        return config;
    };
    // The shared pool: room for `max_calls` slots (checked by `limits::check_max_calls`, which states the
    // address space it reserves). A component over the per-component maxima is refused at upload; under
    // them, a call takes `limits::pool_slots` slots, so the calls admitted always fit.
    let calls = max_calls as u32;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(calls);
    pool.total_core_instances(calls * limits::CORE_INSTANCES_PER_CALL);
    pool.total_memories(calls * limits::MEMORIES_PER_CALL);
    pool.total_tables(calls * limits::TABLES_PER_CALL);
    pool.total_stacks(calls);
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
