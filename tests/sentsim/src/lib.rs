//! sentsim: Sent's side of the Sent Voice Agents protocol (`sent.voice.v1`) on loopback, a recorder of every
//! frame both ways, and a conformance scenario suite that runs against any agent: the official SDK's
//! conformance agent in-process, an agent process that connects to `sentsim conformance --listen`, or
//! voicehost.

pub mod calls;
pub mod record;
pub mod scenarios;
pub mod sim;
pub mod suite;
pub mod wire;

pub use record::{Dir, Record, Recorder, Violation, What};
pub use sim::{Call, CallState, ConnHandle, ConnPlan, Kind, SessionSpec, Sim, SimConfig, ToolPlan};
pub use suite::{Outcome, Profile, Report};
