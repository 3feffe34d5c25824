//! Logging into the host's log, tagged with the call. The host rate-limits it.
//!
//! Plain functions take a message (`log::info("started")`); the macros of the same names format one
//! (`log::info!("turn {n}")`).
//!
//! ```no_run
//! use voicehost_agent::log;
//! log::info("greeted");
//! let n = 3;
//! log::warn!("{n} retries");
//! ```

use crate::bindings::wasi::logging::logging as imports;
pub use crate::bindings::wasi::logging::logging::Level;

/// Log `message` at `level` (through `wasi:logging`, with no context).
pub fn log(level: Level, message: &str) {
    crate::session::host!(double => double.log(level, message), imports::log(level, "", message))
}

/// Log `message` at [`Level::Trace`].
pub fn trace(message: &str) {
    log(Level::Trace, message)
}

/// Log `message` at [`Level::Debug`].
pub fn debug(message: &str) {
    log(Level::Debug, message)
}

/// Log `message` at [`Level::Info`].
pub fn info(message: &str) {
    log(Level::Info, message)
}

/// Log `message` at [`Level::Warn`].
pub fn warn(message: &str) {
    log(Level::Warn, message)
}

/// Log `message` at [`Level::Error`].
pub fn error(message: &str) {
    log(Level::Error, message)
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log {
    ($level:ident, $($arg:tt)+) => {
        $crate::log::log($crate::log::Level::$level, &::std::format!($($arg)+))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log_trace {
    ($($arg:tt)+) => { $crate::__voicehost_log!(Trace, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log_debug {
    ($($arg:tt)+) => { $crate::__voicehost_log!(Debug, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log_info {
    ($($arg:tt)+) => { $crate::__voicehost_log!(Info, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log_warn {
    ($($arg:tt)+) => { $crate::__voicehost_log!(Warn, $($arg)+) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __voicehost_log_error {
    ($($arg:tt)+) => { $crate::__voicehost_log!(Error, $($arg)+) };
}

/// Log a formatted message at [`Level::Trace`]: `log::trace!("{x:?}")`.
#[doc(inline)]
pub use crate::__voicehost_log_trace as trace;

/// Log a formatted message at [`Level::Debug`]: `log::debug!("{x:?}")`.
#[doc(inline)]
pub use crate::__voicehost_log_debug as debug;

/// Log a formatted message at [`Level::Info`]: `log::info!("{x:?}")`.
#[doc(inline)]
pub use crate::__voicehost_log_info as info;

/// Log a formatted message at [`Level::Warn`]: `log::warn!("{x:?}")`.
#[doc(inline)]
pub use crate::__voicehost_log_warn as warn;

/// Log a formatted message at [`Level::Error`]: `log::error!("{x:?}")`.
#[doc(inline)]
pub use crate::__voicehost_log_error as error;
