//! The multi-tenant layer of `voicehost serve`: [`config`] (the tenants and their limits, from the
//! config file), [`registry`] (agents and versions, content-addressed on disk) and [`server`] (one served
//! agent per active version: upload, activation, rollback, deletion, the failure policy).

pub mod config;
pub mod registry;
pub mod server;

pub use config::{token_sha256, ServeConfig, Tenant};
pub use server::{AgentStatus, ServeError, Server};
