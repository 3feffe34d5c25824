//! sentsim: Sent's side of the Sent Voice Agents protocol (`sent.voice.v1`) on loopback, a recorder of every
//! frame both ways, and a conformance scenario suite that runs against any agent: the official SDK's
//! conformance agent in-process, an agent process that connects to `sentsim conformance --listen`, or
//! voicehost. A second list, [`pressure`], puts Sent under timing pressure and at its limits, one agent
//! per scenario; [`chaos`] runs many calls while Sent drops, closes and drains connections and refuses
//! resumes at random. [`load`] is a lean Sent for many audio calls at once, for benchmarks.

/// Declares `SCENARIOS`, a module's list of [`scenarios::Scenario`]s in the order they run: one line per
/// scenario, `name: "meaning",` for one that needs nothing but the conformance agent, or
/// `name [needs]: "meaning",` with a [`scenarios::Needs`]. Each `name` is an `async fn(&Ctx) -> Result<()>`
/// of the module.
macro_rules! scenarios {
    ($($name:ident $([$needs:expr])?: $meaning:literal,)*) => {
        /// Every scenario, in the order the suite runs them.
        pub const SCENARIOS: &[$crate::scenarios::Scenario] = &[
            $($crate::scenarios::Scenario {
                name: stringify!($name),
                meaning: $meaning,
                needs: scenarios!(@needs $($needs)?),
                run: |ctx| Box::pin($name(ctx)),
            },)*
        ];
    };
    (@needs) => { $crate::scenarios::Needs::CONFORMANCE };
    (@needs $needs:expr) => { $needs };
}

pub mod calls;
pub mod chaos;
pub mod load;
pub mod pressure;
pub mod record;
pub mod scenarios;
pub mod sim;
pub mod suite;

/// Sent's side as a sans-IO model, which [`Sim`] drives on sockets.
pub use sentsim_model as model;
pub use sentsim_model::wire;

pub use record::{Dir, Record, Recorder, Violation, What};
pub use sim::{
    Call, CallState, CloseAfterReady, ConnHandle, ConnPlan, Kind, SessionSpec, Sim, SimConfig,
    ToolPlan,
};
pub use suite::{Outcome, Profile, Report};
