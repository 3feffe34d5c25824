//! Fuzzing harnesses, one per cargo-fuzz target in `host/fuzz` (`scripts/fuzz`), each replaying its kept
//! corpus (`host/fuzz/corpus/<target>`) on every `cargo test` (the core's own, `intake`, is in
//! `voicehost_proto::fuzzing`):
//!
//! - [`upload`]: an upload's bytes through the validation every upload goes through (compiled on this
//!   host and checked against the `agent` world), from arbitrary bytes and mutated valid components;
//! - [`config`]: `voicehost.toml` through the parser and every check `serve` makes at start and on reload.
//!
//! A harness panics when a rule breaks; each says what must hold in its own doc.

pub mod config;
pub mod upload;

#[cfg(test)]
mod corpus {
    use std::path::{Path, PathBuf};

    pub use voicehost_proto::fuzzing::corpus::{mutate, replay};

    /// The kept corpus of one target, sorted by path.
    pub fn files(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        voicehost_proto::fuzzing::corpus::files(&dir(target))
    }

    /// `host/fuzz/corpus/<target>`.
    pub fn dir(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target)
    }
}
