//! voicehost: serves Sent voice agent calls (protocol 0.2.0, `sent.voice.v1`), running each call's agent logic
//! as a sandboxed WebAssembly component instance.
//!
//! Data flows one way: socket → [`connection`] → [`link`] (routes by session or stream) → [`session`] (the
//! call's task) → [`sandbox`] (the guest) → session → connection → socket.
//!
//! `voicehost serve` adds the multi-tenant layer around it: [`config`] (the tenants and their limits),
//! [`registry`] (agents and versions on disk), [`server`] (one link per active agent, activation),
//! [`admission`] (session caps), [`admin`] (the HTTP API) and [`metrics`].

pub mod admin;
pub mod admission;
pub mod config;
pub mod connection;
pub mod link;
pub mod metrics;
pub mod outbound;
pub mod protocol;
pub mod registry;
pub mod sandbox;
pub mod server;
pub mod session;
pub mod stats;
