//! Compiling an upload in a child process under resource limits. Cranelift cannot be interrupted inside a
//! process, and a component can be built to compile for minutes or to need gigabytes while compiling: that
//! must cost its uploader a refusal, not the host its calls. The child is this host's own binary (the hidden
//! `voicehost compile-component`): it lowers its own priority and sets its limits (CPU seconds, address
//! space, file size, no core dump) before it reads the component, compiles it with the engine's settings on
//! one core, and writes the compiled form; the parent stops it at a wall-clock deadline, and checks and
//! loads what it wrote as it loads its cache (see `engine.rs`). Its environment is emptied, but it runs as
//! the host's user: it bounds what a compile costs, and is not a privilege boundary.

use super::compile_input::Wasm;
use super::guest_log::clip;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What one compile may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileBounds {
    /// CPU time of the compiling process; the wall-clock deadline is twice this (it runs at a lower
    /// priority than the calls, so a busy host slows it).
    pub cpu: Duration,
    /// Address space of the compiling process: the engine, the component and Cranelift's work together.
    pub memory_bytes: u64,
}

impl CompileBounds {
    /// The defaults: the largest agent measured (componentize-py's Python, 18 MB) compiles on one core in
    /// about 35 s of CPU with a peak of 340 MB (Cranelift is optimised in every profile).
    pub const DEFAULT: CompileBounds = CompileBounds {
        cpu: Duration::from_secs(120),
        memory_bytes: 2 << 30,
    };

    /// The wall-clock deadline: twice the CPU bound and a second.
    pub fn wall(&self) -> Duration {
        self.cpu * 2 + Duration::from_secs(1)
    }
}

/// The program a compile runs as, and its bounds.
#[derive(Debug, Clone)]
pub struct ChildCompiler {
    /// The `voicehost` binary.
    pub program: PathBuf,
    /// What one compile may cost.
    pub bounds: CompileBounds,
}

/// The subcommand the child runs; hidden from `--help`.
pub const SUBCOMMAND: &str = "compile-component";

/// How a compile in the child failed.
#[derive(Debug)]
pub(super) enum ChildFailure {
    /// The compiler refused the component: why.
    Refused(String),
    /// It went over a bound: which.
    TooCostly(String),
    /// The child could not be run, or stopped for a reason that is not the component's.
    Failed(String),
}

/// The exit code of a child whose component the compiler refused (its reason on stderr).
const REFUSED: i32 = 3;
/// The exit code of a child that ran out of address space.
const OUT_OF_MEMORY: i32 = 4;

impl ChildCompiler {
    /// Compiles `wasm` in a child process, which writes the compiled form to `output` (a new file). The
    /// child is killed when this future is dropped (an upload whose client went away) or at the deadline.
    pub(super) async fn compile(&self, wasm: &Wasm, output: &Path) -> Result<(), ChildFailure> {
        let bounds = self.bounds;
        // The child runs in `/`: it is handed absolute paths only, meaning what they mean here.
        let output = std::path::absolute(output).map_err(|e| {
            ChildFailure::Failed(format!("cannot locate {}: {e}", output.display()))
        })?;
        // A file is the child's stdin itself; bytes are fed through a pipe.
        let (stdin, bytes) = match wasm {
            Wasm::File(path) => {
                let file = std::fs::File::open(path).map_err(|e| {
                    ChildFailure::Failed(format!("cannot read {}: {e}", path.display()))
                })?;
                (Stdio::from(file), None)
            }
            Wasm::Bytes(bytes) => (Stdio::piped(), Some(bytes)),
        };
        let mut child = tokio::process::Command::new(&self.program)
            .arg(SUBCOMMAND)
            .arg("--output")
            .arg(&output)
            .arg("--cpu-seconds")
            .arg(bounds.cpu.as_secs().max(1).to_string())
            .arg("--memory-bytes")
            .arg(bounds.memory_bytes.to_string())
            .arg("--parent")
            .arg(std::process::id().to_string())
            .env_clear()
            .current_dir("/")
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                ChildFailure::Failed(format!(
                    "cannot run the compiler {}: {e}",
                    self.program.display()
                ))
            })?;
        let stdin = child.stdin.take();
        let mut stderr = child.stderr.take().expect("piped");
        let feed = async {
            // The child may stop reading (refused, or over a bound): its status says why, not the pipe.
            if let (Some(mut stdin), Some(bytes)) = (stdin, bytes) {
                let _ = stdin.write_all(bytes).await;
            }
        };
        let hear = async {
            // Read to its end (a child blocked writing would look slow), keeping the start.
            let mut said = Vec::new();
            let mut chunk = [0u8; 1024];
            while let Ok(n @ 1..) = stderr.read(&mut chunk).await {
                let room = MAX_REASON.saturating_sub(said.len());
                said.extend_from_slice(&chunk[..n.min(room)]);
            }
            said
        };
        let talk = async { tokio::join!(feed, hear).1 };
        let finished = tokio::time::timeout(bounds.wall(), async {
            let said = talk.await;
            (child.wait().await, said)
        })
        .await;
        let (status, said) = match finished {
            Ok((status, said)) => (
                status.map_err(|e| ChildFailure::Failed(format!("the compiler: {e}")))?,
                said,
            ),
            Err(_) => {
                // Killed and reaped before the answer: no compile outlives its refusal.
                let _ = child.kill().await;
                return Err(ChildFailure::TooCostly(format!(
                    "compiling it took over {} s",
                    bounds.wall().as_secs()
                )));
            }
        };
        let said = String::from_utf8_lossy(&said).trim().to_string();
        failure(status, said, &bounds).map_or(Ok(()), Err)
    }
}

/// The most of the child's stderr kept: its reason, clipped.
const MAX_REASON: usize = 4096;

/// Why a child that exited with `status` failed, if it did.
fn failure(status: ExitStatus, said: String, bounds: &CompileBounds) -> Option<ChildFailure> {
    use std::os::unix::process::ExitStatusExt as _;
    let too_slow = || {
        ChildFailure::TooCostly(format!(
            "compiling it took over {} s of CPU",
            bounds.cpu.as_secs()
        ))
    };
    let too_big = || {
        ChildFailure::TooCostly(format!(
            "compiling it needed over {} MiB",
            bounds.memory_bytes >> 20
        ))
    };
    match (status.code(), status.signal()) {
        (Some(0), _) => None,
        (Some(REFUSED), _) => Some(ChildFailure::Refused(clip(&said).to_string())),
        (Some(OUT_OF_MEMORY), _) => Some(too_big()),
        // RLIMIT_CPU's soft limit. (Its hard limit, a second later, is never reached: SIGXCPU ends the
        // process first. A SIGKILL is someone else's: the kernel's OOM killer, an operator.)
        (_, Some(SIGXCPU)) => Some(too_slow()),
        // Rust aborts when an allocation fails.
        (_, Some(SIGABRT)) if said.contains("memory allocation") => Some(too_big()),
        _ => Some(ChildFailure::Failed(format!(
            "the compiler stopped ({status}): {}",
            clip(&said)
        ))),
    }
}

const SIGABRT: i32 = 6;
const SIGXCPU: i32 = 24;

/// The child's side: `voicehost compile-component --output PATH --cpu-seconds N --memory-bytes N --parent
/// PID`, with
/// the component on stdin. Sets its limits first, then compiles; exits 0 when `output` holds the compiled
/// form, [`REFUSED`] with the compiler's reason on stderr, [`OUT_OF_MEMORY`] when it ran out of address
/// space.
pub fn child_main(output: &Path, cpu_seconds: u64, memory_bytes: u64, parent: u32) -> i32 {
    if let Err(error) = limit_self(cpu_seconds, memory_bytes, parent) {
        eprintln!("cannot set the compiler's limits: {error}");
        return 1;
    }
    let mut wasm = Vec::new();
    if let Err(error) = std::io::stdin().take(memory_bytes).read_to_end(&mut wasm) {
        eprintln!("cannot read the component: {error}");
        return 1;
    }
    let engine = match wasmtime::Engine::new(&super::compile_input::config(None)) {
        Ok(engine) => engine,
        Err(error) => return out_of_memory_or(error, 1),
    };
    let compiled = match engine.precompile_component(&wasm) {
        Ok(compiled) => compiled,
        Err(error) => return out_of_memory_or(error, REFUSED),
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(output)
        .and_then(|mut file| file.write_all(&compiled).and_then(|()| file.sync_all()));
    match written {
        Ok(()) => 0,
        Err(error) => {
            let _ = std::fs::remove_file(output);
            eprintln!("cannot write {}: {error}", output.display());
            1
        }
    }
}

/// The exit code for `error`: [`OUT_OF_MEMORY`] when it is the address space running out, else `code`
/// with the error on stderr.
fn out_of_memory_or(error: wasmtime::Error, code: i32) -> i32 {
    let out_of_memory = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::OutOfMemory)
    });
    if out_of_memory {
        return OUT_OF_MEMORY;
    }
    eprintln!("{error:#}");
    code
}

/// Dies with the host (a host killed with SIGKILL leaves no compile running), at a lower priority than the
/// calls, with the bounds as the kernel's limits on this process.
fn limit_self(cpu_seconds: u64, memory_bytes: u64, parent: u32) -> std::io::Result<()> {
    use rustix::process::{
        getppid, getpriority_process, getrlimit, set_parent_process_death_signal,
        setpriority_process, setrlimit, Resource, Rlimit,
    };
    // (The signal comes when the thread that spawned this one ends: a runtime's worker, which lives as
    // long as the host.)
    set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if getppid().map(|pid| pid.as_raw_nonzero().get() as u32) != Some(parent) {
        return Err(std::io::Error::other("the host is gone"));
    }
    // Nicer than the host, never less nice than it is (which would need a privilege).
    let nice = getpriority_process(None)?.max(10);
    if let Err(error) = setpriority_process(None, nice) {
        eprintln!("(cannot lower the compiler's priority: {error})");
    }
    // Each limit at most what the host's own hard limit allows (raising it would need a privilege); the
    // hard limit a unit above the soft one (for the CPU: SIGXCPU first, then SIGKILL).
    let limit = |resource, bound: u64| {
        let hard = getrlimit(resource).maximum.unwrap_or(u64::MAX);
        setrlimit(
            resource,
            Rlimit {
                current: Some(bound.min(hard)),
                maximum: Some(bound.saturating_add(1).min(hard)),
            },
        )
    };
    limit(Resource::Cpu, cpu_seconds)?;
    limit(Resource::As, memory_bytes)?;
    // The compiled form is never larger than what compiling it may hold.
    limit(Resource::Fsize, memory_bytes)?;
    limit(Resource::Core, 0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn signalled(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn a_child_stopped_by_its_cpu_limit_is_a_compile_too_slow_and_one_killed_is_not() {
        let bounds = CompileBounds::DEFAULT;
        match failure(signalled(SIGXCPU), String::new(), &bounds) {
            Some(ChildFailure::TooCostly(why)) => assert!(why.contains("120 s of CPU"), "{why}"),
            other => panic!("{other:?}"),
        }
        // SIGKILL: the OOM killer or an operator, not the component's fault as far as anyone knows.
        assert!(matches!(
            failure(signalled(9), String::new(), &bounds),
            Some(ChildFailure::Failed(_))
        ));
    }

    #[test]
    fn a_child_out_of_memory_is_a_compile_too_big() {
        let bounds = CompileBounds::DEFAULT;
        for (status, said) in [
            (exited(OUT_OF_MEMORY), ""),
            (
                signalled(SIGABRT),
                "memory allocation of 1048576 bytes failed",
            ),
        ] {
            match failure(status, said.into(), &bounds) {
                Some(ChildFailure::TooCostly(why)) => assert!(why.contains("2048 MiB"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_refusal_carries_the_compilers_reason_and_anything_else_is_the_hosts_failure() {
        let bounds = CompileBounds::DEFAULT;
        assert!(failure(exited(0), String::new(), &bounds).is_none());
        match failure(exited(REFUSED), "invalid section".into(), &bounds) {
            Some(ChildFailure::Refused(why)) => assert_eq!(why, "invalid section"),
            other => panic!("{other:?}"),
        }
        match failure(exited(101), "panicked".into(), &bounds) {
            Some(ChildFailure::Failed(why)) => assert!(why.contains("panicked"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
