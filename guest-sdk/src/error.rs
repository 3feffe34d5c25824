//! [`Error`]: what an [`Agent`](crate::Agent) handler fails with.

use crate::Refused;
use std::fmt;

/// Why a handler failed. The host logs it with the call and counts it, and the call goes on (a panic,
/// unlike an `Err`, traps the instance).
///
/// `?` makes one from a session call's [`Refused`], from a `String` or `&str`, and from a
/// `serde_json::Error`; [`Error::new`] from anything that displays.
///
/// ```
/// use voicehost_agent::{Error, Refused};
///
/// let refused = Error::from(Refused::Ended);
/// assert!(refused.is_ended());
/// let failed = Error::new(format_args!("no order {}", 17));
/// assert_eq!(failed.to_string(), "no order 17");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The host refused a session call. After [`Refused::Ended`] nothing more can be done on the call.
    Refused(Refused),
    /// The agent's own failure, in words.
    Failed(String),
}

impl Error {
    /// The agent's own failure, in words.
    pub fn new(message: impl fmt::Display) -> Error {
        Error::Failed(message.to_string())
    }

    /// Whether a session call was refused because the call has ended: nothing more can be done on it.
    pub fn is_ended(&self) -> bool {
        matches!(self, Error::Refused(Refused::Ended))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Refused(refused) => {
                write!(f, "refused ({}): {}", refused.name(), refused.message())
            }
            Error::Failed(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Refused(refused) => Some(refused),
            Error::Failed(_) => None,
        }
    }
}

impl From<Refused> for Error {
    fn from(refused: Refused) -> Error {
        Error::Refused(refused)
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::Failed(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::Failed(message.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(error: serde_json::Error) -> Error {
        Error::Failed(format!("JSON: {error}"))
    }
}
