//! The multi-tenant layer of `voicehost serve`: [`config`] (the tenants and their limits, from the
//! config file), [`registry`] (agents and versions, content-addressed on disk) and [`host`] (one served
//! agent per active version: upload, activation, rollback, deletion, the failure policy) and [`compiling`]
//! (whose compile runs when).

pub mod cluster;
mod compiling;
mod config;
mod host;
mod quota;
mod rates;
mod registry;

pub use config::{
    token_sha256, valid_agent_id, AdminConfig, ClusterConfig, KeySource, ServeConfig, Tenant,
    TokenHash, AGENT_ID_RULE, MAX_API_KEY_BYTES, MAX_CONNECTIONS, MAX_TOKEN_BYTES,
};
pub use host::{check_agent_id, AgentStatus, Left, ServeError, Tenancy, UploadSlot};
pub use quota::{Quota, Usage};
pub use registry::{AgentRecord, ComponentStore, RegistryError, StoreError, VersionRecord};
