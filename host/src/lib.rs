//! voicehost: serves Sent voice agent calls (protocol 0.2.0, `sent.voice.v1`), running each call's agent logic
//! as a sandboxed WebAssembly component instance.
//!
//! Data flows one way: socket → [`connection`] → [`link`] (routes by session or stream) → [`session`] (the
//! call's task) → [`sandbox`] (the guest) → session → connection → socket.

pub mod connection;
pub mod link;
pub mod protocol;
pub mod registry;
pub mod sandbox;
pub mod session;
pub mod stats;
