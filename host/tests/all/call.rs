//! `voicehost call`, the real binary driven through a pipe as an agent author's script would: from the
//! agent's own directory with relative paths, lines in, lines out, and the exit code saying how the call
//! went.

use crate::operator::BIN;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Long enough for a debug build beside busy processes; a call that hangs fails the test, not CI.
const DEADLINE: Duration = Duration::from_secs(90);

fn author_dir(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    voicehost_testkit::author_dir(&format!("call-{name}"), files)
}

/// A directory holding the conformance agent as `agent.wasm`.
fn conformance_dir(name: &str) -> PathBuf {
    author_dir(
        name,
        &[("agent.wasm", &voicehost_testkit::guest("conformance"))],
    )
}

/// A running `voicehost call`: its stdin, and its stdout line by line.
struct Caller {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Caller {
    fn start(dir: &Path, args: &[&str]) -> Caller {
        let mut child = Command::new(BIN)
            .arg("call")
            .args(args)
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Caller {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("input still open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for a line of the transcript that `wanted` accepts.
    fn expect(&mut self, wanted: impl Fn(&str) -> bool, what: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "waited for {what}; the transcript:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    fn expect_line(&mut self, line: &str) {
        self.expect(|l| l == line, &format!("{line:?}"));
    }

    /// Ends the input, waits for the exit; the whole transcript and the exit code.
    fn finish(mut self) -> (Vec<String>, Option<i32>, String) {
        drop(self.stdin.take());
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("did not exit; the transcript:\n{}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.seen.extend(self.lines.iter());
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
        }
        (self.seen, status.code(), stderr)
    }
}

/// Runs `voicehost call` in `dir` with `args`, the caller's `script` piped in whole.
fn call_with(dir: &Path, args: &[&str], script: &[&str]) -> (Vec<String>, Option<i32>, String) {
    let mut caller = Caller::start(dir, args);
    for line in script {
        caller.type_line(line);
    }
    caller.finish()
}

/// `lines` holds each of `wanted`, in that order (other lines between them).
fn assert_in_order(lines: &[String], wanted: &[&str]) {
    let mut at = 0;
    for want in wanted {
        match lines[at..].iter().position(|l| l == want) {
            Some(found) => at += found + 1,
            None => panic!(
                "{want:?} missing (or out of order) in the transcript:\n{}",
                lines.join("\n")
            ),
        }
    }
}

#[test]
fn a_scripted_text_call_shows_speech_streams_tool_calls_and_turn_latencies() {
    let dir = conformance_dir("text");
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &[
            "echo Hello voicehost",
            "stream Let me think",
            "dtmf 42#",
            "hangup",
        ],
    );
    assert_in_order(
        &lines,
        &[
            "agent: Hello from the conformance agent.",
            "agent: Hello voicehost",
            "agent… Let",
            "agent: me think",
            r#"tool: send_dtmf {"digits":"42#"}"#,
            "tool: send_dtmf → ok",
            "tool: hangup",
            "tool: hangup → ok",
            "call ended: agent_hung_up",
        ],
    );
    let turns = lines.iter().filter(|l| l.starts_with("turn: ")).count();
    assert_eq!(
        turns,
        5,
        "a latency per turn and the greeting:\n{}",
        lines.join("\n")
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn tool_answers_come_from_the_mock_file_and_the_agent_hears_them() {
    let dir = author_dir(
        "tools",
        &[
            ("agent.wasm", &voicehost_testkit::guest("conformance")),
            (
                "answers.toml",
                b"[tools]\nsend_dtmf = { error = \"dtmf_unsupported\" }\nhold = { refused = \"tool_not_allowed\" }\n",
            ),
        ],
    );
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm", "--tools", "answers.toml"],
        &["dtmf 1", "hold", "/hangup"],
    );
    assert_in_order(
        &lines,
        &[
            "tool: send_dtmf → error dtmf_unsupported",
            "agent: Tool failed: dtmf_unsupported",
            r#"tool: hold {"held":true}"#,
        ],
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("sent: error tool_not_allowed")),
        "{}",
        lines.join("\n")
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn restart_forces_a_trap_and_the_fresh_instance_keeps_the_saved_state() {
    let dir = conformance_dir("restart");
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &["echo one", "/restart", "count", "/hangup"],
    );
    assert_in_order(
        &lines,
        &[
            "agent: one",
            "host: the agent's instance was made to trap: a fresh instance takes over (kind=forced)",
            // The fresh instance is told why, as the world's `restart-reason`.
            "log: restarted after: forced",
            // Both utterances were counted and saved; the fresh instance reads the count back.
            "agent: utterances: 2",
            "call ended: caller_hung_up",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_dropped_connection_is_resumed_and_what_the_caller_said_meanwhile_arrives() {
    let dir = conformance_dir("drop");
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &["/drop", "echo said while the line was down", "/hangup"],
    );
    assert_in_order(
        &lines,
        &[
            "(connection 1 drops)",
            "(the call is resumed on connection 2)",
            "agent: said while the line was down",
            "call ended: caller_hung_up",
        ],
    );
    let hangups = lines.iter().filter(|l| *l == "caller: (hangs up)").count();
    assert_eq!(hangups, 1, "/hangup, then the end of the input: one hangup");
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_line_sent_cannot_send_is_refused_and_the_call_goes_on() {
    let dir = conformance_dir("long-line");
    let long = format!("echo {}", "x".repeat(5000));
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &[&long, "/dtmf 12x", "echo still here", "/hangup"],
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("not sent: Sent cannot send this as the caller's turn")),
        "{}",
        lines.join("\n")
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("/dtmf DIGITS: \"12x\" are not keys")),
        "{}",
        lines.join("\n")
    );
    assert_in_order(&lines, &["agent: still here", "call ended: caller_hung_up"]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn an_agent_the_host_gives_up_on_shows_its_trap_and_exits_1() {
    let dir = conformance_dir("gives-up");
    let (lines, code, _) = call_with(
        &dir,
        &["--agent", "agent.wasm", "--max-traps", "1"],
        &["panic"],
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("host: the agent trapped") && l.contains("kind=panic")),
        "{}",
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| l == "log: asked to panic"),
        "the guest's own panic message is a log line:\n{}",
        lines.join("\n")
    );
    assert_in_order(
        &lines,
        &[
            "host: tool hangup (the failure policy, sent for the agent)",
            "tool: hangup → ok",
            "the host gave up on the agent for this call: it applied the failure policy",
        ],
    );
    assert_eq!(code, Some(1));
}

/// A WAV file of no samples.
fn empty_wav() -> Vec<u8> {
    let mut file = std::io::Cursor::new(Vec::new());
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    hound::WavWriter::new(&mut file, spec)
        .unwrap()
        .finalize()
        .unwrap();
    file.into_inner()
}

/// 1 s of a 440 Hz tone, 8 kHz stereo.
pub fn stereo_tone(path: &Path) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 8000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..8000 {
        let t = f64::from(i) / 8000.0;
        let sample = ((t * 440.0 * std::f64::consts::TAU).sin() * 8000.0) as i16;
        writer.write_sample(sample).unwrap();
        writer.write_sample(sample).unwrap();
    }
    writer.finalize().unwrap();
}

#[test]
fn an_audio_call_plays_a_wav_of_any_rate_and_writes_the_agents_echo() {
    let dir = conformance_dir("audio");
    stereo_tone(&dir.join("caller.wav"));
    let (lines, code, stderr) = call_with(
        &dir,
        &[
            "--agent",
            "agent.wasm",
            "--audio",
            "caller.wav",
            "--audio-out",
            "agent.wav",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}\n{}", lines.join("\n"));
    let echo = hound::WavReader::open(dir.join("agent.wav")).unwrap();
    assert_eq!(
        (echo.spec().channels, echo.spec().sample_rate),
        (1, 16000),
        "mono at the call's rate"
    );
    // The whole second, resampled to 16 kHz, echoed back.
    assert_eq!(echo.duration(), 16000, "{}", lines.join("\n"));
}

#[test]
fn the_callers_keys_reach_the_agent_as_a_frame_of_a_later_version() {
    let dir = author_dir(
        "dtmf",
        &[("agent.wasm", &voicehost_testkit::guest("prober"))],
    );
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm", "--audio-out", "agent.wav"],
        &["/dtmf 1#"],
    );
    assert_eq!(code, Some(0), "{stderr}\n{}", lines.join("\n"));
    // The prober answers any frame it does not know with 20 ms of audio.
    let heard = hound::WavReader::open(dir.join("agent.wav")).unwrap();
    assert_eq!(heard.duration(), 320, "{}", lines.join("\n"));
}

#[test]
fn watch_gives_the_next_call_the_new_build_and_keeps_the_last_good_one() {
    let dir = conformance_dir("watch");
    let mut caller = Caller::start(&dir, &["--agent", "agent.wasm", "--watch"]);
    caller.expect_line("agent: Hello from the conformance agent.");
    caller.type_line("/hangup");
    caller.expect(
        |l| l.starts_with("Enter starts the next call"),
        "the prompt for the next call",
    );
    // A new build, written the way build tools do: to a temporary file, then renamed over the old.
    std::fs::write(dir.join("agent.tmp"), voicehost_testkit::guest("panicker")).unwrap();
    std::fs::rename(dir.join("agent.tmp"), dir.join("agent.wasm")).unwrap();
    caller.expect_line("build 2 loaded: the next call gets it (a live call keeps its own)");
    std::fs::write(dir.join("agent.wasm"), b"not a component").unwrap();
    caller.expect(
        |l| l.starts_with("the changed file cannot serve, so the next call keeps build 2"),
        "the broken build refused",
    );
    caller.type_line("");
    caller.expect_line("agent: Hello from the panicker.");
    let (_, code, stderr) = caller.finish();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn what_cannot_start_a_call_exits_2_saying_why() {
    let big_context = format!("{{\"notes\":\"{}\"}}", "x".repeat(5000));
    let dir = author_dir(
        "refused",
        &[
            ("agent.wasm", &voicehost_testkit::guest("conformance")),
            ("text.wasm", b"not a component"),
            ("empty.wav", &empty_wav()),
            (
                "answers.toml",
                b"[tools]\nhold = { error = \"Not A Code\" }\n",
            ),
            ("precious.txt", b"precious"),
        ],
    );
    for (args, why) in [
        (
            vec!["--agent", "text.wasm"],
            "text.wasm cannot serve as an agent",
        ),
        (vec!["--agent", "missing.wasm"], "cannot read missing.wasm"),
        (
            vec!["--agent", "agent.wasm", "--tools", "answers.toml"],
            "is not a protocol error code",
        ),
        (
            vec!["--agent", "agent.wasm", "--audio", "missing.wav"],
            "--audio: cannot read missing.wav",
        ),
        (
            vec!["--agent", "agent.wasm", "--context", "[1]"],
            "a JSON object",
        ),
        (
            vec!["--agent", "agent.wasm", "--from", "12345"],
            "not a party Sent sends",
        ),
        (
            vec!["--agent", "agent.wasm", "--to", "pigeon loft:1"],
            "not a party Sent sends",
        ),
        (
            vec!["--agent", "agent.wasm", "--audio", "empty.wav"],
            "holds no audio",
        ),
        (
            vec![
                "--agent",
                "agent.wasm",
                "--audio-out",
                "no/such/dir/agent.wav",
            ],
            "--audio-out: cannot write",
        ),
        (
            vec!["--agent", "agent.wasm", "--memory-mib", "1"],
            "initial memory",
        ),
        (
            vec![
                "--agent",
                "agent.wasm",
                "--memory-mib",
                "1",
                "--audio-out",
                "precious.txt",
            ],
            "initial memory",
        ),
        (
            vec!["--agent", "agent.wasm", "--audio-out", "agent.wasm"],
            "is the input agent.wasm",
        ),
        (vec!["--agent", "/dev/zero"], "larger than"),
        (
            vec!["--agent", "agent.wasm", "--context", &big_context],
            "Sent passes at most 4096",
        ),
    ] {
        let (_, code, stderr) = call_with(&dir, &args, &[]);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
    }
    // A call that could not start wrote nothing: not over the file named for the agent's audio either.
    assert_eq!(
        std::fs::read(dir.join("precious.txt")).unwrap(),
        b"precious"
    );
}

#[test]
fn a_component_of_0_2_is_called_through_its_adapter_and_told_of_a_restart_in_its_own_words() {
    let dir = author_dir(
        "previous",
        &[("agent.wasm", &voicehost_testkit::guest("previous"))],
    );
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &["echo old", "/restart", "echo again", "/hangup"],
    );
    assert_in_order(
        &lines,
        &[
            "agent: Hello from a 0.2.0 agent.",
            "agent: old",
            "agent: restarted after forced",
            "agent: again",
            "call ended: caller_hung_up",
        ],
    );
    assert!(
        !lines.iter().any(|l| l.contains("deprecated")),
        "0.2.0 is served, not deprecated: {lines:?}"
    );
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_component_of_the_world_before_is_called_through_the_adapter_and_said_deprecated() {
    let dir = author_dir(
        "legacy",
        &[("agent.wasm", &voicehost_testkit::guest("legacy"))],
    );
    let (lines, code, stderr) = call_with(
        &dir,
        &["--agent", "agent.wasm"],
        &["echo old", "/restart", "/hangup"],
    );
    assert_in_order(
        &lines,
        &[
            "(it speaks voicehost:agent@0.1.0, deprecated: served through an adapter; rebuild it against voicehost:agent@0.3.0)",
            "agent: Hello from a 0.1.0 agent.",
            "agent: old",
            // 0.1.0 named the reason as a string: the trap kind's.
            "agent: restarted after forced",
            "call ended: caller_hung_up",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
}
