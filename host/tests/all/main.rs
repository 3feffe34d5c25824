//! voicehost's integration tests, in one binary (one link of wasmtime instead of one per file); what they
//! share is the `voicehost-testkit` crate (tests/testkit).

mod admin_tls;
mod agent_test;
mod cache;
mod call;
mod chaos;
mod check;
mod cluster;
mod compiling;
mod connection;
mod containment;
mod crash;
mod fairness;
mod filesystem;
mod guest_faults;
mod legacy_world;
mod load;
mod new;
mod operator;
mod outbound;
mod policy;
mod pressure;
mod quota;
mod suite;
mod tenancy;
mod uploads;
mod walkthrough;
