//! `voicehost check`, as an agent author runs it before uploading: from the agent's own directory, with
//! relative paths; a component an upload would take is described, one it would refuse gets the admin
//! API's code and message, and the exit code says which.

use crate::operator::BIN;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use voicehost_testkit::{Hosting, ACME_TOKEN};

fn author_dir(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    voicehost_testkit::author_dir(&format!("check-{name}"), files)
}

fn check_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("check")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// What `check` says on stderr when it refuses (exit 1), as run in `dir` with `args`.
fn refused_in(dir: &Path, args: &[&str]) -> String {
    let out = check_in(dir, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

/// A component importing interfaces the host does not provide.
fn keyvalue_component() -> Vec<u8> {
    wat::parse_str(
        "(component \
           (import \"wasi:keyvalue/store@0.2.0-draft\" (instance (export \"get\" (func)))) \
           (import \"wasi:cli/environment@0.3.0-rc-2025-09-16\" (instance (export \"get\" (func)))))",
    )
    .unwrap()
}

/// A component of the `agent` world of the WIT in `wit` (a directory, with `deps/`) with `from` replaced by
/// `to` in its `agent.wit`: every function is there, and does nothing but trap.
fn component_of_changed_wit(wit: &Path, from: &str, to: &str) -> Vec<u8> {
    component_of_wit(wit, "agent", |dir| {
        let text = std::fs::read_to_string(dir.join("agent.wit")).unwrap();
        assert!(text.contains(from), "{from:?} is not in {}", wit.display());
        std::fs::write(dir.join("agent.wit"), text.replacen(from, to, 1)).unwrap();
    })
}

/// A component of `world` in a copy of the WIT in `wit`, changed by `change` (given the copy's directory).
fn component_of_wit(wit: &Path, world: &str, change: impl FnOnce(&Path)) -> Vec<u8> {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            // `path().is_dir()` follows a link: host/wit-0.2's deps/ is one to wit/deps.
            match entry.path().is_dir() {
                true => copy(&entry.path(), &to.join(entry.file_name())),
                false => drop(std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap()),
            }
        }
    }
    static COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let copy_number = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let changed = author_dir(&format!("wit-{copy_number}"), &[]).join("wit");
    copy(wit, &changed);
    change(&changed);
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(&changed).unwrap();
    let world = resolve.select_world(&[package], Some(world)).unwrap();
    let mut module = wit_component::dummy_module(
        &resolve,
        world,
        wit_parser::ManglingAndAbi::Legacy(wit_parser::LiftLowerAbi::Sync),
    );
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_of_the_wrong_types_is_refused_at_upload_naming_the_function_and_both_types() {
    let wit = Path::new(REPO).join("wit");
    let stated = "on-session-start: func() -> result<_, string>;";
    let fits = component_of_changed_wit(&wit, stated, stated);
    let mistyped =
        component_of_changed_wit(&wit, stated, "on-session-start: func() -> result<_, u32>;");
    let hosting = Hosting::start("check-types", "").await;
    let upload = |wasm: Vec<u8>| {
        hosting.api(
            "POST",
            "/v1/agents/agent_acme/versions",
            Some(ACME_TOKEN),
            wasm,
        )
    };
    let (status, answer) = upload(mistyped.clone()).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "wrong_world");
    let message = answer["error"]["message"].as_str().unwrap().to_string();
    // The same world built apart from the host's bindings has the same types: it is taken.
    let (status, answer) = upload(fits).await;
    assert_eq!(status, 201, "{answer}");
    hosting.finish().await;
    assert!(
        message.contains(
            "voicehost:agent/handler@0.3.0: `on-session-start` is func() -> result<_, u32>, \
             where voicehost:agent@0.3.0 states func() -> result<_, string>"
        ),
        "{message}"
    );

    let dir = author_dir("types", &[("mistyped.wasm", &mistyped)]);
    let stderr = refused_in(&dir, &["mistyped.wasm"]);
    assert!(
        stderr.contains(&format!("(422 wrong_world): {message}")),
        "{message:?} not in {stderr}"
    );
}

#[test]
fn every_handler_export_of_the_worlds_version_is_checked_not_only_the_first() {
    // handler@0.3.0 fits; handler@0.3.1 (which the bindings would take: the highest 0.3.x) does not.
    let two = component_of_wit(&Path::new(REPO).join("wit"), "two", |dir| {
        let text = std::fs::read_to_string(dir.join("agent.wit")).unwrap();
        let later = text
            .replacen(
                "package voicehost:agent@0.3.0;",
                "package voicehost:agent@0.3.1;",
                1,
            )
            .replacen(
                "on-audio: func(samples: list<s16>)",
                "on-audio: func(samples: list<u8>)",
                1,
            );
        std::fs::create_dir_all(dir.join("deps/agent-0.3.1")).unwrap();
        std::fs::write(dir.join("deps/agent-0.3.1/package.wit"), later).unwrap();
        std::fs::write(
            dir.join("agent.wit"),
            text + "\nworld two { export handler; export voicehost:agent/handler@0.3.1; }\n",
        )
        .unwrap();
    });
    let dir = author_dir("types-two", &[("two.wasm", &two)]);
    let stderr = refused_in(&dir, &["two.wasm"]);
    assert!(
        stderr.contains("voicehost:agent/handler@0.3.1: `on-audio` is func(samples: list<u8>)"),
        "{stderr}"
    );
}

#[test]
fn a_huge_handler_type_is_told_in_a_bounded_message() {
    // 50 fields of 50 fields of a 10,000-character name: written whole, megabytes.
    let long = "a".repeat(10_000);
    let wide = |name: &str, ty: &str| {
        let fields: Vec<String> = (0..50).map(|i| format!("x{i}: {ty}")).collect();
        format!("record {name} {{ {} }}", fields.join(", "))
    };
    let huge = component_of_changed_wit(
        &Path::new(REPO).join("wit"),
        "on-session-start: func() -> result<_, string>;",
        &format!(
            "record r1 {{ {long}: u8 }}\n{}\n{}\non-session-start: func(x: r3) -> result<_, string>;",
            wide("r2", "r1"),
            wide("r3", "r2")
        ),
    );
    let dir = author_dir("types-huge", &[("huge.wasm", &huge)]);
    let stderr = refused_in(&dir, &["huge.wasm"]);
    assert!(
        stderr.contains("`on-session-start` is func(x: record { x0: record"),
        "{stderr}"
    );
    assert!(stderr.len() < 4_000, "{} bytes: {stderr}", stderr.len());
}

#[test]
fn a_deprecated_worlds_handler_is_checked_against_that_worlds_types() {
    let wit = Path::new(REPO).join("host/wit-0.1");
    let mistyped = component_of_changed_wit(
        &wit,
        "on-audio: func(samples: list<s16>)",
        "on-audio: func(samples: list<u8>)",
    );
    let dir = author_dir("types-0.1", &[("mistyped.wasm", &mistyped)]);
    let stderr = refused_in(&dir, &["mistyped.wasm"]);
    assert!(
        stderr.contains(
            "voicehost:agent/handler@0.1.0: `on-audio` is func(samples: list<u8>) -> result<_, string>, \
             where voicehost:agent@0.1.0 states func(samples: list<s16>) -> result<_, string>"
        ),
        "{stderr}"
    );
}

#[test]
fn a_0_2_handler_is_checked_against_that_worlds_types() {
    let wit = Path::new(REPO).join("host/wit-0.2");
    let mistyped = component_of_changed_wit(
        &wit,
        "on-audio: func(samples: list<s16>)",
        "on-audio: func(samples: list<u8>)",
    );
    let dir = author_dir("types-0.2", &[("mistyped.wasm", &mistyped)]);
    let stderr = refused_in(&dir, &["mistyped.wasm"]);
    assert!(
        stderr.contains(
            "voicehost:agent/handler@0.2.0: `on-audio` is func(samples: list<u8>) -> result<_, string>, \
             where voicehost:agent@0.2.0 states func(samples: list<s16>) -> result<_, string>"
        ),
        "{stderr}"
    );
}

#[test]
fn a_component_exporting_the_handlers_of_0_2_and_0_3_is_said_to_speak_0_3_the_one_it_is_served_in()
{
    let both = component_of_wit(&Path::new(REPO).join("wit"), "both", |dir| {
        let old = std::fs::read_to_string(Path::new(REPO).join("host/wit-0.2/agent.wit")).unwrap();
        std::fs::create_dir_all(dir.join("deps/agent-0.2.0")).unwrap();
        std::fs::write(dir.join("deps/agent-0.2.0/package.wit"), old).unwrap();
        let text = std::fs::read_to_string(dir.join("agent.wit")).unwrap();
        std::fs::write(
            dir.join("agent.wit"),
            text + "\nworld both { export handler; export voicehost:agent/handler@0.2.0; }\n",
        )
        .unwrap();
    });
    let dir = author_dir("both-worlds", &[("both.wasm", &both)]);
    let out = check_in(&dir, &["both.wasm"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("world         voicehost:agent@0.3.0\n"),
        "{stdout}"
    );
}

#[test]
fn a_component_an_upload_would_take_is_described_and_the_check_passes() {
    let dir = author_dir(
        "fits",
        &[("agent.wasm", &voicehost_testkit::guest("conformance"))],
    );
    let out = check_in(&dir, &["agent.wasm"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "fits the voicehost:agent world, within the default limits",
        "world         voicehost:agent@0.3.0\n",
        "of memory_mib = 64",
        "pool slots    1 per call",
    ] {
        assert!(stdout.contains(line), "{line:?} not in\n{stdout}");
    }
}

#[test]
fn a_component_of_0_2_is_fit_and_not_deprecated() {
    let dir = author_dir(
        "previous",
        &[("agent.wasm", &voicehost_testkit::guest("previous"))],
    );
    let out = check_in(&dir, &["agent.wasm"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("world         voicehost:agent@0.2.0\n"),
        "{stdout}"
    );
}

#[test]
fn a_component_of_the_world_before_is_fit_and_said_deprecated() {
    let dir = author_dir(
        "legacy",
        &[("agent.wasm", &voicehost_testkit::guest("legacy"))],
    );
    let out = check_in(&dir, &["agent.wasm"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("world         voicehost:agent@0.1.0 (deprecated"),
        "{stdout}"
    );
}

#[test]
fn a_core_module_is_refused_with_the_admin_apis_code_and_a_failing_exit() {
    let dir = author_dir("core", &[("agent.wasm", b"\0asm\x01\0\0\0")]);
    let stderr = refused_in(&dir, &["agent.wasm"]);
    assert!(
        stderr.contains("an upload would be refused (400 core_module)"),
        "{stderr}"
    );
}

#[test]
fn a_tenants_limits_from_a_serve_config_apply() {
    let config = "data_dir = \"data\"\n[[tenants]]\nid = \"acme\"\ntoken_sha256 = \
                  \"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\"\n\
                  api_key_file = \"missing.key\"\n[tenants.agents.agent_small.limits]\nmemory_mib = 1\n";
    let dir = author_dir(
        "config",
        &[
            ("agent.wasm", &voicehost_testkit::guest("conformance")),
            ("voicehost.toml", config.as_bytes()),
        ],
    );
    // The tenant's key file is missing: a check reads no key.
    let out = check_in(&dir, &["agent.wasm", "--config", "voicehost.toml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = refused_in(
        &dir,
        &[
            "agent.wasm",
            "--config",
            "voicehost.toml",
            "--agent-id",
            "agent_small",
        ],
    );
    assert!(
        stderr.contains("(422 over_limits): the component's initial memory is 1.1 MiB, over the agent's memory_mib = 1"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_import_the_host_does_not_provide_is_named_with_what_to_do_as_an_upload_is_told() {
    let wasm = keyvalue_component();
    let hosting = Hosting::start("check-world", "").await;
    let (status, answer) = hosting
        .api(
            "POST",
            "/v1/agents/agent_acme/versions",
            Some(ACME_TOKEN),
            wasm.clone(),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap().to_string();
    hosting.finish().await;
    for said in [
        "wasi:keyvalue/store@0.2.0-draft: no key-value store: keep a call's state with `save` and `load`",
        "wasi:cli/environment@0.3.0-rc-2025-09-16: WASI 0.3.0-rc-2025-09-16 is not linked, only WASI 0.2",
    ] {
        assert!(message.contains(said), "{said:?} not in {message}");
    }

    let dir = author_dir("world", &[("kv.wasm", &wasm)]);
    let stderr = refused_in(&dir, &["kv.wasm"]);
    assert!(
        stderr.contains(&format!("(422 wrong_world): {message}")),
        "{message:?} not in {stderr}"
    );
}

#[test]
fn what_an_upload_would_refuse_before_compiling_is_refused_and_a_check_that_cannot_run_says_so() {
    let dir = author_dir("early", &[("empty.wasm", b""), ("agent.wasm", b"\0asm")]);
    let stderr = refused_in(&dir, &["empty.wasm"]);
    assert!(
        stderr.contains("(400 not_wasm): the body is empty"),
        "{stderr}"
    );
    // A pipe's length says nothing: what is read is capped (here at 1 MiB) all the same.
    let config = "data_dir = \"data\"\n[limits]\ncomponent_mib = 1\n[[tenants]]\nid = \"acme\"\n\
                  token_sha256 = \"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\"\n\
                  api_key_env = \"UNSET\"\n";
    std::fs::write(dir.join("voicehost.toml"), config).unwrap();
    let stderr = refused_in(&dir, &["/dev/zero", "--config", "voicehost.toml"]);
    assert!(stderr.contains("(413 too_large)"), "{stderr}");
    let stderr = refused_in(
        &dir,
        &[
            "agent.wasm",
            "--config",
            "voicehost.toml",
            "--agent-id",
            "bob",
        ],
    );
    assert!(stderr.contains("(400 bad_request)"), "{stderr}");
    let out = check_in(&dir, &["missing.wasm"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_reader_that_stops_reading_the_report_is_no_failure() {
    let dir = author_dir(
        "pipe",
        &[("agent.wasm", &voicehost_testkit::guest("conformance"))],
    );
    let mut child = Command::new(BIN)
        .args(["check", "agent.wasm"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
