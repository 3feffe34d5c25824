//! `voicehost test`, the real binary as an agent author's CI runs it: from another working directory with
//! relative paths, the built-in checks and the scenarios of a file, one line per test, JUnit XML, and an
//! exit code that fails the build when a test fails.

use crate::operator::BIN;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh directory named `name` holding the conformance agent as `agent.wasm` and `files`.
fn author_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let agent = voicehost_testkit::guest("conformance");
    let mut all: Vec<(&str, &[u8])> = vec![("agent.wasm", &agent)];
    all.extend(files.iter().map(|(file, text)| (*file, text.as_bytes())));
    voicehost_testkit::author_dir(&format!("agent-test-{name}"), &all)
}

fn test_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("test")
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

#[test]
fn the_conformance_agent_passes_the_checks_and_its_shipped_scenarios() {
    let scenarios = repo().join("examples/conformance/tests/scenarios.toml");
    std::fs::create_dir_all(voicehost_testkit::tmp_dir()).unwrap();
    let dir = author_dir(
        "shipped",
        &[(
            "scenarios.toml",
            &std::fs::read_to_string(scenarios).unwrap(),
        )],
    );
    let out = test_in(
        &dir,
        &[
            "--agent",
            "agent.wasm",
            "scenarios.toml",
            "--junit",
            "report.xml",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok   it survives a dropped connection"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok   saved state survives a drop and a restart"),
        "{stdout}"
    );
    assert!(stdout.ends_with("9 passed, 0 failed\n"), "{stdout}");
    let junit = std::fs::read_to_string(dir.join("report.xml")).unwrap();
    assert!(junit.contains("tests=\"9\" failures=\"0\""), "{junit}");
}

#[test]
fn a_scenario_the_agent_fails_is_named_with_why_and_the_run_exits_1() {
    let dir = author_dir(
        "fails",
        &[(
            "scenarios.toml",
            "[[scenario]]\nname = \"echoes\"\n[[scenario.turn]]\ncaller = \"echo hello\"\nsays = \"goodbye\"\n\n\
             [[scenario]]\nname = \"never panics\"\n[[scenario.turn]]\ncaller = \"panic\"\n",
        )],
    );
    let out = test_in(
        &dir,
        &[
            "--agent",
            "agent.wasm",
            "scenarios.toml",
            "--junit",
            "report.xml",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "FAIL echoes: turn 1 (\"echo hello\"): expected the agent to say \"goodbye\"; it said \"hello\""
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("FAIL never panics: the agent trapped 1 time(s) (panic)"),
        "{stdout}"
    );
    assert!(stdout.ends_with("4 passed, 2 failed\n"), "{stdout}");
    let junit = std::fs::read_to_string(dir.join("report.xml")).unwrap();
    assert!(junit.contains("tests=\"6\" failures=\"2\""), "{junit}");
    assert!(
        junit.contains("<failure message=\"turn 1 (&quot;echo hello&quot;)"),
        "{junit}"
    );
}

#[test]
fn a_scenario_file_that_cannot_be_read_tests_nothing_and_exits_2() {
    let long = format!(
        "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ncaller = \"{}\"\n",
        "x".repeat(4097)
    );
    let big_context = format!(
        "[[scenario]]\nname = \"x\"\ncontext = {{ notes = \"{}\" }}\n",
        "x".repeat(5000)
    );
    let dir = author_dir(
        "broken",
        &[
            (
                "typo.toml",
                "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ncaler = \"hi\"\n",
            ),
            (
                "two.toml",
                "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ncaller = \"hi\"\ndrop = true\n",
            ),
            ("long.toml", long.as_str()),
            (
                "keys.toml",
                "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ndtmf = \"9z\"\n",
            ),
            (
                "code.toml",
                "[[scenario]]\nname = \"x\"\n[scenario.tools]\nhold = { error = \"Busy\" }\n",
            ),
            (
                "text-audio.toml",
                "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\naudio = \"hello.wav\"\n",
            ),
            ("big-context.toml", big_context.as_str()),
            (
                "nan.toml",
                "[[scenario]]\nname = \"x\"\ncontext = { ratio = nan }\n",
            ),
            (
                "no-wav.toml",
                "[[scenario]]\nname = \"x\"\nmedia = \"audio\"\n[[scenario.turn]]\naudio = \"nothing.wav\"\n",
            ),
        ],
    );
    for (file, why) in [
        ("typo.toml", "unknown field `caler`"),
        ("two.toml", "one of caller"),
        ("long.toml", "cannot send this as the caller's turn"),
        ("keys.toml", "dtmf: \"9z\" are not keys"),
        ("code.toml", "is not a protocol error code"),
        ("text-audio.toml", "audio needs an audio call"),
        ("no-wav.toml", "cannot read nothing.wav"),
        ("big-context.toml", "Sent passes at most 4096"),
        ("nan.toml", "NaN is not a number JSON can hold"),
        ("/dev/zero", "larger than"),
    ] {
        let out = test_in(&dir, &["--agent", "agent.wasm", file]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(stderr.contains(why), "{file}: {stderr}");
        assert!(out.stdout.is_empty() || !String::from_utf8_lossy(&out.stdout).contains("passed"));
    }
}

#[test]
fn a_wav_file_is_a_callers_turn_found_beside_its_scenario_file() {
    let dir = author_dir(
        "audio",
        &[(
            "scenarios.toml",
            "[[scenario]]\nname = \"echoes what it hears\"\nmedia = \"audio\"\n\
             [[scenario.turn]]\naudio = \"hello.wav\"\nsends_audio = true\n\n\
             [[scenario]]\nname = \"keeps quiet\"\nmedia = \"audio\"\n\
             [[scenario.turn]]\naudio = \"hello.wav\"\nsilent = true\n",
        )],
    );
    // The scenarios live in tests/, beside their WAV file; the run starts from the project's root.
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::rename(dir.join("scenarios.toml"), dir.join("tests/scenarios.toml")).unwrap();
    crate::call::stereo_tone(&dir.join("tests/hello.wav"));
    let out = test_in(&dir, &["--agent", "agent.wasm", "tests/scenarios.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok   echoes what it hears"), "{stdout}");
    assert!(
        stdout.contains("FAIL keeps quiet: turn 1 (audio tests/hello.wav): expected silence"),
        "{stdout}"
    );
    assert!(stdout.ends_with("5 passed, 1 failed\n"), "{stdout}");
}

#[test]
fn mocked_origins_answer_the_agents_http_requests_and_a_request_none_answers_fails() {
    let llm = voicehost_testkit::guest("llm");
    let shipped = std::fs::read(repo().join("examples/llm/tests/scenarios.toml")).unwrap();
    let wrong = "[[scenario]]\nname = \"asks where no mock answers\"\n\
                 context = { llm_url = \"https://llm.example.com/v2/other\" }\n\
                 [[scenario.http]]\nurl = \"https://llm.example.com/v1/reply\"\njson = { reply = \"hi\" }\n\
                 [[scenario.turn]]\ncaller = \"hello\"\n\n\
                 [[scenario]]\nname = \"asks fewer times than expected\"\n\
                 context = { llm_url = \"https://llm.example.com/v1/reply\" }\n\
                 [[scenario.http]]\nurl = \"https://llm.example.com/v1/reply\"\njson = { reply = \"hi\" }\ntimes = 2\n\
                 [[scenario.turn]]\ncaller = \"hello\"\nsays = \"hi\"\n\n\
                 [[scenario]]\nname = \"asks with another body\"\n\
                 context = { llm_url = \"https://llm.example.com/v1/reply\" }\n\
                 [[scenario.http]]\nurl = \"https://llm.example.com/v1/reply\"\n\
                 request_contains = \"weather\"\njson = { reply = \"hi\" }\n\
                 [[scenario.turn]]\ncaller = \"hello\"\n";
    let dir = voicehost_testkit::author_dir(
        "agent-test-http",
        &[
            ("llm.wasm", &llm),
            ("scenarios.toml", &shipped),
            ("wrong.toml", wrong.as_bytes()),
            (
                "bad.toml",
                b"[[scenario]]\nname = \"x\"\n[[scenario.http]]\nurl = \"ftp://llm.example.com/\"\n",
            ),
        ],
    );
    let out = test_in(&dir, &["--agent", "llm.wasm", "scenarios.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok   says the model's reply"), "{stdout}");
    assert!(stdout.ends_with("7 passed, 0 failed\n"), "{stdout}");

    let out = test_in(&dir, &["--agent", "llm.wasm", "wrong.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    for failure in [
        "FAIL asks where no mock answers: HTTP: no mock answers POST https://llm.example.com/v2/other (each got 501)",
        "FAIL asks fewer times than expected: HTTP: the mock of https://llm.example.com/v1/reply (any method) was to answer 2 request(s); it answered 1",
        "FAIL asks with another body: HTTP: no mock answers POST https://llm.example.com/v1/reply",
    ] {
        assert!(stdout.contains(failure), "{failure}\n{stdout}");
    }
    assert!(stdout.ends_with("4 passed, 3 failed\n"), "{stdout}");

    let out = test_in(&dir, &["--agent", "llm.wasm", "bad.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("http mock 1: url \"ftp://llm.example.com/\""),
        "{stderr}"
    );
}

#[test]
fn a_failed_scenario_hangs_up_its_call_and_the_next_ones_run_on_their_own() {
    let dir = author_dir(
        "isolated",
        &[(
            "scenarios.toml",
            "[[scenario]]\nname = \"wrong\"\n[[scenario.turn]]\ncaller = \"echo hi\"\nsays = \"WRONG\"\n\n\
             [[scenario]]\nname = \"wrong again\"\ngreeting = { says = \"WRONG\" }\n\n\
             [[scenario]]\nname = \"right 1\"\n[[scenario.turn]]\ncaller = \"echo hi\"\nsays = \"hi\"\n\n\
             [[scenario]]\nname = \"right 2\"\n[[scenario.turn]]\ncaller = \"echo hi\"\nsays = \"hi\"\n\
             silent = false\n",
        )],
    );
    let out = test_in(&dir, &["--agent", "agent.wasm", "scenarios.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("ok   right 1"), "{stdout}");
    assert!(stdout.contains("ok   right 2"), "{stdout}");
    assert!(stdout.ends_with("6 passed, 2 failed\n"), "{stdout}");
}

#[test]
fn junit_is_never_written_over_an_input_and_a_path_it_cannot_take_is_said_before_any_test() {
    let dir = author_dir(
        "junit-paths",
        &[(
            "scenarios.toml",
            "[[scenario]]\nname = \"x\"\n[[scenario.turn]]\ncaller = \"echo hi\"\n",
        )],
    );
    for (junit, why) in [
        ("scenarios.toml", "is the input scenarios.toml"),
        ("agent.wasm", "is the input agent.wasm"),
        ("no/such/dir/report.xml", "--junit: cannot write"),
        (".", "is a directory"),
    ] {
        let out = test_in(
            &dir,
            &["--agent", "agent.wasm", "scenarios.toml", "--junit", junit],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{junit}: {stderr}");
        assert!(stderr.contains(why), "{junit}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("passed"),
            "{junit}: nothing is tested"
        );
    }
    assert!(std::fs::read_to_string(dir.join("scenarios.toml"))
        .unwrap()
        .starts_with("[[scenario]]"));
}
