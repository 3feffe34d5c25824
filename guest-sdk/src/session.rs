//! The [`Session`] handle over the imported `voicehost:agent/session` interface.

use serde_json::{Map, Value};

use crate::bindings::voicehost::agent::session as imports;
use crate::{CallInfo, Party, Refused, ToolResult};

/// The host's import `$import`, or what this thread's test double answers (`$test`, with the double as
/// `$double`) while a [`TestCall`](crate::testing::TestCall) lives (feature `testing`).
macro_rules! host {
    ($double:ident => $test:expr, $import:expr) => {{
        #[cfg(feature = "testing")]
        if let Some($double) = crate::testing::current() {
            return $test;
        }
        $import
    }};
}
pub(crate) use host;

/// The call this instance serves: every [`Agent`](crate::Agent) method gets it.
///
/// It is a zero-sized handle over the host's `session` interface: copying it is free, and every method
/// acts on the instance's one call. Methods that can be refused return [`Refused`]; after
/// [`Refused::Ended`] nothing more can be done on the call.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    _private: (),
}

impl Session {
    pub(crate) const fn new() -> Session {
        Session { _private: () }
    }

    /// The call, as it started: ids, direction, parties, media, language, context.
    pub fn info(&self) -> CallInfo {
        host!(double => double.info(), imports::info())
    }

    /// Text calls: speak `text` (1 to 4096 characters) as a complete utterance that the caller may
    /// interrupt. Refused with [`Refused::WrongMedia`] on an audio call, [`Refused::Invalid`] for an empty
    /// or too long text.
    pub fn say(&self, text: &str) -> Result<(), Refused> {
        host!(double => double.say(text, None, None), imports::say(text, None, None))
    }

    /// Text calls: speak `text`, saying whether more text for the same utterance follows (`last:
    /// Some(false)`; the default is `true`) and whether the caller speaking stops it (`interruptible`,
    /// default `true`).
    pub fn say_with(
        &self,
        text: &str,
        last: Option<bool>,
        interruptible: Option<bool>,
    ) -> Result<(), Refused> {
        host!(
            double => double.say(text, last, interruptible),
            imports::say(text, last, interruptible)
        )
    }

    /// Drop the speech or audio sent that Sent has not played yet.
    pub fn clear(&self) -> Result<(), Refused> {
        host!(double => double.clear(), imports::clear())
    }

    /// Audio calls: play these samples (16-bit mono PCM at the call's sample rate; 20 ms per call is
    /// best). It never fails: after the end, while the call moves between connections, or on a text call,
    /// the audio is dropped.
    pub fn send_audio(&self, samples: &[i16]) {
        host!(double => double.send_audio(samples), imports::send_audio(samples))
    }

    /// Use one of Sent's tools with its arguments (a JSON object, or `None` for no arguments) and wait
    /// for Sent's answer. The same answer then reaches [`Agent::on_tool_result`](crate::Agent::on_tool_result).
    ///
    /// The built-in tools are `transfer`, `hangup`, `send_dtmf` and `hold` (see their wrappers below).
    /// A successful transfer or hangup ends the call: [`Agent::on_session_end`](crate::Agent::on_session_end)
    /// follows.
    ///
    /// ```no_run
    /// # fn f(session: &voicehost_agent::Session) -> Result<(), voicehost_agent::Refused> {
    /// use voicehost_agent::serde_json::json;
    /// let result = session.tool("send_dtmf", Some(json!({"digits": "12#"})))?;
    /// # Ok(()) }
    /// ```
    pub fn tool(&self, name: &str, arguments: Option<Value>) -> Result<ToolResult, Refused> {
        let arguments = arguments.map(|arguments| arguments.to_string());
        self.tool_json(name, arguments.as_deref())
    }

    /// [`Session::tool`] with the arguments already serialized as a JSON object.
    pub fn tool_json(&self, name: &str, arguments: Option<&str>) -> Result<ToolResult, Refused> {
        host!(double => double.tool(name, arguments), imports::tool(name, arguments))
    }

    /// Move the call to another party (`user`, `number` or `agent`; see [`Party::user`],
    /// [`Party::number`], [`Party::agent`]): the `transfer` tool with `{"to": {"kind": …, "value": …}}`.
    /// On success the call ends with `transferred`.
    pub fn transfer(&self, to: &Party) -> Result<ToolResult, Refused> {
        let mut party = Map::new();
        party.insert("kind".into(), Value::String(to.kind.clone()));
        if let Some(value) = &to.value {
            party.insert("value".into(), Value::String(value.clone()));
        }
        let mut arguments = Map::new();
        arguments.insert("to".into(), Value::Object(party));
        self.tool("transfer", Some(Value::Object(arguments)))
    }

    /// Move the call to a phone number in E.164 form (`+14155550100`).
    pub fn transfer_number(&self, number: &str) -> Result<ToolResult, Refused> {
        self.transfer(&Party::number(number))
    }

    /// End the call, after any speech already queued: the `hangup` tool, without arguments.
    pub fn hangup(&self) -> Result<ToolResult, Refused> {
        self.tool_json("hangup", None)
    }

    /// Play DTMF digits on the call (`0`–`9`, `*`, `#`, `A`–`D`, and `w` to wait half a second): the
    /// `send_dtmf` tool with `{"digits": …}`.
    pub fn send_dtmf(&self, digits: &str) -> Result<ToolResult, Refused> {
        let mut arguments = Map::new();
        arguments.insert("digits".into(), Value::String(digits.into()));
        self.tool("send_dtmf", Some(Value::Object(arguments)))
    }

    /// Put the caller on hold (`true`) or take them off it (`false`): the `hold` tool with
    /// `{"held": …}`.
    pub fn hold(&self, held: bool) -> Result<ToolResult, Refused> {
        let mut arguments = Map::new();
        arguments.insert("held".into(), Value::Bool(held));
        self.tool("hold", Some(Value::Object(arguments)))
    }

    /// Keep a small value for this call under `key`. It survives a fresh instance after a trap (see
    /// [`Agent::on_restart`](crate::Agent::on_restart)). Refused with [`Refused::OverLimit`] when the
    /// host's limit on saved state would be passed, [`Refused::Invalid`] for a bad key.
    pub fn save(&self, key: &str, value: &[u8]) -> Result<(), Refused> {
        host!(double => double.save(key, value), imports::save(key, value))
    }

    /// The value saved under `key` for this call, if any.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        host!(double => double.load(key), imports::load(key))
    }
}
