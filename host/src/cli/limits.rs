//! The limits one agent's calls run under, as flags: `voicehost run` and `voicehost call` take the same.

use crate::agent::{CallRules, FailurePolicy};
use crate::sandbox::limits::{self, ResolvedLimits};
use crate::sandbox::{HttpPolicy, Limits, Origin};
use anyhow::{anyhow, Context as _, Result};
use std::sync::Arc;

/// The limits of each call's instance, and what happens to a call the agent cannot serve.
#[derive(clap::Args, Debug, Clone)]
pub struct RunLimits {
    /// Guest CPU time per handler call, in milliseconds.
    #[arg(long, default_value_t = limits::DEFAULTS.cpu_ms)]
    pub cpu_ms: u64,
    /// Linear memory per call's instance, in MiB.
    #[arg(long, default_value_t = limits::DEFAULTS.memory_mib)]
    pub memory_mib: u64,
    /// Traps within a minute after which the call gets the failure policy.
    #[arg(long, default_value_t = limits::MAX_TRAPS)]
    pub max_traps: usize,
    /// What to do with a call its agent cannot serve (repeated traps, no instance, behind Sent): `hangup`,
    /// or `transfer:KIND:VALUE` (e.g. `transfer:number:+14155550100`).
    #[arg(
        long,
        default_value = "hangup",
        value_name = "hangup|transfer:KIND:VALUE"
    )]
    pub on_repeated_traps: FailurePolicy,
    /// An origin the agent may send HTTP requests to (`https://api.example.com`, `http://127.0.0.1:8089`);
    /// repeat for more. None by default. Named here by whoever runs the host, such an origin may resolve
    /// to any address, private ones included (`serve` needs `allow_private` for that).
    #[arg(long, value_name = "ORIGIN")]
    pub allow_http: Vec<String>,
}

impl RunLimits {
    /// The calls' rules, or which flag is wrong and why.
    pub fn rules(&self) -> Result<CallRules> {
        let allow = self
            .allow_http
            .iter()
            .map(|origin| Origin::parse(origin).with_context(|| format!("--allow-http {origin:?}")))
            .collect::<Result<Vec<_>>>()?;
        let limits = ResolvedLimits {
            cpu_ms: self.cpu_ms,
            memory_mib: self.memory_mib,
            ..limits::DEFAULTS
        };
        limits
            .check()
            .map_err(|e| anyhow!("--{} {}", e.key.replace('_', "-"), e.problem))?;
        if self.max_traps == 0 {
            return Err(anyhow!("--max-traps 0: at least 1 (the first trap counts)"));
        }
        Ok(CallRules {
            limits: Limits::of(
                &limits,
                Arc::new(HttpPolicy {
                    allow_private: allow.clone(),
                    ..HttpPolicy::allowing(allow)
                }),
            ),
            max_traps: self.max_traps,
            policy: self.on_repeated_traps.clone(),
            ..CallRules::default()
        })
    }
}
