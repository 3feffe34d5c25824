//! The multi-tenant layer of `voicehost serve`: [`config`] (the tenants and their limits, from the
//! config file), [`registry`] (agents and versions, content-addressed on disk) and [`host`] (one served
//! agent per active version: upload, activation, rollback, deletion, the failure policy).

pub mod config;
pub mod host;
pub mod registry;

pub use config::{token_sha256, ServeConfig, Tenant};
pub use host::{AgentStatus, ServeError, Tenancy};
