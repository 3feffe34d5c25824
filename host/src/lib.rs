//! voicehost: serves Sent voice agent calls (protocol 0.2.0, `sent.voice.v1`), running each call's agent logic
//! as a sandboxed WebAssembly component instance.
//!
//! Data flows one way: socket → [`connection`] (reader) → [`agent`] (its router routes by session or stream)
//! → [`call`] (the call's state machine) → the call's task → [`sandbox`] (the guest) → the guest's imports
//! → the call's state machine → the connection's outbox → writer → socket.
//!
//! `voicehost serve` adds the multi-tenant layer around it: [`config`] (the tenants and their limits),
//! [`registry`] (agents and versions on disk), [`server`] (one agent per active version, activation),
//! [`admission`] (session caps), [`admin`] (the HTTP API) and [`metrics`]; [`cli`] is the operator's
//! side of the admin API (`voicehost agents` and `voicehost token`, and their HTTP client).

pub mod admin;
pub mod admission;
pub mod agent;
pub mod api_views;
pub mod call;
pub mod cli;
pub mod config;
pub mod connection;
pub mod content;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod outbound;
pub mod protocol;
pub mod registry;
pub mod sandbox;
pub mod server;
pub mod stats;
