//! `voicehost check AGENT.wasm`: what an upload of the component would meet, offline, for an agent author
//! before uploading. The same checks as an upload to `serve` (the size cap, the header, validation and
//! compiling in a child process under `[compile]`'s bounds, the `agent` world, the pool's per-component
//! maxima, the initial memory against `memory_mib`), with the same codes and messages as the admin API's
//! 4xx answers; with `run`'s limits, or with a tenant's and an agent's from a `serve` config.

use crate::api::{error_code, too_large_message};
use crate::content::Digest;
use crate::sandbox::limits::{self, ResolvedLimits};
use crate::sandbox::{ChildCompiler, CompileBounds, Limits, LoadError, Sandbox, Wasm};
use crate::tenancy::{ServeConfig, ServeError};
use anyhow::{anyhow, Context as _, Result};
use std::path::PathBuf;
use std::time::Instant;

/// `voicehost check`'s arguments.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// The agent's component (.wasm).
    pub component: PathBuf,
    /// A `serve` config: check against its `[compile]` bounds and a tenant's limits, instead of the
    /// defaults. Its tenants' Sent keys are not read.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The tenant whose limits apply (with `--config`; its first tenant when left out).
    #[arg(long, requires = "config")]
    pub tenant: Option<String>,
    /// The agent the component would be uploaded as: its `[tenants.agents]` limits apply.
    #[arg(long, requires = "config")]
    pub agent_id: Option<String>,
}

/// Checks the component; `Ok` with what it is when an upload would take it, `Err` with the admin API's
/// status, code and message when one would refuse it. `compiler` is the `voicehost` binary (it compiles
/// in a child of its own, as `serve` does).
pub async fn check(args: CheckArgs, compiler: PathBuf) -> Result<String> {
    let (limits, bounds, whose) = match &args.config {
        None => (
            limits::DEFAULTS,
            CompileBounds::DEFAULT,
            "the default".to_string(),
        ),
        Some(path) => {
            let config = ServeConfig::read(path)?;
            // Only the limits are wanted: the keys stay where they are.
            let tenants = config.tenants_with(|_| Ok("sk_unread".into()))?;
            let tenant = match &args.tenant {
                Some(id) => tenants.iter().find(|t| &t.id == id),
                None => tenants.first(),
            }
            .ok_or_else(|| anyhow!("{}: no such tenant", path.display()))?;
            let agent = args.agent_id.as_deref().unwrap_or("");
            let whose = match &args.agent_id {
                Some(agent) => format!("tenant {:?}'s agent {agent}'s", tenant.id),
                None => format!("tenant {:?}'s", tenant.id),
            };
            (tenant.agent_limits(agent), config.compile.bounds(), whose)
        }
    };
    let path = &args.component;
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > limits.component_bytes() {
        return Err(refusal(
            413,
            "too_large",
            &too_large_message(limits.component_bytes()),
        ));
    }
    let wasm = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let digest = Digest::of(&wasm);
    let sandbox = Sandbox::for_calls(1)?.with_compiler(ChildCompiler {
        program: compiler,
        bounds,
    });
    let started = Instant::now();
    let code = match sandbox.compile(Wasm::Bytes(wasm.into()), &digest).await {
        Ok(code) => code,
        Err(LoadError::Compiler(why)) => return Err(anyhow!("the compiler failed: {why}")),
        Err(error) => return Err(refused(ServeError::Load(error))),
    };
    let took = started.elapsed();
    if let Some(why) = code.never_fits(&Limits::of(&limits, Default::default())) {
        return Err(refused(ServeError::OverLimits(why)));
    }
    Ok(report(&limits, &bounds, &whose, size, took, &code))
}

fn refused(error: ServeError) -> anyhow::Error {
    let code = error_code(&error);
    refusal(code.status(), code.as_str(), &error.to_string())
}

fn refusal(status: u16, code: &str, message: &str) -> anyhow::Error {
    anyhow!("an upload would be refused ({status} {code}): {message}")
}

fn report(
    limits: &ResolvedLimits,
    bounds: &CompileBounds,
    whose: &str,
    size: u64,
    took: std::time::Duration,
    code: &crate::sandbox::AgentCode,
) -> String {
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    [
        format!("fits the voicehost:agent world, within {whose} limits"),
        format!(
            "size          {:.1} MiB of component_mib = {}",
            mib(size),
            limits.component_mib
        ),
        format!(
            "memory        {:.1} MiB initially, of memory_mib = {}",
            mib(code.least_memory_bytes()),
            limits.memory_mib
        ),
        format!(
            "compiled      {:.1} MiB in {:.1} s (the compile's bound: {} s of CPU)",
            mib(code.compiled_bytes()),
            took.as_secs_f64(),
            bounds.cpu.as_secs()
        ),
        format!(
            "pool slots    {} per call (of max_calls)",
            code.pool_slots()
        ),
    ]
    .join("\n")
}
