//! voicehost's integration tests, in one binary (one link of wasmtime instead of one per file).

mod admin_http;
mod cache;
mod connection;
mod guest_faults;
mod harness;
mod hosting;
mod operator;
mod outbound;
mod pressure;
mod suite;
mod tenancy;
