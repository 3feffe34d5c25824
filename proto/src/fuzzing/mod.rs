//! The fuzzing harness of the core, for the cargo-fuzz target in `proto/fuzz` (`scripts/fuzz intake`):
//! [`intake`] runs Sent's frames, connections, the clock and the guests' requests against the agent's router
//! and its calls, checking the rules after every step; its kept corpus (`proto/fuzz/corpus/intake`) is
//! replayed on every `cargo test`. [`corpus`] is what replaying a kept corpus takes (the host's harnesses
//! use it too).

pub mod corpus;
pub mod intake;
