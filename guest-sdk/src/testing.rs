//! A stand-in for the host, to unit-test an agent's logic natively with `cargo test`, without Wasm
//! (feature `testing`).
//!
//! A [`TestCall`] is one call: while it lives, every [`Session`] on its thread acts on it instead of on
//! the host, and it records what the agent did (speech, audio, tool calls, saved state, log lines) for the
//! test to look at. Tools are answered `ok` unless [`TestCall::answer_tool`] says otherwise. It keeps the
//! rules [`Session`]'s methods state (a text of 1 to 4,096 characters, `say` and `clear` on text calls
//! only, saved state within the host's default of 64 KiB, nothing after the end); the host is the
//! authority on the rest (`voicehost test` runs the component on the real host).
//!
//! ```
//! use voicehost_agent::testing::TestCall;
//! use voicehost_agent::{Agent, Error, Session, UserSaid};
//!
//! #[derive(Default)]
//! struct Echo;
//!
//! impl Agent for Echo {
//!     fn on_user_said(&self, session: &Session, said: UserSaid) -> Result<(), Error> {
//!         session.say(&said.text)?;
//!         Ok(())
//!     }
//! }
//!
//! let call = TestCall::text();
//! call.user_said(&Echo, "hello").unwrap();
//! assert_eq!(call.said(), ["hello"]);
//! ```

use crate::log::Level;
use crate::Session;
use crate::{
    Agent, CallInfo, Direction, Error, Media, Party, Refused, SessionEnd, ToolError, ToolResult,
    UserSaid,
};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// Saved state a call may hold: the host's default (`[limits] state_bytes`).
pub const STATE_BYTES: usize = 64 << 10;
/// The longest text `say` takes, in characters.
const MAX_TEXT: usize = 4096;

thread_local! {
    /// The call this thread's sessions act on, while a [`TestCall`] lives.
    static CURRENT: RefCell<Option<Rc<RefCell<State>>>> = const { RefCell::new(None) };
}

/// One piece of speech: `say`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speech {
    /// The text.
    pub text: String,
    /// Whether the utterance ends with it (`say` sends `true`).
    pub last: bool,
    /// Whether the caller speaking stops it.
    pub interruptible: bool,
}

/// A tool call the agent made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments, as JSON (`None` without arguments).
    pub arguments: Option<Value>,
    /// The `call_ref` Sent's answer carried.
    pub call_ref: String,
}

/// How a tool is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolAnswer {
    /// `ok: true`.
    Ok,
    /// `ok: false` with this error code and message.
    Failed(String, String),
    /// The host refused the call (e.g. [`Refused::TimedOut`] for a tool Sent never answered).
    Refused(Refused),
}

#[derive(Debug)]
struct State {
    info: CallInfo,
    speech: Vec<Speech>,
    clears: usize,
    audio: Vec<i16>,
    tools: Vec<ToolCall>,
    results: Vec<ToolResult>,
    answers: HashMap<String, ToolAnswer>,
    saved: BTreeMap<String, Vec<u8>>,
    logs: Vec<(Level, String)>,
    ended: bool,
}

/// One call, with the host played by this crate: see the [module](self).
#[derive(Debug)]
pub struct TestCall {
    state: Rc<RefCell<State>>,
}

impl TestCall {
    /// An inbound text call.
    pub fn text() -> TestCall {
        TestCall::with_info(call_info(Media::Text))
    }

    /// An inbound audio call at `sample_rate` Hz.
    pub fn audio(sample_rate: u32) -> TestCall {
        TestCall::with_info(call_info(Media::Audio(sample_rate)))
    }

    /// A call as `info` describes it (what [`Session::info`] returns).
    pub fn with_info(info: CallInfo) -> TestCall {
        let state = Rc::new(RefCell::new(State {
            info,
            speech: Vec::new(),
            clears: 0,
            audio: Vec::new(),
            tools: Vec::new(),
            results: Vec::new(),
            answers: HashMap::new(),
            saved: BTreeMap::new(),
            logs: Vec::new(),
            ended: false,
        }));
        CURRENT.with(|current| *current.borrow_mut() = Some(state.clone()));
        TestCall { state }
    }

    /// The session the agent's methods get.
    pub fn session(&self) -> Session {
        Session::new()
    }

    /// From now on the tool `name` is answered with `answer`.
    pub fn answer_tool(&self, name: &str, answer: ToolAnswer) {
        self.state.borrow_mut().answers.insert(name.into(), answer);
    }

    /// The caller says `text`: the agent's [`Agent::on_user_said`], as the host would call it.
    pub fn user_said(&self, agent: &impl Agent, text: &str) -> Result<(), Error> {
        let said = UserSaid {
            text: text.into(),
            correction: false,
        };
        agent.on_user_said(&self.session(), said)
    }

    /// The call ends (`reason`, e.g. `caller_hung_up`): the agent's [`Agent::on_session_end`]; from then
    /// on every session call is refused [`Refused::Ended`].
    pub fn end(&self, agent: &impl Agent, reason: &str) -> Result<(), Error> {
        self.state.borrow_mut().ended = true;
        let end = SessionEnd {
            reason: reason.into(),
            duration_ms: 0,
        };
        agent.on_session_end(&self.session(), end)
    }

    /// The texts the agent said, in order.
    pub fn said(&self) -> Vec<String> {
        let state = self.state.borrow();
        state.speech.iter().map(|s| s.text.clone()).collect()
    }

    /// The agent's speech with `say_with`'s flags.
    pub fn speech(&self) -> Vec<Speech> {
        self.state.borrow().speech.clone()
    }

    /// How many times the agent cleared its speech.
    pub fn clears(&self) -> usize {
        self.state.borrow().clears
    }

    /// The audio the agent sent, its samples end to end.
    pub fn audio_sent(&self) -> Vec<i16> {
        self.state.borrow().audio.clone()
    }

    /// The tool calls the agent made, in order.
    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.state.borrow().tools.clone()
    }

    /// Sent's answers to the agent's tool calls, in order: what the host would also hand to
    /// [`Agent::on_tool_result`] (the double does not call it: a test does, when it matters).
    pub fn tool_results(&self) -> Vec<ToolResult> {
        self.state.borrow().results.clone()
    }

    /// What the agent saved under `key`.
    pub fn saved(&self, key: &str) -> Option<Vec<u8>> {
        self.state.borrow().saved.get(key).cloned()
    }

    /// Saves `value` under `key` as if an earlier instance had (what a fresh instance after a restart
    /// finds).
    pub fn save(&self, key: &str, value: &[u8]) {
        self.state
            .borrow_mut()
            .saved
            .insert(key.into(), value.into());
    }

    /// The agent's log lines, in order.
    pub fn logs(&self) -> Vec<(Level, String)> {
        self.state.borrow().logs.clone()
    }

    /// Whether the call has ended: [`TestCall::end`], or a `hangup` or `transfer` answered `ok`. From then
    /// on every session call is refused [`Refused::Ended`].
    pub fn ended(&self) -> bool {
        self.state.borrow().ended
    }
}

impl Drop for TestCall {
    fn drop(&mut self) {
        CURRENT.with(|current| {
            let mut current = current.borrow_mut();
            if current.as_ref().is_some_and(|c| Rc::ptr_eq(c, &self.state)) {
                *current = None;
            }
        });
    }
}

fn call_info(media: Media) -> CallInfo {
    CallInfo {
        session_id: "vs_test".into(),
        call_id: "call_test".into(),
        agent_id: "agent_test".into(),
        direction: Direction::Inbound,
        from: Party::number("+14155550100"),
        to: Party::agent("agent_test"),
        media,
        language: Some("en-US".into()),
        context: None,
        started_at: "2026-12-04T10:00:00Z".into(),
        max_duration_ms: Some(1_800_000),
    }
}

/// The session calls, answered by this thread's [`TestCall`]; `None` when there is none (the host's
/// imports answer).
pub(crate) fn current() -> Option<Double> {
    CURRENT.with(|current| current.borrow().clone().map(Double))
}

/// The host's side of a session, played by a [`TestCall`].
pub(crate) struct Double(Rc<RefCell<State>>);

impl Double {
    pub(crate) fn info(&self) -> CallInfo {
        self.0.borrow().info.clone()
    }

    pub(crate) fn say(
        &self,
        text: &str,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Result<(), Refused> {
        let mut state = self.0.borrow_mut();
        state.usable(true)?;
        let chars = text.chars().count();
        if chars == 0 || chars > MAX_TEXT {
            return Err(Refused::Invalid);
        }
        state.speech.push(Speech {
            text: text.into(),
            last: last.unwrap_or(true),
            interruptible: interruptible.unwrap_or(true),
        });
        Ok(())
    }

    pub(crate) fn clear(&self) -> Result<(), Refused> {
        let mut state = self.0.borrow_mut();
        state.usable(true)?;
        state.clears += 1;
        Ok(())
    }

    pub(crate) fn send_audio(&self, samples: &[i16]) {
        let mut state = self.0.borrow_mut();
        if !state.ended && state.info.media != Media::Text {
            state.audio.extend_from_slice(samples);
        }
    }

    pub(crate) fn tool(&self, name: &str, arguments: Option<&str>) -> Result<ToolResult, Refused> {
        let mut state = self.0.borrow_mut();
        state.usable(false)?;
        let arguments = match arguments.map(serde_json::from_str::<Value>) {
            Some(Ok(value @ Value::Object(_))) => Some(value),
            Some(_) => return Err(Refused::Invalid),
            None => None,
        };
        let call_ref = format!("tc_test-{}", state.tools.len() + 1);
        state.tools.push(ToolCall {
            name: name.into(),
            arguments,
            call_ref: call_ref.clone(),
        });
        let answer = state.answers.get(name).cloned().unwrap_or(ToolAnswer::Ok);
        let result = match answer {
            ToolAnswer::Ok => {
                // As on the host, a transfer or hangup that succeeded ends the call.
                if name == "hangup" || name == "transfer" {
                    state.ended = true;
                }
                ToolResult {
                    call_ref,
                    outcome: Ok(()),
                }
            }
            ToolAnswer::Failed(code, message) => ToolResult {
                call_ref,
                outcome: Err(ToolError { code, message }),
            },
            ToolAnswer::Refused(refused) => return Err(refused),
        };
        state.results.push(result.clone());
        Ok(result)
    }

    pub(crate) fn save(&self, key: &str, value: &[u8]) -> Result<(), Refused> {
        let mut state = self.0.borrow_mut();
        state.usable(false)?;
        if key.is_empty() {
            return Err(Refused::Invalid);
        }
        let others: usize = state
            .saved
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if others + key.len() + value.len() > STATE_BYTES {
            return Err(Refused::OverLimit);
        }
        state.saved.insert(key.into(), value.into());
        Ok(())
    }

    pub(crate) fn load(&self, key: &str) -> Option<Vec<u8>> {
        self.0.borrow().saved.get(key).cloned()
    }

    pub(crate) fn log(&self, level: Level, message: &str) {
        self.0.borrow_mut().logs.push((level, message.into()));
    }
}

impl State {
    /// Whether a session call may act: not after the end, and (`text_only`) not on an audio call.
    fn usable(&self, text_only: bool) -> Result<(), Refused> {
        if self.ended {
            return Err(Refused::Ended);
        }
        if text_only && self.info.media != Media::Text {
            return Err(Refused::WrongMedia);
        }
        Ok(())
    }
}
