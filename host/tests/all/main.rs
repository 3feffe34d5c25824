//! voicehost's integration tests, in one binary (one link of wasmtime instead of one per file).

mod cache;
mod connection;
mod guest_faults;
mod harness;
mod suite;
