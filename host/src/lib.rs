//! voicehost: serves Sent voice agent calls (protocol 0.2.0, `sent.voice.v1`), running each call's agent
//! logic as a sandboxed WebAssembly component instance.
//!
//! Data flows one way: socket → [`agent::connection`] (reader) → [`agent`] (its router routes by session
//! or stream) → [`call`] (the call's state machine) → the call's task → [`sandbox`] (the guest) → the
//! guest's imports → the call's state machine → the connection's outbox → writer → socket.
//!
//! The modules, each importing only those below it: [`protocol`] (Sent's frames as they arrive: the
//! intake's checks and bounds), [`content`] (content addresses, atomic files), [`sandbox`] (the engine,
//! compiling, instances, their limits and HTTP policy), [`stats`] (what an agent counts), [`call`] (one
//! call's rules), [`agent`] (one agent's connections, calls and admission), [`tenancy`] (`voicehost
//! serve`: config, registry, the served agents), [`api`] (the admin HTTP API: routes, views, metrics),
//! [`cli`] (the operator's side of the admin API: `voicehost agents` and `voicehost token`, and their
//! HTTP client).

#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod call;
pub mod cli;
pub mod content;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod logging;
pub mod protocol;
pub mod sandbox;
pub mod stats;
pub mod tenancy;
