//! A test guest for voicehost's pressure scenarios (`tests/sentsim/src/pressure.rs`): it sends audio of its
//! own, floods the host with audio or speech, and sends more audio at once than a message may carry, so
//! that Sent can check the host's bounds from its side of the wire.
//!
//! An audio call takes its command from the call's `context` (`{"prober": "flood 2000"}`); a text call
//! takes commands as utterances.
//!
//! | trigger | action |
//! |---|---|
//! | session start of a text call | say "Hello from the prober." |
//! | audio, no command or "echo" | send the same samples back |
//! | audio, command "flood N" | send N × 20 ms of the call's pattern, one `send-audio` each |
//! | audio, command "big MS" | send MS milliseconds of the call's pattern in one `send-audio` |
//! | audio, command "spin MS" | spin the CPU for MS milliseconds of wall time (under the CPU deadline, it is never stopped) |
//! | audio, command "log N" | log N lines (the host drops past its rate and counts them) |
//! | audio, command "grow KIB" | allocate KIB KiB and keep it (until the memory cap traps the instance; three traps and the call gets its failure policy) |
//! | any session frame of an unknown type | send 20 ms of the call's pattern (audio calls) |
//! | "echo <text>" | say `<text>` |
//! | "later MS <text>" | wait MS milliseconds of wall time (a host call: no CPU), then say `<text>` |
//! | "say N CHARS" | say N utterances of CHARS characters each, numbered from `000000`, without stopping at a refusal; then log how many were refused |
//! | "say N CHARS TAG" | the same, each utterance starting with `TAG` before its number (`b000003 xxx…`), still CHARS characters in all |
//! | "wait MS" | wait MS milliseconds of wall time (a host call: no CPU) |
//! | "fail" | return an error from the handler |
//! | "tool NAME" | use the tool NAME with no arguments and wait for its answer (whatever it is, the next command runs) |
//! | "transfer NUMBER" | use the transfer tool to the number (`{"kind":"number","value":NUMBER}`) and wait for its answer |
//! | "report" | say "accepted TAG:N …": for each "say" of the instance so far, in order, its tag (`-` for none) and how many of its utterances the host took |
//! | "A ; B ; …" | run the commands A, B, … in order in one handler call (a refusal of one does not stop the next) |
//! | any other text | nothing |
//!
//! The call's pattern: the bytes of `"<session_id>;"` repeated, as 16-bit little-endian samples, so that
//! Sent can tell whose audio a message carries whatever stream number it arrives under.

use voicehost_agent::{export_agent, log, Agent, Error, Media, Session, UnknownFrame, UserSaid};

/// What the prober says first in a text call.
pub const GREETING: &str = "Hello from the prober.";

/// The key of the command in the call's context.
pub const COMMAND_KEY: &str = "prober";

/// The prober; it keeps nothing in memory but what "grow" asks it to.
#[derive(Default)]
pub struct Prober;

thread_local! {
    /// What "grow" keeps, for the life of the instance.
    static KEPT: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each "say" of the instance: its tag, and how many of its utterances the host took.
    static BURSTS: std::cell::RefCell<Vec<(String, u32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The call's audio command from its context ("echo" when there is none).
fn command(session: &Session) -> String {
    session
        .info()
        .context
        .and_then(|context| {
            voicehost_agent::serde_json::from_str::<voicehost_agent::serde_json::Value>(&context)
                .ok()
        })
        .and_then(|context| context.get(COMMAND_KEY)?.as_str().map(str::to_string))
        .unwrap_or_else(|| "echo".into())
}

/// `ms` milliseconds of the call's pattern at its sample rate (nothing on a text call).
fn pattern(session: &Session, ms: u32) -> Vec<i16> {
    let info = session.info();
    let Some(rate) = info.media.sample_rate() else {
        return Vec::new();
    };
    let samples = (rate as usize * ms as usize) / 1000;
    let unit = format!("{};", info.session_id).into_bytes();
    let bytes: Vec<u8> = unit.iter().copied().cycle().take(samples * 2).collect();
    bytes
        .chunks_exact(2)
        .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
        .collect()
}

/// The number after a command word, 0 when there is none.
fn number(word: Option<&str>) -> u32 {
    word.and_then(|w| w.parse().ok()).unwrap_or(0)
}

/// One text command (see the table above).
fn run_command(session: &Session, text: &str) -> Result<(), Error> {
    let mut words = text.split(' ');
    match words.next() {
        Some("echo") => {
            let rest = text.split_once(' ').map_or("", |(_, rest)| rest);
            session.say(rest)?;
        }
        Some("later") => {
            let ms = number(words.next());
            let rest: Vec<&str> = words.collect();
            std::thread::sleep(std::time::Duration::from_millis(ms.into()));
            session.say(&rest.join(" "))?;
        }
        Some("wait") => {
            let ms = number(words.next());
            std::thread::sleep(std::time::Duration::from_millis(ms.into()));
        }
        Some("fail") => return Err("failing on purpose".into()),
        Some("say") => {
            let (count, chars) = (number(words.next()), number(words.next()) as usize);
            let tag = words.next().unwrap_or_default();
            let filler = chars.saturating_sub(7 + tag.len()).max(1);
            let mut refused = 0;
            for n in 0..count {
                let text = format!("{tag}{n:06} {}", "x".repeat(filler));
                if session.say(&text).is_err() {
                    refused += 1;
                }
            }
            let tag = if tag.is_empty() { "-" } else { tag };
            BURSTS.with(|bursts| bursts.borrow_mut().push((tag.into(), count - refused)));
            log::info!("said {count} utterances, {refused} refused");
        }
        Some("tool") => {
            let name = words.next().unwrap_or_default();
            let result = session.tool(name, None)?;
            log::info!("tool {name}: ok {}", result.outcome.is_ok());
        }
        Some("transfer") => {
            let number = words.next().unwrap_or_default();
            let result = session.transfer_number(number)?;
            log::info!("transfer to {number}: ok {}", result.outcome.is_ok());
        }
        Some("report") => {
            let report = BURSTS.with(|bursts| {
                bursts
                    .borrow()
                    .iter()
                    .map(|(tag, took)| format!(" {tag}:{took}"))
                    .collect::<String>()
            });
            session.say(&format!("accepted{report}"))?;
        }
        _ => {}
    }
    Ok(())
}

impl Agent for Prober {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        if session.info().media == Media::Text {
            session.say(GREETING)?;
        }
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        // Several commands in one utterance run in order; the first refusal is the handler's error.
        let mut failed = Ok(());
        for command in said.text.split(" ; ") {
            if let Err(error) = run_command(session, command) {
                log::warn!("{command}: {error}");
                failed = failed.and(Err(error));
            }
        }
        failed
    }

    fn on_audio(&self, session: &Session, samples: Vec<i16>) -> Result<(), Error> {
        let command = command(session);
        let mut words = command.split(' ');
        match words.next() {
            Some("flood") => {
                let frame = pattern(session, 20);
                for _ in 0..number(words.next()) {
                    session.send_audio(&frame);
                }
            }
            Some("big") => session.send_audio(&pattern(session, number(words.next()))),
            Some("spin") => {
                let until = std::time::Duration::from_millis(number(words.next()).into());
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while started.elapsed() < until {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            Some("log") => {
                for n in 0..number(words.next()) {
                    log::info!("line {n}");
                }
            }
            Some("grow") => {
                let kib = number(words.next()) as usize;
                KEPT.with(|kept| kept.borrow_mut().push(vec![1u8; kib << 10]));
            }
            _ => session.send_audio(&samples),
        }
        Ok(())
    }

    fn on_frame(&self, session: &Session, _frame: UnknownFrame) -> Result<(), Error> {
        session.send_audio(&pattern(session, 20));
        Ok(())
    }
}

export_agent!(Prober);
