//! The failure policy: what the host does with a call its agent cannot serve. One type for every place that
//! names it: the call machine applies it, the registry stores it, the admin API takes and shows it (JSON:
//! `{"action":"hangup"}` or `{"action":"transfer","to":{"kind":…,"value":…}}`), and `voicehost run` and
//! the CLI take it as text (`hangup` or `transfer:KIND:VALUE`).

use crate::wire::{frames, loggable, Frame};
use sentdm_voice_agents::frames::ToolCall;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;

/// What the host does with a call its agent cannot serve (it keeps trapping, it is over a session cap, it
/// could not be instantiated, or it cannot keep up with Sent).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(tag = "action", rename_all = "lowercase", try_from = "PolicyFields")]
pub enum FailurePolicy {
    /// End the call with the hangup tool.
    #[default]
    HangUp,
    /// Transfer the call to this party, e.g. a person's number; a hangup if that fails.
    Transfer {
        /// Who takes the call.
        to: Party,
    },
}

/// A party as Sent's `transfer` tool takes it: a kind (`user`, `number` or `agent`) and a value (for a
/// number, E.164: `+` and 7 to 15 digits), as the official codec checks a `transfer` tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(try_from = "PartyFields")]
#[cfg_attr(feature = "schema", schema(as = TransferTarget))]
pub struct Party {
    /// The kind of party: `user`, `number` or `agent` (the kinds a `transfer` takes).
    #[cfg_attr(feature = "schema", schema(min_length = 1, example = "number"))]
    kind: String,
    /// Who, for that kind: an E.164 phone number for `number`, an id for the others.
    #[cfg_attr(feature = "schema", schema(min_length = 1, example = "+14155550100"))]
    value: String,
}

/// The JSON as it comes, checked whole by `TryFrom` (serde alone lets a hangup carry a `to`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFields {
    action: Action,
    to: Option<Party>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Action {
    HangUp,
    Transfer,
}

impl TryFrom<PolicyFields> for FailurePolicy {
    type Error = PolicyError;

    fn try_from(fields: PolicyFields) -> Result<FailurePolicy, PolicyError> {
        match (fields.action, fields.to) {
            (Action::HangUp, None) => Ok(FailurePolicy::HangUp),
            (Action::Transfer, Some(to)) => Ok(FailurePolicy::Transfer { to }),
            (Action::HangUp, Some(_)) => Err(PolicyError::HangUpWithParty),
            (Action::Transfer, None) => Err(PolicyError::EmptyParty),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartyFields {
    kind: String,
    value: String,
}

impl TryFrom<PartyFields> for Party {
    type Error = PolicyError;

    fn try_from(fields: PartyFields) -> Result<Party, PolicyError> {
        Party::new(fields.kind, fields.value)
    }
}

impl Party {
    /// A party of `kind` and `value`; refused when either is empty, or when the official codec would not
    /// carry a `transfer` to it (so that a failure policy never fails where it runs).
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Result<Party, PolicyError> {
        let (kind, value) = (kind.into(), value.into());
        if kind.is_empty() || value.is_empty() {
            return Err(PolicyError::EmptyParty);
        }
        let party = Party { kind, value };
        let transfer = Frame::ToolCall(ToolCall {
            session_id: "vs_0".into(),
            call_ref: "t1".into(),
            name: "transfer".into(),
            arguments: Some(party.arguments()),
        });
        match frames::encode_to_string(&transfer) {
            Ok(_) => Ok(party),
            Err(_) if !matches!(party.kind.as_str(), "user" | "number" | "agent") => {
                Err(PolicyError::Unsendable(
                    "Sent's transfer tool takes a party of kind user, number or agent".into(),
                ))
            }
            Err(_) if party.kind == "number" => Err(PolicyError::Unsendable(
                "a number is E.164: `+` and 7 to 15 digits, e.g. +14155550100".into(),
            )),
            Err(error) => Err(PolicyError::Unsendable(loggable(&error.message))),
        }
    }

    /// The `transfer` tool's arguments for this party: `{"to": {"kind", "value"}}`.
    pub fn arguments(&self) -> Map<String, Value> {
        let mut to = Map::new();
        to.insert("kind".into(), Value::String(self.kind.clone()));
        to.insert("value".into(), Value::String(self.value.clone()));
        let mut arguments = Map::new();
        arguments.insert("to".into(), Value::Object(to));
        arguments
    }

    /// The kind of party: `number`, `user`, `agent`, `sip`, …
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Who, for that kind: a number, a user's id, a SIP URI, …
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl FailurePolicy {
    /// A transfer to a party nothing checked, for the tests of what happens when one gets through.
    #[cfg(any(test, feature = "fuzzing"))]
    #[doc(hidden)]
    pub fn transfer_unchecked(kind: &str, value: &str) -> FailurePolicy {
        FailurePolicy::Transfer {
            to: Party {
                kind: kind.into(),
                value: value.into(),
            },
        }
    }

    /// A transfer to `kind:value`.
    pub fn transfer(kind: &str, value: &str) -> Result<FailurePolicy, PolicyError> {
        Ok(FailurePolicy::Transfer {
            to: Party::new(kind, value)?,
        })
    }
}

/// Why a failure policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A transfer without a party, or with an empty kind or value.
    #[error("a transfer needs the party's kind and value, neither empty")]
    EmptyParty,
    /// A hangup given a party (`to`), which only a transfer takes.
    #[error("a hangup takes no party")]
    HangUpWithParty,
    /// A party the official codec will not carry in a `transfer`, and why.
    #[error("Sent cannot transfer to it: {0}")]
    Unsendable(String),
    /// Text that is neither `hangup` nor `transfer:KIND:VALUE`.
    #[error(
        "a failure policy is `hangup` or `transfer:KIND:VALUE`, e.g. `transfer:number:+14155550100`"
    )]
    NotAPolicy,
}

/// `hangup` or `transfer:KIND:VALUE`; the value may hold colons itself (`transfer:sip:sip:desk@example.com`).
impl FromStr for FailurePolicy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<FailurePolicy, PolicyError> {
        if text == "hangup" {
            return Ok(FailurePolicy::HangUp);
        }
        match text.split_once(':') {
            Some(("transfer", party)) => {
                let (kind, value) = party.split_once(':').ok_or(PolicyError::NotAPolicy)?;
                FailurePolicy::transfer(kind, value).map_err(|error| match error {
                    PolicyError::Unsendable(_) => error,
                    _ => PolicyError::NotAPolicy,
                })
            }
            _ => Err(PolicyError::NotAPolicy),
        }
    }
}

/// The text [`FromStr`] reads back.
impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailurePolicy::HangUp => f.write_str("hangup"),
            FailurePolicy::Transfer { to } => write!(f, "transfer:{}:{}", to.kind, to.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_reads_hangup_and_transfers_whose_value_holds_colons() {
        assert_eq!("hangup".parse(), Ok(FailurePolicy::HangUp));
        assert_eq!(
            "transfer:number:+14155550100".parse(),
            FailurePolicy::transfer("number", "+14155550100")
        );
        assert_eq!(
            "transfer:user:desk:one".parse(),
            FailurePolicy::transfer("user", "desk:one")
        );
    }

    #[test]
    fn text_that_is_not_a_whole_policy_is_refused() {
        for bad in [
            "",
            "Hangup",
            "hangup:now",
            "transfer",
            "transfer:number",
            "transfer::+1",
            "transfer:number:",
            "forward:number:+1",
        ] {
            assert_eq!(
                bad.parse::<FailurePolicy>(),
                Err(PolicyError::NotAPolicy),
                "{bad}"
            );
        }
    }

    #[test]
    fn text_and_json_read_back_what_they_wrote() {
        for policy in [
            FailurePolicy::HangUp,
            FailurePolicy::transfer("agent", "agent_desk").unwrap(),
        ] {
            assert_eq!(policy.to_string().parse(), Ok(policy.clone()));
            let json = serde_json::to_value(&policy).unwrap();
            assert_eq!(
                serde_json::from_value::<FailurePolicy>(json).unwrap(),
                policy
            );
        }
    }

    #[test]
    fn json_is_the_admin_apis_shape() {
        assert_eq!(
            serde_json::to_value(FailurePolicy::HangUp).unwrap(),
            json!({"action": "hangup"})
        );
        assert_eq!(
            serde_json::to_value(FailurePolicy::transfer("number", "+14155550100").unwrap())
                .unwrap(),
            json!({"action": "transfer", "to": {"kind": "number", "value": "+14155550100"}})
        );
    }

    #[test]
    fn a_party_the_codec_would_not_carry_is_refused_where_it_is_named() {
        for (text, why) in [
            (
                "transfer:sip:sip:desk@example.com",
                "kind user, number or agent",
            ),
            ("transfer:conference:room", "kind user, number or agent"),
            ("transfer:number:14155550100", "E.164"),
            ("transfer:number:+1", "E.164"),
        ] {
            let error = text.parse::<FailurePolicy>().unwrap_err();
            assert!(
                matches!(&error, PolicyError::Unsendable(message) if message.contains(why)),
                "{text}: {error}"
            );
        }
        let json = json!({"action": "transfer", "to": {"kind": "sip", "value": "sip:x@y"}});
        assert!(serde_json::from_value::<FailurePolicy>(json).is_err());
    }

    #[test]
    fn json_with_an_empty_party_or_unknown_fields_is_refused() {
        for bad in [
            json!({"action": "transfer", "to": {"kind": "", "value": "+1"}}),
            json!({"action": "transfer", "to": {"kind": "number", "value": ""}}),
            json!({"action": "transfer", "to": {"kind": "number", "value": "+1", "x": 1}}),
            json!({"action": "hangup", "to": {"kind": "number", "value": "+1"}}),
            json!({"action": "drop"}),
            json!({}),
        ] {
            assert!(
                serde_json::from_value::<FailurePolicy>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
