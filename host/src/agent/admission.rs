//! Caps on concurrent calls: a tenant's across all its agents, and an agent's own. A call is admitted only
//! when every cap it falls under has room; the [`Permit`] it gets gives the room back when the call is done.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One cap, shared by every call it counts.
#[derive(Debug)]
pub struct Gate {
    live: AtomicUsize,
    cap: AtomicUsize,
}

impl Gate {
    /// A cap of `cap` concurrent calls, with none counted yet.
    pub fn new(cap: usize) -> Arc<Gate> {
        Arc::new(Gate {
            live: AtomicUsize::new(0),
            cap: AtomicUsize::new(cap),
        })
    }

    /// Calls counted under the cap now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// A new cap, for calls from now on (calls already in keep their room, even over it).
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Release);
    }

    fn enter(&self) -> bool {
        let cap = self.cap.load(Ordering::Acquire);
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < cap).then_some(live + 1)
            })
            .is_ok()
    }

    fn leave(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The caps a new call of one agent falls under (none: every call is admitted).
#[derive(Debug, Clone, Default)]
pub struct Admission {
    gates: Vec<Arc<Gate>>,
}

impl Admission {
    /// The caps in `gates`: a call is admitted only with room under each (with none, every call is).
    pub fn new(gates: Vec<Arc<Gate>>) -> Admission {
        Admission { gates }
    }

    /// Room for one more call under every cap, or `None` (and nothing taken) when a cap is full.
    pub fn admit(&self) -> Option<Permit> {
        for (at, gate) in self.gates.iter().enumerate() {
            if !gate.enter() {
                for entered in &self.gates[..at] {
                    entered.leave();
                }
                return None;
            }
        }
        Some(Permit {
            gates: self.gates.clone(),
        })
    }
}

/// One admitted call's room under its caps, given back on drop.
#[derive(Debug)]
pub struct Permit {
    gates: Vec<Arc<Gate>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        for gate in &self.gates {
            gate.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_needs_room_under_every_cap_and_gives_it_back_when_done() {
        let tenant = Gate::new(2);
        let agent = Gate::new(1);
        let other_agent = Admission::new(vec![tenant.clone()]);
        let admission = Admission::new(vec![tenant.clone(), agent.clone()]);
        let first = admission.admit().expect("room for one");
        assert!(admission.admit().is_none(), "the agent's cap is 1");
        assert_eq!(tenant.live(), 1, "a refused call takes no room");
        let second = other_agent.admit().expect("the tenant has room for two");
        assert!(other_agent.admit().is_none(), "the tenant's cap is 2");
        drop(second);
        agent.set_cap(2);
        let third = admission.admit().expect("the agent's cap is 2 now");
        drop(third);
        drop(first);
        assert_eq!((tenant.live(), agent.live()), (0, 0));
        assert!(admission.admit().is_some());
    }

    #[test]
    fn no_caps_admit_every_call() {
        let admission = Admission::default();
        let permits: Vec<_> = (0..1000).map(|_| admission.admit()).collect();
        assert!(permits.iter().all(Option::is_some));
    }
}
