//! The `voicehost` binary: `serve` hosts many tenants' agents with the admin API; `agents` and `token` are
//! the operator's tools for it; `run` serves one agent's calls from a file.

use anyhow::{anyhow, Context as _, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use voicehost::agent::Dial;
use voicehost::agent::{self, Admission, AgentConfig};
use voicehost::api;
use voicehost::cli;
use voicehost::sandbox::budget::Budget;
use voicehost::sandbox::compiler;
use voicehost::sandbox::limits;
use voicehost::sandbox::Sandbox;
use voicehost::stats::Stats;
use voicehost::tenancy::ServeConfig;
use voicehost::tenancy::Tenancy;
use voicehost::tls::ServerCert;

#[derive(Parser)]
#[command(
    name = "voicehost",
    version,
    about = "Serves Sent voice agent calls with sandboxed WebAssembly agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Host every tenant's active agents and the admin API, as voicehost.toml says, until SIGINT or SIGTERM.
    Serve {
        /// The config file (see the README's "Hosting many tenants").
        #[arg(long, default_value = "voicehost.toml", value_parser = absolute)]
        config: PathBuf,
    },
    /// Manage a tenant's agents through the admin API of a running `voicehost serve`.
    Agents(cli::AgentsArgs),
    /// Make or hash a tenant's admin token for the config.
    #[command(subcommand)]
    Token(cli::TokenCommand),
    /// Serve one agent's calls until SIGINT or SIGTERM. The API key comes from SENT_API_KEY or --api-key-file.
    Run(RunArgs),
    /// Start a new agent: a project in Rust, JavaScript, Python or C made from the example agent of that
    /// language, with its build script, the WIT world, scenarios for `voicehost test` and a README.
    New(cli::NewArgs),
    /// Call your agent from the terminal: the embedded Sent simulator and the host of `run` on loopback.
    /// Type as the caller (/help for commands); lines in, lines out, so a pipe drives it too. Exits 0 when
    /// the call ended as calls do, 1 when the host gave up on the agent (its failure policy), lost the
    /// call or saw it break the protocol, 2 when nothing could start.
    Call(cli::CallArgs),
    /// Test your agent, for CI: the checks every agent must pass (it starts and ends cleanly, survives a
    /// dropped connection and a forced restart, keeps up with audio), then the scenarios of TOML files.
    /// One line per test; exits 0 when all pass, 1 when one fails, 2 when nothing could be tested.
    Test(cli::TestArgs),
    /// Check a component as an upload would, offline: the world, the pool's maxima, the initial memory,
    /// the compile's cost, the quota. Exits 1, saying why (the admin API's code and message), when an
    /// upload would be refused; 2 when the check could not be made.
    Check(cli::CheckArgs),
    /// Compile a component from stdin under limits (what `serve` runs for each upload; not for people).
    #[command(name = "compile-component", hide = true)]
    CompileComponent {
        #[arg(long)]
        output: PathBuf,
        #[arg(long)]
        cpu_seconds: u64,
        #[arg(long)]
        memory_bytes: u64,
        #[arg(long)]
        parent: u32,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The agent's component (.wasm), compiled on this host.
    #[arg(long, value_parser = absolute)]
    agent: PathBuf,
    /// The agent as Sent knows it: agent_…
    #[arg(long)]
    agent_id: String,
    /// Sent's connect endpoint.
    #[arg(long, default_value = agent::SENT_URL)]
    url: String,
    /// A file holding the API key (instead of the SENT_API_KEY environment variable).
    #[arg(long, value_parser = absolute)]
    api_key_file: Option<PathBuf>,
    /// Where to keep compiled components by content hash, so a restart does not compile again.
    #[arg(long, env = "VOICEHOST_CACHE_DIR", value_parser = absolute)]
    cache_dir: Option<PathBuf>,
    /// Connections to hold at once.
    #[arg(long, default_value_t = limits::CONNECTIONS)]
    connections: usize,
    /// Live calls at once: the size of the instance pool (each call reserves address space, see the
    /// README's limits). A call past it gets the failure policy.
    #[arg(long, default_value_t = limits::MAX_CALLS)]
    max_calls: usize,
    /// The guests' linear memory across every call, in MiB: a growth past it traps the instance
    /// (`host_memory`). Default: three quarters of the memory this process may use.
    #[arg(long)]
    guest_memory_mib: Option<u64>,
    #[command(flatten)]
    limits: cli::RunLimits,
}

/// A path from the command line, made absolute against the directory `voicehost` was started in, once:
/// what it names no longer depends on where a child (the compiler runs in `/`) or a reload looks.
fn absolute(arg: &str) -> Result<PathBuf, String> {
    if arg.is_empty() {
        return Err("an empty path (from the flag, or its environment variable set empty)".into());
    }
    if arg.starts_with('~') {
        // A shell expands `~` in a word of its own; in `--flag=~/x` or a variable it arrives as is.
        return Err(format!(
            "{arg}: `~` is not expanded here; write the path in full"
        ));
    }
    std::path::absolute(arg).map_err(|e| format!("cannot locate {arg}: {e}"))
}

fn main() {
    let command = match Cli::parse().command {
        // Before anything else (no runtime, no log): the child only compiles.
        Command::CompileComponent {
            output,
            cpu_seconds,
            memory_bytes,
            parent,
        } => std::process::exit(compiler::child_main(
            &output,
            cpu_seconds,
            memory_bytes,
            parent,
        )),
        command => command,
    };
    if let Err(error) = start(command) {
        // The cause chain, without a backtrace: a refusal or a bad component is the user's to fix.
        eprintln!("voicehost: {error:#}");
        std::process::exit(1);
    }
}

fn start(command: Command) -> Result<()> {
    if matches!(command, Command::Call(_)) {
        cli::init_call_log();
    } else if matches!(command, Command::Test(_)) {
        // Its report is stdout's, and says what failed; the host's own log only with RUST_LOG.
        voicehost::logging::init("off");
    } else {
        voicehost::logging::init(voicehost::logging::DEFAULT);
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let result = match command {
        Command::Test(args) => {
            let code = match runtime.block_on(cli::test(args)) {
                Ok(tally) if tally.failed == 0 => 0,
                Ok(_) => 1,
                Err(error) => {
                    eprintln!("voicehost: {error:#}");
                    2
                }
            };
            runtime.shutdown_timeout(EXIT_GRACE);
            std::process::exit(code);
        }
        Command::Call(args) => {
            let code = match runtime.block_on(cli::call(args)) {
                Ok(cli::Verdict::Ended) => 0,
                Ok(cli::Verdict::AgentFailed) => 1,
                Err(error) => {
                    eprintln!("voicehost: {error:#}");
                    2
                }
            };
            // Everything is done (the host stopped, the audio written): what is left is a read of a
            // terminal's stdin, which only a keypress would end. Not waited for.
            runtime.shutdown_background();
            std::process::exit(code);
        }
        Command::Serve { config } => runtime.block_on(serve(&config)),
        Command::Agents(args) => runtime.block_on(cli::run(args)),
        Command::Token(command) => cli::token(command),
        Command::New(args) => {
            // A name the language refuses is a wrong argument, as clap's are: 2.
            if let Some(why) = cli::refused_name(&args.name, args.lang) {
                eprintln!("voicehost: {why}");
                std::process::exit(2);
            }
            cli::new(args)
        }
        Command::Run(args) => runtime.block_on(run(args)),
        Command::Check(args) => {
            match runtime.block_on(cli::check(args, PathBuf::from("/proc/self/exe"))) {
                Ok(Ok(report)) => {
                    // A reader that stopped reading (`| head`) is not an error of the check.
                    use std::io::Write as _;
                    let _ = writeln!(std::io::stdout(), "{report}");
                    Ok(())
                }
                // Refused: 1; the check could not be made: 2 (below).
                Ok(Err(refused)) => {
                    runtime.shutdown_timeout(EXIT_GRACE);
                    eprintln!("voicehost: {refused}");
                    std::process::exit(1);
                }
                Err(error) => {
                    runtime.shutdown_timeout(EXIT_GRACE);
                    eprintln!("voicehost: {error:#}");
                    std::process::exit(2);
                }
            }
        }
        Command::CompileComponent { .. } => Ok(()),
    };
    // What is still running (a compile's blocking work, a slow client) does not hold up the exit.
    runtime.shutdown_timeout(EXIT_GRACE);
    result
}

/// How long the exit waits for the runtime's last tasks, after `serve` or `run` returned.
const EXIT_GRACE: Duration = Duration::from_secs(2);

async fn run(args: RunArgs) -> Result<()> {
    // The flags first: a wrong one is said before any file is read.
    limits::check_max_calls(args.max_calls).map_err(|e| anyhow!("--max-calls {}", e.problem))?;
    let guest_memory_mib = args
        .guest_memory_mib
        .unwrap_or_else(limits::default_guest_memory_mib);
    limits::check_guest_memory_mib(guest_memory_mib)
        .map_err(|e| anyhow!("--guest-memory-mib {}", e.problem))?;
    let mut rules = args.limits.rules()?;
    // Every byte of the guests' linear memory is taken from it, as `serve`'s tenants' is.
    rules.limits.host_memory = Some(Budget::new(guest_memory_mib << 20).part(&args.agent_id));
    let api_key = match &args.api_key_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the API key from {}", path.display()))?
            .trim()
            .to_string(),
        None => std::env::var("SENT_API_KEY")
            .context("no API key: set SENT_API_KEY or pass --api-key-file")?,
    };
    let wasm = std::fs::read(&args.agent)
        .with_context(|| format!("cannot read {}", args.agent.display()))?;
    let mut sandbox = Sandbox::for_calls(args.max_calls)?;
    if let Some(dir) = &args.cache_dir {
        // Said now, not as a warning at the first compile.
        voicehost::content::ensure_writable(dir)
            .with_context(|| format!("--cache-dir: cannot write in {}", dir.display()))?;
        sandbox = sandbox.with_cache(dir);
    }
    let code = sandbox
        .load(&wasm)
        .with_context(|| format!("{} cannot serve as an agent", args.agent.display()))?;
    if let Some(world) = code.world().filter(|w| w.deprecated()) {
        tracing::warn!(
            world = world.name(),
            "the agent speaks a deprecated world, served through an adapter: rebuild it against voicehost:agent@0.3.0"
        );
    }
    let config = AgentConfig {
        // The pool's slots, one agent's alone (a call of a component with many memories takes more).
        admission: Admission::new(Vec::new())
            .with_slots(Budget::new(args.max_calls as u64).part(&args.agent_id)),
        ..AgentConfig::fixed(
            Dial::new(args.url, args.agent_id, api_key),
            code,
            rules,
            args.connections,
        )
    };
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping: closing every connection");
        let _ = stop.send(true);
    });
    let stats = Arc::new(Stats::default());
    let result = agent::serve(config, stats.clone(), stopped).await;
    tracing::info!("served:\n{stats}");
    result.context("Sent refused the agent")?;
    Ok(())
}

async fn serve(path: &std::path::Path) -> Result<()> {
    let config = ServeConfig::read(path)?;
    raise_descriptor_limit();
    // Uploads compile in children of this very binary (the running one, even after a package upgrade
    // replaced the file), under `[compile]`'s bounds.
    let tenancy = Tenancy::open(&config, Some(PathBuf::from("/proc/self/exe")))?;
    let tls = match config.admin.tls() {
        Some(files) => Some(ServerCert::load(files).context("the admin API's certificate")?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.admin.listen)
        .await
        .with_context(|| format!("the admin API cannot listen on {}", config.admin.listen))?;
    match &tls {
        Some(cert) => tracing::info!(
            addr = %listener.local_addr()?,
            cert = %cert.files().cert.display(),
            "admin API listening: HTTPS (the certificate is read again on SIGHUP)"
        ),
        None => tracing::info!(
            addr = %listener.local_addr()?,
            "admin API listening: plain HTTP, on loopback only"
        ),
    }
    let (stop, mut stopped) = watch::channel(false);
    let api = api::start_serving(&tenancy, listener, &config.admin, tls.clone(), async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    })
    .await;
    serve_until_stopped(&tenancy, tls.as_deref(), path).await;
    if let Some(cluster) = &config.cluster {
        // A second signal still exits at once, while calls are handed over too.
        let second = tokio::spawn(async {
            shutdown_signal().await;
            tracing::warn!("a second signal: exiting at once");
            std::process::exit(130);
        });
        tenancy
            .leave(Duration::from_secs(cluster.leave_seconds))
            .await;
        second.abort();
    }
    tracing::info!(
        grace_s = SHUTDOWN_GRACE.as_secs(),
        "stopping: closing every connection with 1000 (a second SIGINT or SIGTERM exits at once)"
    );
    tokio::spawn(async {
        shutdown_signal().await;
        tracing::warn!("a second signal: exiting at once");
        std::process::exit(130);
    });
    let _ = stop.send(true);
    let stopped = tokio::time::timeout(SHUTDOWN_GRACE, async {
        tenancy.shutdown().await;
        let _ = api.await;
    })
    .await;
    match stopped {
        Ok(()) => tracing::info!("stopped"),
        // What is left (a compile in progress, a slow admin client) is abandoned: the registry's files are
        // written whole or not at all, so nothing half-done is kept.
        Err(_) => tracing::warn!(
            grace_s = SHUTDOWN_GRACE.as_secs(),
            "not everything stopped within the grace period: exiting anyway"
        ),
    }
    Ok(())
}

/// Raises this process's limit on open files to its hard limit: calls, connections to Sent and the admin
/// listener share it, and the admin side is capped well below it (`[admin] max_connections`).
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(%error, "cannot raise the limit on open files");
        }
    }
    let limit = getrlimit(Resource::Nofile);
    tracing::info!(open_files = ?limit.current, "limit on open files");
}

/// How long `serve` waits, after SIGINT or SIGTERM, for its connections to close and the admin API's
/// requests to finish, before it exits anyway (with 0: stopping was asked for).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Waits for SIGINT or SIGTERM; on SIGHUP, reloads the config and the admin API's certificate (a config or
/// certificate that does not load is logged and changes nothing of its own).
async fn serve_until_stopped(
    tenancy: &Arc<Tenancy>,
    tls: Option<&ServerCert>,
    path: &std::path::Path,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut hangups) = signal(SignalKind::hangup()) {
            let stop = shutdown_signal();
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = hangups.recv() => {
                        let config = match ServeConfig::read(path) {
                            Ok(config) => config,
                            Err(error) => {
                                tracing::error!(error = %format!("{error:#}"), "the config was not reloaded: its tenants and limits are unchanged");
                                // A renewed certificate is still taken, from the files already named.
                                if let Some(cert) = tls {
                                    reload_certificate(cert, Some(cert.files()));
                                }
                                continue;
                            }
                        };
                        if let Err(error) = tenancy.reload(&config).await {
                            tracing::error!(error = %format!("{error:#}"), "the config was not reloaded: its tenants and limits are unchanged");
                        }
                        match tls {
                            Some(cert) => reload_certificate(cert, config.admin.tls()),
                            None if config.admin.tls().is_some() => tracing::warn!(
                                "the config now gives admin.tls_cert and tls_key: the admin API serves TLS from the next restart"
                            ),
                            None => {}
                        }
                    }
                }
            }
        }
    }
    shutdown_signal().await;
}

/// Serves the certificate in `files` from the next handshake on; logs why not if it cannot. TLS cannot be
/// turned off, nor on, without a restart.
fn reload_certificate(cert: &ServerCert, files: Option<voicehost::tls::CertFiles>) {
    let Some(files) = files else {
        tracing::error!("the config no longer gives admin.tls_cert and tls_key: the admin API stays in TLS with its certificate until a restart");
        return;
    };
    match cert.reload(files) {
        Ok(()) => {
            tracing::info!(cert = %cert.files().cert.display(), "the admin API's certificate is reloaded")
        }
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "the admin API's certificate was not reloaded: it serves the one it had")
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = interrupt => {}
                _ = terminate.recv() => {}
            }
            return;
        }
    }
    let _ = interrupt.await;
}
