//! A text agent that makes the host keep things for it, so tests can watch the caps on what one instance
//! may hold on the host's side, beside its linear memory.
//!
//! * session start: says "Hello from the hoarder.";
//! * "fields <n> <k>": makes `n` `wasi:http` fields, each with `k` headers of 1 KiB, keeps them all, and
//!   says "kept <n> fields, <bytes> bytes";
//! * "bodies <n>": makes `n` outgoing requests, writes as much of each one's body as the host takes without
//!   ever sending it, keeps them all, and says "kept <n> bodies, <bytes> bytes";
//! * "random <n>": asks the host for `n` random bytes and says "got <n>";
//! * "tool <n>": uses the tool `lookup` with arguments of about `n` bytes (`{"pad":"xxx…"}`) and says
//!   "tool: ok", or "tool: " and why it was refused; "tool-name <n>": the same with a tool name of `n`
//!   letters and no arguments;
//! * "authority <n>": gives a new outgoing request an authority of `n` bytes, keeps the request, and says
//!   "authority: ok" or "authority: refused"; "method <n>": the same with a method of `n` letters;
//! * "say <n>": says `n` letters in one `say` (the host copies them out before any check);
//! * "echo <text>": says `<text>`;
//! * "trap-in <handler>" (`restart`, `end` or `lost`): from now on that handler panics (kept with `save`, so
//!   fresh instances do too); `restart` also panics at once, so the fresh instance's `on-restart` follows;
//!   the others say "armed";
//! * "flood say <n>", "flood log <n>", "flood tool <n>": `n` `say`s, `log` lines or `send_dtmf` tool calls in
//!   one handler call, as fast as they are taken; it keeps "<what>: ok <a>, refused <b> (<first reason>)"
//!   with `save` and says it if it can; "report" says what was kept;
//! * anything else: nothing.

use std::cell::RefCell;

use voicehost_agent::{export_agent, log, Agent, Error, Session, SessionEnd, UserSaid};
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest};
use wasip2::io::streams::OutputStream;

/// One header's value: 1 KiB.
const VALUE: [u8; 1024] = [b'x'; 1024];

/// The hoarder: what it made stays in its fields for the life of the instance.
#[derive(Default)]
pub struct Hoarder {
    fields: RefCell<Vec<Fields>>,
    bodies: RefCell<Vec<(OutgoingRequest, OutgoingBody, OutputStream)>>,
    requests: RefCell<Vec<OutgoingRequest>>,
}

impl Hoarder {
    /// Makes one fields with `headers` headers of 1 KiB; returns its bytes.
    fn fill_fields(&self, headers: u64) -> Result<usize, String> {
        let fields = Fields::new();
        for i in 0..headers {
            fields
                .append(&format!("x-hoard-{i}"), &VALUE)
                .map_err(|e| format!("{e:?}"))?;
        }
        self.fields.borrow_mut().push(fields);
        Ok(headers as usize * VALUE.len())
    }

    /// Makes one request and writes its body until the host takes no more; returns the bytes written.
    fn fill_body(&self) -> Result<usize, String> {
        let request = OutgoingRequest::new(Fields::new());
        let body = request.body().map_err(|()| "no body")?;
        let stream = body.write().map_err(|()| "no body stream")?;
        let mut bytes = 0;
        loop {
            let room = stream.check_write().map_err(|e| format!("{e:?}"))? as usize;
            if room == 0 {
                break;
            }
            let chunk = vec![b'y'; room.min(64 << 10)];
            stream.write(&chunk).map_err(|e| format!("{e:?}"))?;
            bytes += chunk.len();
        }
        self.bodies.borrow_mut().push((request, body, stream));
        Ok(bytes)
    }
}

/// "ok", or why the tool call was refused.
fn said_of(answer: Result<voicehost_agent::ToolResult, voicehost_agent::Refused>) -> String {
    match answer {
        Ok(_) => "ok".into(),
        Err(refused) => refused.name().to_string(),
    }
}

/// Panics when `trap-in` named `handler`.
fn trap_if_armed(session: &Session, handler: &str) {
    if session.load("trap-in").as_deref() == Some(handler.as_bytes()) {
        panic!("the hoarder was asked to trap in {handler}");
    }
}

/// Runs `each` `n` times; keeps and says how many were taken and refused, and the first refusal.
fn flood(
    session: &Session,
    what: &str,
    n: u64,
    mut each: impl FnMut(u64) -> Result<(), voicehost_agent::Refused>,
) -> Result<(), Error> {
    let (mut ok, mut refused, mut first) = (0, 0, None);
    for i in 0..n {
        match each(i) {
            Ok(()) => ok += 1,
            Err(error) => {
                refused += 1;
                first.get_or_insert_with(|| error.name().to_string());
            }
        }
    }
    let report = format!(
        "{what}: ok {ok}, refused {refused} ({})",
        first.as_deref().unwrap_or("-")
    );
    session.save("report", report.as_bytes())?;
    // Refused when the flood filled the call's queue: "report" says it later.
    let _ = session.say(&report);
    Ok(())
}

fn count(text: &str) -> Result<u64, String> {
    text.parse().map_err(|e| format!("{text:?}: {e}"))
}

impl Agent for Hoarder {
    fn on_session_start(&self, session: &Session) -> Result<(), Error> {
        session.say("Hello from the hoarder.")?;
        Ok(())
    }

    fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
        let (command, argument) = said.text.split_once(' ').unwrap_or((&said.text, ""));
        match command {
            "fields" => {
                let (n, headers) = argument.split_once(' ').ok_or("fields <n> <k>")?;
                let (n, headers) = (count(n)?, count(headers)?);
                let mut bytes = 0;
                for _ in 0..n {
                    bytes += self.fill_fields(headers)?;
                }
                session.say(&format!("kept {n} fields, {bytes} bytes"))?;
            }
            "bodies" => {
                let n = count(argument)?;
                let mut bytes = 0;
                for _ in 0..n {
                    bytes += self.fill_body()?;
                }
                session.say(&format!("kept {n} bodies, {bytes} bytes"))?;
            }
            "random" => {
                let n = count(argument)?;
                let got = wasip2::random::random::get_random_bytes(n);
                session.say(&format!("got {}", got.len()))?;
            }
            "tool" => {
                let pad = "x".repeat(count(argument)? as usize);
                let arguments = format!("{{\"pad\":\"{pad}\"}}");
                let answer = session.tool_json("lookup", Some(&arguments));
                session.say(&format!("tool: {}", said_of(answer)))?;
            }
            "tool-name" => {
                let name = "a".repeat(count(argument)? as usize);
                let answer = session.tool_json(&name, None);
                session.say(&format!("tool: {}", said_of(answer)))?;
            }
            "authority" => {
                let request = OutgoingRequest::new(Fields::new());
                let authority = "a".repeat(count(argument)? as usize);
                let set = request.set_authority(Some(&authority));
                session.say(&format!(
                    "authority: {}",
                    if set.is_ok() { "ok" } else { "refused" }
                ))?;
                self.requests.borrow_mut().push(request);
            }
            "method" => {
                let request = OutgoingRequest::new(Fields::new());
                let method = Method::Other("A".repeat(count(argument)? as usize));
                let set = request.set_method(&method);
                session.say(&format!(
                    "method: {}",
                    if set.is_ok() { "ok" } else { "refused" }
                ))?;
                self.requests.borrow_mut().push(request);
            }
            "say" => session.say(&"a".repeat(count(argument)? as usize))?,
            "echo" => session.say(argument)?,
            "trap-in" => {
                session.save("trap-in", argument.as_bytes())?;
                trap_if_armed(session, "restart");
                session.say("armed")?;
            }
            "flood" => {
                let (what, n) = argument.split_once(' ').ok_or("flood <what> <n>")?;
                let n = count(n)?;
                match what {
                    "say" => flood(session, what, n, |i| session.say(&format!("flood {i}")))?,
                    "log" => flood(session, what, n, |i| {
                        log::info!("flood {i}");
                        Ok(())
                    })?,
                    "tool" => flood(session, what, n, |_| {
                        session
                            .tool_json("send_dtmf", Some(r#"{"digits":"1"}"#))
                            .map(|_| ())
                    })?,
                    _ => return Err(format!("flood {what}?").into()),
                }
            }
            "report" => {
                let report = session.load("report").unwrap_or_default();
                session.say(&String::from_utf8_lossy(&report))?;
            }
            _ => {}
        }
        Ok(())
    }

    fn on_session_end(&self, session: &Session, _end: SessionEnd) -> Result<(), Error> {
        trap_if_armed(session, "end");
        Ok(())
    }

    fn on_session_lost(&self, session: &Session) -> Result<(), Error> {
        trap_if_armed(session, "lost");
        Ok(())
    }

    fn on_restart(
        &self,
        session: &Session,
        _reason: voicehost_agent::RestartReason,
    ) -> Result<(), Error> {
        trap_if_armed(session, "restart");
        Ok(())
    }
}

export_agent!(Hoarder);
