//! `voicehost new NAME --lang rust|js|python|c`: a new agent's project, from the example agent of its
//! language. The sources are the examples' own (`examples/`, embedded in the binary when it is built, so
//! a project is always what the repository's tests build and run), with the WIT world, the conformance
//! scenarios for `voicehost test`, a build script that writes `target/agent.wasm`, and a README.

use super::transcript::say;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};

/// `voicehost new`'s arguments.
#[derive(clap::Args)]
pub struct NewArgs {
    /// The agent's name: its directory, and its package's name (lowercase letters, digits and `-`,
    /// starting with a letter).
    #[arg(value_name = "NAME", value_parser = project_name)]
    pub name: String,
    /// The language of the agent.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// The directory the project's directory is made in.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
}

/// The languages an agent can be written in, each with its example.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust, on the guest SDK (`voicehost-agent`, carried in the project's `sdk/`).
    Rust,
    /// JavaScript, through componentize-js (StarlingMonkey) and componentize-qjs (QuickJS).
    Js,
    /// Python, through componentize-py.
    Python,
    /// C, through wit-bindgen's C bindings and clang.
    C,
}

/// A file of a project: its path in the project, its text, and whether it is a program.
struct File {
    path: &'static str,
    text: String,
    executable: bool,
}

impl File {
    fn text(path: &'static str, text: &str) -> File {
        File {
            path,
            text: text.to_string(),
            executable: false,
        }
    }

    fn program(path: &'static str, text: &str) -> File {
        File {
            executable: true,
            ..File::text(path, text)
        }
    }
}

/// The WIT package the host serves (`voicehost:agent@0.3.0`) with its dependencies as `wkg` lays them out:
/// every file of `wit/` (a test checks none is missing), and `wkg.toml`, which builds it from them.
const WIT_FILES: &[(&str, &str)] = &[
    ("wit/agent.wit", include_str!("../../../wit/agent.wit")),
    (
        "wit/deps/wasi-cli-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-cli-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-clocks-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-clocks-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-filesystem-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-filesystem-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-http-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-http-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-io-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-io-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-logging-0.1.0-draft/package.wit",
        include_str!("../../../wit/deps/wasi-logging-0.1.0-draft/package.wit"),
    ),
    (
        "wit/deps/wasi-random-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-random-0.2.12/package.wit"),
    ),
    (
        "wit/deps/wasi-sockets-0.2.12/package.wit",
        include_str!("../../../wit/deps/wasi-sockets-0.2.12/package.wit"),
    ),
    ("wkg.toml", include_str!("../../../wkg.toml")),
];
/// The conformance table as scenarios: what every example agent answers.
const SCENARIOS: &str = include_str!("../../../examples/conformance/tests/scenarios.toml");

/// Makes the project `NAME` in `--dir`; says what to do next.
pub fn new(args: NewArgs) -> Result<()> {
    let root = args.dir.join(&args.name);
    if root.exists()
        && std::fs::read_dir(&root)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} exists already (and is not an empty directory): nothing was written",
            root.display()
        );
    }
    let files = project(&args.name, args.lang);
    // Written beside it first, then renamed: a failure (a full disk) leaves nothing half-made in its
    // place.
    let partial = args
        .dir
        .join(format!(".{}.partial-{}", args.name, std::process::id()));
    let written = write(&partial, &files).and_then(|()| {
        if root.exists() {
            // An empty directory, which a rename cannot replace.
            std::fs::remove_dir(&root)?;
        }
        Ok(std::fs::rename(&partial, &root)?)
    });
    if let Err(error) = written {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(error)
            .with_context(|| format!("cannot write the project to {}", root.display()));
    }
    say(&format!(
        "made {} ({} files), a {} agent that starts as the example agent",
        root.display(),
        files.len(),
        lang_name(args.lang)
    ));
    say(&format!(
        "next: cd {} && ./build.sh && voicehost test --agent target/agent.wasm tests/scenarios.toml",
        shell_quoted(&root.display().to_string())
    ));
    say("then: voicehost call --agent target/agent.wasm (its README says more)");
    Ok(())
}

/// `text` as one word of a POSIX shell: as it is when it holds nothing the shell reads, else in single
/// quotes.
fn shell_quoted(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Writes `files` under `root`, which does not exist or is empty.
fn write(root: &Path, files: &[File]) -> Result<()> {
    for file in files {
        let path = root.join(file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, &file.text).with_context(|| format!("{}", path.display()))?;
        if file.executable {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Js => "JavaScript",
        Lang::Python => "Python",
        Lang::C => "C",
    }
}

/// Every file of the project `name` in `lang`.
fn project(name: &str, lang: Lang) -> Vec<File> {
    let mut files = vec![
        File::text("tests/scenarios.toml", &scenarios()),
        File::text("README.md", &readme(name, lang)),
    ];
    files.extend(WIT_FILES.iter().map(|(path, text)| File::text(path, text)));
    match lang {
        Lang::Rust => {
            files.extend([
                File::text("Cargo.toml", &cargo_toml(name)),
                File::text("Cargo.lock", include_str!("../../../examples/Cargo.lock")),
                File::text(
                    "src/lib.rs",
                    include_str!("../../../examples/conformance/src/lib.rs"),
                ),
                File::program(
                    "build.sh",
                    include_str!("../../../examples/conformance/build.sh"),
                ),
                File::text("sdk/Cargo.toml", &sdk_cargo_toml()),
                File::text(".gitignore", "/target\n"),
            ]);
            files.extend(
                SDK_SOURCES
                    .iter()
                    .map(|(path, text)| File::text(path, text)),
            );
        }
        Lang::Js => {
            files.extend([
                File::text("app.js", include_str!("../../../examples/js/app.js")),
                File::text(
                    "package.json",
                    &renamed(include_str!("../../../examples/js/package.json"), name),
                ),
                File::text(
                    "package-lock.json",
                    &renamed(include_str!("../../../examples/js/package-lock.json"), name),
                ),
                File::program("build.sh", include_str!("../../../examples/js/build.sh")),
                File::text(".gitignore", "/target\n/node_modules\n"),
            ]);
        }
        Lang::Python => {
            files.extend([
                File::text("app.py", include_str!("../../../examples/python/app.py")),
                File::text(
                    "requirements.txt",
                    include_str!("../../../examples/python/requirements.txt"),
                ),
                File::program(
                    "build.sh",
                    include_str!("../../../examples/python/build.sh"),
                ),
                File::text(".gitignore", "/target\n__pycache__/\n"),
            ]);
        }
        Lang::C => {
            files.extend([
                File::text("agent.c", include_str!("../../../examples/c/agent.c")),
                File::program("build.sh", include_str!("../../../examples/c/build.sh")),
                File::text(".gitignore", "/target\n"),
            ]);
        }
    }
    files
}

/// The guest SDK's sources, each file of `guest-sdk/src` (a test checks none is missing).
const SDK_SOURCES: &[(&str, &str)] = &[
    (
        "sdk/src/lib.rs",
        include_str!("../../../guest-sdk/src/lib.rs"),
    ),
    (
        "sdk/src/error.rs",
        include_str!("../../../guest-sdk/src/error.rs"),
    ),
    (
        "sdk/src/log.rs",
        include_str!("../../../guest-sdk/src/log.rs"),
    ),
    (
        "sdk/src/session.rs",
        include_str!("../../../guest-sdk/src/session.rs"),
    ),
    (
        "sdk/src/testing.rs",
        include_str!("../../../guest-sdk/src/testing.rs"),
    ),
];

/// The conformance scenarios, with a header for the project instead of the repository's.
fn scenarios() -> String {
    let body = SCENARIOS
        .lines()
        .skip_while(|line| line.starts_with('#') || line.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        "# `voicehost test --agent target/agent.wasm tests/scenarios.toml`: what the agent must answer, turn\n\
         # by turn. These are the example agent's (the protocol's conformance table): change them as the\n\
         # agent changes. The README of voicehost (\"Testing your agent\") describes every key.\n\n{body}\n"
    )
}

/// The Rust project's manifest: the agent's crate, a workspace of its own with the SDK in `sdk/`, and the
/// examples' release profile (small components).
fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
# voicehost's guest SDK, carried in sdk/ (it is not on crates.io).
voicehost-agent = {{ path = "sdk" }}

[dev-dependencies]
# `cargo test`: the agent's unit tests natively, with the SDK's stand-in for the host (sdk/src/testing.rs).
voicehost-agent = {{ path = "sdk", features = ["testing"] }}

[workspace]

[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1
"#
    )
}

/// The SDK's manifest without its place in the repository's examples workspace.
fn sdk_cargo_toml() -> String {
    include_str!("../../../guest-sdk/Cargo.toml")
        .lines()
        .filter(|line| !line.starts_with("workspace =") && !line.contains("examples workspace"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The JavaScript example's `package.json` or lockfile, with the project's name for the example's.
fn renamed(text: &str, name: &str) -> String {
    text.replace(
        "\"name\": \"voicehost-conformance-js\"",
        &format!("\"name\": \"{name}\""),
    )
}

fn readme(name: &str, lang: Lang) -> String {
    let (source, needs) = match lang {
        Lang::Rust => (
            "`src/lib.rs`, on voicehost's guest SDK in `sdk/` (its documentation: `cargo doc --open`)",
            "Rust with rustup (the script adds the `wasm32-wasip2` target)",
        ),
        Lang::Js => (
            "`app.js`",
            "Node.js 18 or later with npm (the script installs the pinned componentize-js and componentize-qjs \
             into `node_modules`; it also writes `target/agent-qjs.wasm`, the same agent on QuickJS)",
        ),
        Lang::Python => (
            "`app.py`",
            "python3 (3.9 or later) with venv and pip (the script installs the pinned componentize-py into \
             `target/tools/python-venv`)",
        ),
        Lang::C => (
            "`agent.c`",
            "Debian's clang-19, lld-19, wasi-libc and libclang-rt-19-dev-wasm32 (the script installs them with \
             apt-get, as root or through sudo) and cargo (it installs the pinned wit-bindgen and wasm-tools \
             into `target/tools`)",
        ),
    };
    format!(
        "# {name}\n\n\
         A voice agent for voicehost (the Sent Voice Agents protocol 0.2.0), in {lang}. It starts as \
         voicehost's example agent, which answers the protocol's conformance table: it greets a text call, \
         echoes `echo …`, streams `stream …`, calls the tools `dtmf`, `hold`, `transfer` and `hangup`, \
         counts the caller's turns in saved state (`count`), traps on `panic`, and echoes audio. The table is \
         at the top of {source}: make it yours from there.\n\n\
         ## Build\n\n\
         ```sh\n./build.sh          # writes target/agent.wasm\n```\n\n\
         It needs {needs}. `wit/` is the WIT package the host serves (`voicehost:agent@0.3.0`, its WASI dependencies in `wit/deps/`; `wkg build` makes a package of it).\n\n\
         ## Talk to it\n\n\
         ```sh\nvoicehost call --agent target/agent.wasm\n```\n\n\
         Type as the caller (`echo hello`); `/help` lists the commands (`/drop`, `/restart`, `/hangup`, …). \
         `--watch` takes each new build for the next call; `--audio caller.wav --audio-out agent.wav` makes it \
         an audio call.\n\n\
         ## Test it\n\n\
         ```sh\nvoicehost test --agent target/agent.wasm tests/scenarios.toml --junit report.xml\n```\n\n\
         The checks every agent must pass, then `tests/scenarios.toml`: caller turns and what the agent must \
         answer. It exits non-zero when a test fails, for CI.{unit}\n\n\
         ## Serve it\n\n\
         `voicehost check target/agent.wasm` says whether an upload would take it; then `voicehost run \
         --agent target/agent.wasm --agent-id agent_…` serves it on Sent, or `voicehost agents upload` hands \
         it to a platform's `voicehost serve`.\n",
        lang = lang_name(lang),
        unit = match lang {
            Lang::Rust => {
                "\n\n`cargo test` runs the agent's unit tests natively, without Wasm or a host: the \
                 tests at the bottom of `src/lib.rs` drive the agent through `voicehost_agent::testing::TestCall`, \
                 the SDK's stand-in for the host (`features = [\"testing\"]`, a dev-dependency)."
            }
            _ => "",
        }
    )
}

/// Rust's keywords and the names of its own crates, which cargo refuses as a package's name.
const RESERVED: &[&str] = &[
    "alloc",
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "core",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "proc-macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "struct",
    "super",
    "test",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "yield",
];

fn project_name(arg: &str) -> Result<String, String> {
    let mut chars = arg.chars();
    let fits = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !arg.ends_with('-')
        && arg.len() <= 64;
    if !fits {
        return Err(
            "1 to 64 of lowercase letters, digits and `-`, starting with a letter and not \
                    ending with `-` (it names the directory and the package)"
                .into(),
        );
    }
    Ok(arg.to_string())
}

/// Why `name` cannot name a project in `lang`, if it cannot: a Rust package may not take a keyword, the
/// name of one of Rust's own crates, or the SDK's (`sdk/` is in the project's workspace).
pub fn refused_name(name: &str, lang: Lang) -> Option<String> {
    match lang {
        Lang::Rust if RESERVED.contains(&name) => {
            Some(format!("{name} is a name Rust keeps for itself"))
        }
        Lang::Rust if name == "voicehost-agent" => Some(format!(
            "{name} is the guest SDK's name, which the project carries in sdk/"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_a_directory_and_a_package_name() {
        assert!(project_name("support-desk").is_ok());
        for bad in ["", "Desk", "1desk", "desk-", "de/sk", "../desk"] {
            assert!(project_name(bad).is_err(), "{bad:?}");
        }
        for rust_only in ["test", "voicehost-agent"] {
            assert!(refused_name(rust_only, Lang::Rust).is_some(), "{rust_only}");
            assert!(refused_name(rust_only, Lang::Js).is_none(), "{rust_only}");
        }
    }

    #[test]
    fn every_language_gets_the_wit_the_scenarios_and_an_executable_build_script() {
        for lang in [Lang::Rust, Lang::Js, Lang::Python, Lang::C] {
            let files = project("desk", lang);
            for path in [
                "wit/agent.wit",
                "tests/scenarios.toml",
                "README.md",
                "build.sh",
            ] {
                assert!(
                    files.iter().any(|f| f.path == path),
                    "{lang:?} lacks {path}"
                );
            }
            let build = files.iter().find(|f| f.path == "build.sh").unwrap();
            assert!(
                build.executable && build.text.contains("target/agent.wasm"),
                "{lang:?}"
            );
        }
    }

    #[test]
    fn the_rust_project_is_a_workspace_of_its_own_with_the_sdk_beside_it() {
        let files = project("desk", Lang::Rust);
        let text = |path: &str| &files.iter().find(|f| f.path == path).unwrap().text;
        let manifest: toml::Table = toml::from_str(text("Cargo.toml")).unwrap();
        assert_eq!(manifest["package"]["name"].as_str(), Some("desk"));
        assert!(manifest.contains_key("workspace"));
        let sdk: toml::Table = toml::from_str(text("sdk/Cargo.toml")).unwrap();
        assert!(!sdk["package"].as_table().unwrap().contains_key("workspace"));
        assert!(
            text("tests/scenarios.toml").starts_with("# `voicehost test --agent target/agent.wasm")
        );
        let scenarios: toml::Table = toml::from_str(text("tests/scenarios.toml")).unwrap();
        assert_eq!(scenarios["scenario"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn the_rust_project_carries_every_source_file_of_the_guest_sdk() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| format!("sdk/src/{}", entry.unwrap().file_name().to_string_lossy()))
            .collect();
        let mut carried: Vec<String> = SDK_SOURCES.iter().map(|(p, _)| p.to_string()).collect();
        on_disk.sort();
        carried.sort();
        assert_eq!(carried, on_disk);
    }

    #[test]
    fn a_project_carries_every_file_of_the_wit_package() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.join("wit")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let relative = path.strip_prefix(&root).unwrap();
                    on_disk.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        let mut carried: Vec<String> = WIT_FILES
            .iter()
            .map(|(p, _)| p.to_string())
            .filter(|p| p.starts_with("wit/"))
            .collect();
        on_disk.sort();
        carried.sort();
        assert_eq!(carried, on_disk);
    }

    #[test]
    fn a_path_the_shell_would_split_is_quoted() {
        assert_eq!(shell_quoted("./desk"), "./desk");
        assert_eq!(shell_quoted("sp ace/desk"), "'sp ace/desk'");
        assert_eq!(shell_quoted("it's"), "'it'\\''s'");
    }

    #[test]
    fn the_javascript_project_is_named_for_the_agent() {
        let files = project("desk", Lang::Js);
        for path in ["package.json", "package-lock.json"] {
            let text = &files.iter().find(|f| f.path == path).unwrap().text;
            assert!(text.contains("\"name\": \"desk\""), "{path}");
            assert!(!text.contains("voicehost-conformance-js"), "{path}");
        }
    }
}
