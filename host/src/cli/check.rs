//! `voicehost check AGENT.wasm`: what an upload of the component would meet, offline, for an agent author
//! before uploading. The same checks as an upload of it as a first version to `serve`: the size cap, the
//! agent id, the header, validating and compiling it in a child process under `[compile]`'s bounds, the
//! `agent` world, the pool's per-component maxima, the initial memory against `memory_mib`, and the
//! tenant's quota of stored and compiled bytes; with the same codes and messages as the admin API's
//! answers. With the default limits and bounds, or a tenant's and an agent's from a `serve` config.

use crate::api::{error_code, too_large_message, views::ErrorCode};
use crate::content::Digest;
use crate::sandbox::limits::{self, ResolvedLimits};
use crate::sandbox::{ChildCompiler, CompileBounds, Limits, LoadError, Sandbox, Wasm};
use crate::tenancy::{check_agent_id, Quota, ServeConfig, ServeError, Usage};
use anyhow::{anyhow, Context as _, Result};
use std::io::Read as _;
use std::path::PathBuf;
use std::time::Instant;

/// `voicehost check`'s arguments.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// The agent's component (.wasm).
    pub component: PathBuf,
    /// A `serve` config: check against its `[compile]` bounds and a tenant's limits and quota, instead of
    /// the defaults. Its tenants' Sent keys are not read.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The tenant whose limits apply (with `--config`; its first tenant when left out).
    #[arg(long, requires = "config")]
    pub tenant: Option<String>,
    /// The agent the component would be uploaded as: its `[tenants.agents]` limits apply.
    #[arg(long, requires = "config")]
    pub agent_id: Option<String>,
}

/// What an upload would answer: its status, code and message.
#[derive(Debug)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// The error's code (`wrong_world`, …).
    pub code: &'static str,
    /// Its message.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an upload would be refused ({} {}): {}",
            self.status, self.code, self.message
        )
    }
}

impl From<ServeError> for Refused {
    fn from(error: ServeError) -> Refused {
        let code = error_code(&error);
        Refused {
            status: code.status(),
            code: code.as_str(),
            message: error.to_string(),
        }
    }
}

/// Checks the component: `Ok(Ok(what it is))` when an upload would take it, `Ok(Err(why not))` when one
/// would refuse it, `Err` when the check itself could not be made (no such file, a config that does not
/// load, the compiler failing). `compiler` is the `voicehost` binary: it compiles in a child, as `serve`
/// does.
pub async fn check(args: CheckArgs, compiler: PathBuf) -> Result<Result<String, Refused>> {
    let (limits, quota, bounds, whose) = match &args.config {
        None => (
            limits::DEFAULTS,
            Quota::DEFAULT,
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
            let whose = match &args.agent_id {
                Some(agent) => {
                    if let Err(refused) = check_agent_id(agent) {
                        return Ok(Err(refused.into()));
                    }
                    format!("tenant {:?}'s agent {agent}'s", tenant.id)
                }
                None => format!("tenant {:?}'s", tenant.id),
            };
            let agent = args.agent_id.as_deref().unwrap_or_default();
            (
                tenant.agent_limits(agent),
                tenant.quota,
                config.compile.bounds(),
                whose,
            )
        }
    };
    let path = &args.component;
    // Read up to one byte over the cap, whatever the file is (a pipe's length says nothing).
    let cap = limits.component_bytes();
    let mut wasm = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(cap.saturating_add(1)).read_to_end(&mut wasm))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let size = wasm.len() as u64;
    if size > cap {
        return Ok(Err(Refused {
            status: ErrorCode::TooLarge.status(),
            code: ErrorCode::TooLarge.as_str(),
            message: too_large_message(cap),
        }));
    }
    if wasm.is_empty() {
        return Ok(Err(Refused {
            status: ErrorCode::NotWasm.status(),
            code: ErrorCode::NotWasm.as_str(),
            message: crate::api::EMPTY_UPLOAD.into(),
        }));
    }
    let usage = |compiled_bytes| Usage {
        versions: 1,
        stored_bytes: size,
        compiled_bytes,
    };
    if let Some(why) = quota.refusal(&usage(0)) {
        return Ok(Err(ServeError::OverQuota(why).into()));
    }
    let digest = Digest::of(&wasm);
    // Compiled into a directory of its own, removed after: nothing is kept, and no shared directory is
    // touched.
    let scratch = scratch_dir()?;
    let sandbox = Sandbox::for_calls(1)?
        .with_cache(&scratch)
        .with_compiler(ChildCompiler {
            program: compiler,
            bounds,
        });
    let started = Instant::now();
    let compiled = sandbox.compile(Wasm::Bytes(wasm.into()), &digest).await;
    let took = started.elapsed();
    let _ = std::fs::remove_dir_all(&scratch);
    let code = match compiled {
        Ok(code) => code,
        Err(LoadError::Compiler(why)) => return Err(anyhow!("the compiler failed: {why}")),
        Err(error) => return Ok(Err(ServeError::Load(error).into())),
    };
    if let Some(why) = code.never_fits(&Limits::of(&limits, Default::default())) {
        return Ok(Err(ServeError::OverLimits(why).into()));
    }
    if let Some(why) = quota.refusal(&usage(code.compiled_bytes())) {
        return Ok(Err(ServeError::OverQuota(why).into()));
    }
    Ok(Ok(report(&limits, &bounds, &whose, size, took, &code)))
}

/// A new directory of this process's own under the temporary directory: made here (never one that was
/// there already), readable by its user only.
fn scratch_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir =
        std::env::temp_dir().join(format!("voicehost-check-{}-{nanos:09}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot make {}", dir.display()))?;
    Ok(dir)
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
    let world = match code.world() {
        Some(world) if world.deprecated() => format!(
            "{} (deprecated: served through an adapter; rebuild against voicehost:agent@0.3.0)",
            world.name()
        ),
        Some(world) => world.name().to_string(),
        None => "host code".to_string(),
    };
    [
        format!("fits the voicehost:agent world, within {whose} limits"),
        format!("world         {world}"),
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
