//! The README's walkthroughs, run as a person types them: the shell blocks are read out of the Markdown
//! and fed, line by line, to `bash` processes (one per shell the text asks for), in a fresh temporary
//! directory with its own `$HOME`, so `~/voicehost` and every relative path mean what they mean to a
//! reader. The README changing without this test is a failure here, not a silent drift: each block is found
//! by its heading, each step by its number, and each placeholder a reader fills in (the token of step 2) by
//! its text.
//!
//! What the test does not run is the build: step 1's `cargo build --release` and `scripts/build-agents`
//! are stood in for by commands that check their arguments are the ones written, while `target/release/`
//! and `target/guests/…` of a fresh checkout hold the binaries and components this suite built already
//! (debug builds; a release build would add minutes to CI and test nothing else here).

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The ports the README's operator walkthrough names (the simulator's, the admin API's).
const README_PORTS: [u16; 2] = [8765, 7070];

/// How long one step may take before the test gives up on it (a debug build compiles the agent; the
/// author's quick start compiles a crate for wasm32-wasip2).
const STEP: Duration = Duration::from_secs(300);

/// The repository's root, where the README is.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fenced blocks of `lang` in the section under the line `heading` (up to the next heading of its level
/// or above), without their fences, and with the indentation of a block inside a list item taken off.
fn blocks_under(markdown: &str, heading: &str, lang: &str) -> Vec<String> {
    let level = heading.split(' ').next().unwrap();
    let section = markdown
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}: update this test"))
        .1;
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let hashes = line.split(' ').next().unwrap_or("");
        if !hashes.is_empty() && hashes.bytes().all(|b| b == b'#') && hashes.len() <= level.len() {
            break;
        }
        if line.trim() != format!("```{lang}") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|line| line.trim() != "```")
            .map(|line| line.get(indent..).unwrap_or("").trim_end())
            .collect();
        blocks.push(block.join("\n") + "\n");
    }
    assert!(!blocks.is_empty(), "no ```{lang} block under {heading:?}");
    blocks
}

/// The numbered steps of a block (each starts at a comment `# N. …`), in order, with their comments.
fn steps(block: &str) -> Vec<String> {
    let mut steps: Vec<String> = Vec::new();
    for line in block.lines() {
        let number = line
            .strip_prefix("# ")
            .and_then(|rest| rest.split_once(". "))
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if let Some(n) = number {
            assert_eq!(n, steps.len() + 1, "steps numbered in order: {line}");
            steps.push(String::new());
        }
        let step = steps.last_mut().expect("the block starts with step 1");
        step.push_str(line);
        step.push('\n');
    }
    steps
}

/// `text` with the placeholder a reader replaces (`from`) replaced by `to`; the placeholder must be there.
fn fill_in(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the step no longer has the placeholder {from:?}: update this test\n{text}"
    );
    text.replace(from, to)
}

/// A fresh directory: `checkout/`, as a clone of the repository looks once it is built (`target/release/`
/// holds the binaries this suite built), and `home/`, the reader's `$HOME`.
struct Fresh {
    root: PathBuf,
    /// `PATH` of a new shell: the reader's, with the build's stand-ins first once there are any.
    path: String,
}

impl Fresh {
    fn new(name: &str) -> Fresh {
        let root = std::env::temp_dir().join(format!("voicehost-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("home")).unwrap();
        let release = root.join("checkout/target/release");
        std::fs::create_dir_all(&release).unwrap();
        for (binary, package) in [("voicehost", "voicehost"), ("sentsim", "sentsim")] {
            let built = voicehost_testkit::workspace_binary(package, binary);
            std::os::unix::fs::symlink(built, release.join(binary)).unwrap();
        }
        let path = std::env::var("PATH").unwrap_or_default();
        Fresh { root, path }
    }

    fn checkout(&self) -> PathBuf {
        self.root.join("checkout")
    }

    /// The components this suite built, where `scripts/build-agents rust test-guests` puts them, and that
    /// command and step 1's `cargo build` stood in for: each checks it was called as the README writes it.
    fn with_agents_built(mut self) -> Fresh {
        let guests = self.checkout().join("target/guests/wasm32-wasip2/release");
        std::fs::create_dir_all(&guests).unwrap();
        for (program, path) in voicehost_test_programs::ALL {
            std::os::unix::fs::symlink(path, guests.join(format!("{program}.wasm"))).unwrap();
        }
        let stand_in = |path: PathBuf, args: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let command = path.file_name().unwrap().to_string_lossy().into_owned();
            std::fs::write(
                &path,
                format!(
                    "#!/bin/sh\n# Stands in for the build: the test suite built its output already.\n\
                     [ \"$*\" = \"{args}\" ] || {{ echo \"not the README's build: {command} $*\" >&2; exit 2; }}\n"
                ),
            )
            .unwrap();
            let mut permissions = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(&path, permissions).unwrap();
        };
        stand_in(
            self.root.join("stand-ins/cargo"),
            "build --release -p voicehost -p sentsim",
        );
        stand_in(
            self.checkout().join("scripts/build-agents"),
            "rust test-guests",
        );
        self.path = format!("{}:{}", self.root.join("stand-ins").display(), self.path);
        self
    }

    /// The sources an agent author builds from (`examples/`, `guest-sdk/`, `wit/`), copied, and the
    /// guests' build directory as `scripts/build-agents` left it (copied with its times, so cargo reuses
    /// the dependencies it compiled and builds only what is new).
    fn with_sources(self) -> Fresh {
        let mut copy = Command::new("cp");
        copy.arg("-a");
        for source in ["examples", "guest-sdk", "wit"] {
            copy.arg(repo().join(source));
        }
        let copied = copy.arg(self.checkout()).status().unwrap();
        assert!(copied.success(), "cp");
        let built = repo().join("target/guests");
        if built.is_dir() {
            let copied = Command::new("cp")
                .arg("-a")
                .arg(&built)
                .arg(self.checkout().join("target"))
                .status()
                .unwrap();
            assert!(copied.success(), "cp");
        }
        self
    }

    /// A new shell in `checkout/`, as a person opens one.
    fn shell(&self, name: &'static str) -> Shell {
        Shell::start(name, &self.checkout(), &self.root.join("home"), &self.path)
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One `bash` reading what the test types on its stdin, its stdout and stderr collected together. It runs
/// with `set -eo pipefail`: a command that fails ends the shell, and the test with it. Dropped, the shell
/// and everything it started (its process group) are killed.
struct Shell {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    out: Arc<Mutex<String>>,
    /// How much of `out` the test has looked at.
    seen: usize,
    steps: usize,
}

impl Shell {
    fn start(name: &'static str, dir: &Path, home: &Path, path: &str) -> Shell {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(dir)
            .env("HOME", home)
            // The reader's own cargo and rustup, wherever their home directory put them.
            .env("CARGO_HOME", cargo_home())
            .env("RUSTUP_HOME", rustup_home())
            .env("PATH", path)
            // A reader's own shell, not the test's: none of voicehost's settings leak in.
            .env_remove("VOICEHOST_TOKEN")
            .env_remove("VOICEHOST_ADMIN")
            .env_remove("VOICEHOST_CACHE_DIR")
            .env_remove("SENT_API_KEY")
            .env_remove("RUST_LOG")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bash starts");
        let out = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn({
            let out = out.clone();
            move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let mut out = out.lock().unwrap();
                    out.push_str(&line);
                    out.push('\n');
                }
            }
        });
        let stdin = child.stdin.take().unwrap();
        let mut shell = Shell {
            name,
            child,
            stdin,
            out,
            seen: 0,
            steps: 0,
        };
        shell.type_in("exec 2>&1\nset -eo pipefail\n");
        shell
    }

    fn type_in(&mut self, text: &str) {
        self.stdin
            .write_all(text.as_bytes())
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("the {} shell is gone ({e}):\n{}", self.name, self.all()));
    }

    fn all(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Types `text` and waits until every command of it has finished; returns what it printed.
    fn run(&mut self, text: &str) -> String {
        self.steps += 1;
        let marker = format!("@@ step {} done @@", self.steps);
        self.type_in(&format!("{text}\necho '{marker}'\n"));
        let printed = self.wait_for(&marker, STEP);
        printed.trim_end_matches(&marker).to_string()
    }

    /// Types `text` (a command that keeps running) and returns at once.
    fn start_command(&mut self, text: &str) {
        self.type_in(&format!("{text}\n"));
    }

    /// Waits until the shell has printed `text` since the last wait; returns what it printed until then.
    fn wait_for(&mut self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let out = self.all();
            if let Some(at) = out[self.seen..].find(text) {
                let end = self.seen + at + text.len();
                let printed = out[self.seen..end].to_string();
                self.seen = end;
                return printed;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // What it printed last may still be in the pipe.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "the {} shell ended ({status}) before {text:?}:\n{}",
                    self.name,
                    self.all()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the {} shell never printed {text:?} within {} s:\n{}",
                self.name,
                within.as_secs(),
                self.all()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ctrl-C, as a terminal sends it: SIGINT to the shell's foreground process group.
    fn interrupt(&self) {
        rustix::process::kill_process_group(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::INT,
        )
        .expect("SIGINT");
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::KILL,
        );
        let _ = self.child.wait();
    }
}

/// Where cargo keeps its registry and binaries for the one running the tests (`$CARGO_HOME`, or
/// `~/.cargo`): the shells get another `$HOME`, not another toolchain.
fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home().join(".cargo"))
}

/// rustup's home likewise (`$RUSTUP_HOME`, or `~/.rustup`).
fn rustup_home() -> PathBuf {
    std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| real_home().join(".rustup"))
}

fn real_home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").expect("the tests' HOME"))
}

/// Fails at once, saying why, when something already listens where the README's commands will.
fn readme_ports_are_free() {
    for port in README_PORTS {
        if let Err(error) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            panic!(
                "127.0.0.1:{port} is taken ({error}): the walkthrough runs on the README's own ports; stop \
                 what holds it"
            );
        }
    }
}

/// What the simulator prints when an agent broke a protocol rule (`sentsim calls`: a warning, and a count at
/// the end); its exit status does not say.
fn assert_no_violation(fresh: &Fresh, printed: &str) {
    assert!(
        !printed.contains("protocol violation"),
        "the simulator saw a protocol violation ({}):\n{printed}",
        fresh.root.display()
    );
}

/// Only one walkthrough at a time: they share the README's ports.
static PORTS: Mutex<()> = Mutex::new(());

#[test]
fn the_operators_first_ten_minutes_work_as_the_readme_writes_them() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    readme_ports_are_free();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = blocks_under(&readme, "### An operator's first ten minutes", "sh");
    let steps = steps(&blocks[0]);
    assert_eq!(
        steps.len(),
        8,
        "the walkthrough has 8 steps: update this test"
    );
    let fresh = Fresh::new("walkthrough").with_agents_built();
    let exports = steps[0]
        .lines()
        .find(|line| line.starts_with("export PATH="))
        .expect("step 1 exports PATH and AGENTS")
        .to_string();

    // The first shell: build (stood in for), a token, the config.
    let mut first = fresh.shell("first");
    let made = first.run(&format!("{}{}", steps[0], steps[1]));
    let token = made
        .lines()
        .find(|line| line.starts_with("vh_"))
        .unwrap_or_else(|| panic!("step 2 prints a token:\n{made}"))
        .to_string();
    let hash_line = made
        .lines()
        .find(|line| line.starts_with("token_sha256 = \""))
        .unwrap_or_else(|| panic!("step 2 prints the config's line:\n{made}"))
        .to_string();
    first.run(&fill_in(
        &steps[2],
        "token_sha256 = \"paste the hash from step 2\"",
        &hash_line,
    ));
    let config = fresh.root.join("home/voicehost/voicehost.toml");
    assert!(config.is_file(), "step 3 writes ~/voicehost/voicehost.toml");

    // The second shell: the simulator, which stays busy.
    let mut second = fresh.shell("second");
    second.run(&exports);
    second.start_command(&steps[3]);
    second.wait_for("waiting for agent_support to connect", STEP);

    // Back in the first: serve, relative config, relative data directory.
    first.start_command(&steps[4]);
    first.wait_for("admin API listening", STEP);

    // The third shell, as the tenant: upload and activate; the calls start.
    let mut third = fresh.shell("third");
    third.run(&exports);
    let uploaded = third.run(&fill_in(&steps[5], "vh_9c1f…", &token));
    assert!(uploaded.contains("uploaded version 1"), "{uploaded}");
    assert!(
        uploaded.contains("connecting") || uploaded.contains("serving"),
        "step 6 lists the agent as its comment says: {uploaded}"
    );
    second.wait_for("agent: Hello from the conformance agent.", STEP);
    second.wait_for("agent: hello", STEP);
    let listed = third.run("voicehost agents list");
    assert!(listed.contains("serving"), "{listed}");
    assert!(
        fresh.root.join("home/voicehost/data/components").is_dir(),
        "the data directory is beside the config"
    );

    // Metrics: the grep of step 7 finds the lines it looks for (pipefail: no match fails the step).
    let metrics = third.run(&steps[6]);
    assert!(
        metrics.contains("voicehost_sessions_started_total{"),
        "{metrics}"
    );

    // A new version, back, and the failure policy.
    let changed = third.run(&steps[7]);
    assert!(changed.contains("version 2"), "{changed}");
    let shown = third.run("voicehost agents show agent_support --json");
    let shown: serde_json::Value = serde_json::from_str(&shown).expect(&shown);
    assert_eq!(shown["active_version"], 1, "rolled back: {shown}");
    assert_eq!(shown["failure_policy"]["action"], "transfer", "{shown}");

    // Ctrl-C: serve stops, exits 0 (the shell goes on), and started again serves from the cache.
    first.interrupt();
    let stopped = first.run("echo \"serve exited $?\"");
    assert!(stopped.contains("serve exited 0"), "{stopped}");
    first.start_command(&steps[4]);
    first.wait_for("admin API listening", STEP);
    first.wait_for("serving", STEP);
    let metrics = third.run("curl -s 127.0.0.1:7070/metrics");
    assert!(
        metrics.contains("voicehost_compilations_total 0"),
        "{metrics}"
    );
    second.wait_for("agent: Hello from the conformance agent.", STEP);
    first.interrupt();
    first.run("true");
    second.interrupt();
    let ended = second.run("true");
    assert_no_violation(&fresh, &ended);
}

#[test]
fn an_agent_author_writes_builds_and_hears_a_new_agent_as_the_guide_says() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    readme_ports_are_free();
    let guide = std::fs::read_to_string(repo().join("examples/README.md")).unwrap();
    let fresh = Fresh::new("quick-start").with_sources();
    let mut first = fresh.shell("first");

    // "Writing an agent", 1: a crate in examples/, a member of its workspace, with the guide's manifest.
    first.run("cd examples && cargo new --lib my-agent && cd ..");
    let workspace = fresh.checkout().join("examples/Cargo.toml");
    let members = std::fs::read_to_string(&workspace).unwrap();
    if !members.contains("\"my-agent\"") {
        // What cargo new did not do, the reader does: add it to `members`.
        let added = fill_in(
            &members,
            "members = [\n",
            "members = [\n    \"my-agent\",\n",
        );
        std::fs::write(&workspace, added).unwrap();
    }
    let manifest_path = fresh.checkout().join("examples/my-agent/Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    let writing = "## Writing an agent";
    let wanted = &blocks_under(&guide, writing, "toml")[0];
    let manifest = manifest
        .strip_suffix("[dependencies]\n")
        .unwrap_or_else(|| panic!("cargo new's manifest ends in [dependencies]:\n{manifest}"));
    std::fs::write(&manifest_path, format!("{manifest}{wanted}")).unwrap();
    // 2: the guide's agent, as its source.
    let agent = &blocks_under(&guide, writing, "rust")[0];
    std::fs::write(fresh.checkout().join("examples/my-agent/src/lib.rs"), agent).unwrap();

    // "Building", from the repository's root.
    first.run(&blocks_under(&guide, "## Building", "sh")[0]);
    assert!(
        fresh
            .checkout()
            .join("target/guests/wasm32-wasip2/release/my_agent.wasm")
            .is_file(),
        "the component is where the guide says"
    );

    // "Running": first a call from the terminal, typed as the caller.
    let running = blocks_under(&guide, "## Running", "sh");
    assert_eq!(
        running.len(),
        3,
        "the terminal call, then a block for each shell: update this test"
    );
    first.start_command(&running[0]);
    first.wait_for("agent: Hello!", STEP);
    first.type_in("echo hello\n");
    first.wait_for("agent: echo hello", STEP);
    first.type_in("/hangup\n");
    first.wait_for("call ended: caller_hung_up", STEP);
    let called = first.run("echo \"call exited $?\"");
    assert!(called.contains("call exited 0"), "{called}");

    // Then the simulator in one shell, the agent in another; the simulator's calls end on their own.
    let mut second = fresh.shell("second");
    second.start_command(&format!("{}echo '@@ calls done @@'", running[1]));
    second.wait_for("waiting for agent_mine to connect", STEP);
    first.start_command(&running[2]);
    let calls = second.wait_for("@@ calls done @@", STEP);
    for said in ["agent: Hello!", "agent: echo hello", "agent: count"] {
        assert!(
            calls.contains(said),
            "the agent answered {said:?}:\n{calls}"
        );
    }
    assert_no_violation(&fresh, &calls);
    first.interrupt();
    let stopped = first.run("echo \"run exited $?\"");
    assert!(stopped.contains("run exited 0"), "{stopped}");
}
