//! Caps on concurrent calls: a tenant's across all its agents, and an agent's own; and the call's slot in
//! the host's instance pool, taken from its tenant's [`Part`] of it. A call is admitted only when every
//! cap it falls under has room and the pool has a slot for it; the [`Permit`] it gets gives both back
//! when the call is done.

use crate::sandbox::budget::Part;
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

    /// Counts a call in whatever the cap: one that moved here from another host of the cluster.
    fn enter_anyway(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    fn leave(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The caps a new call of one agent falls under, and where its pool slot comes from (none of either:
/// every call is admitted).
#[derive(Debug, Clone, Default)]
pub struct Admission {
    gates: Vec<Arc<Gate>>,
    slots: Option<Part>,
}

/// Why a call was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A session cap (the agent's, or its tenant's) is full.
    OverCap,
    /// The pool has no slot the call's tenant may take: what other tenants reserved is held back for
    /// them, and the rest is in use.
    HostFull,
}

impl Admission {
    /// The caps in `gates`: a call is admitted only with room under each (with none, every call is).
    pub fn new(gates: Vec<Arc<Gate>>) -> Admission {
        Admission { gates, slots: None }
    }

    /// Each call also takes its slots from `slots` (its tenant's share of the host's pool).
    pub fn with_slots(mut self, slots: Part) -> Admission {
        self.slots = Some(slots);
        self
    }

    /// Room for one more call under every cap and `pool_slots` slots of the pool (what one call of its
    /// code takes), or why not (and nothing taken).
    pub fn admit(&self, pool_slots: u32) -> Result<Permit, Refusal> {
        for (at, gate) in self.gates.iter().enumerate() {
            if !gate.enter() {
                for entered in &self.gates[..at] {
                    entered.leave();
                }
                return Err(Refusal::OverCap);
            }
        }
        // Built now, so that a refused slot gives the caps back as the permit's drop does.
        let mut permit = Permit {
            gates: self.gates.clone(),
            slots: None,
        };
        if let Some(slots) = &self.slots {
            if !slots.take(u64::from(pool_slots)) {
                return Err(Refusal::HostFull);
            }
            permit.slots = Some((slots.clone(), pool_slots));
        }
        Ok(permit)
    }

    /// A call handed over by another host of the cluster: it needs a pool slot here, but is let in under
    /// the session caps whatever they say (the cluster counts it already, on the host it left, until that
    /// host's next count; refusing it would lose a live call).
    pub fn admit_moved(&self, pool_slots: u32) -> Result<Permit, Refusal> {
        let mut permit = Permit {
            gates: self.gates.clone(),
            slots: None,
        };
        if let Some(slots) = &self.slots {
            if !slots.take(u64::from(pool_slots)) {
                permit.gates.clear();
                return Err(Refusal::HostFull);
            }
            permit.slots = Some((slots.clone(), pool_slots));
        }
        self.gates.iter().for_each(|gate| gate.enter_anyway());
        Ok(permit)
    }
}

/// One admitted call's room under its caps and its pool slot, given back on drop.
#[derive(Debug)]
pub struct Permit {
    gates: Vec<Arc<Gate>>,
    slots: Option<(Part, u32)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        for gate in &self.gates {
            gate.leave();
        }
        if let Some((share, slots)) = &self.slots {
            share.give(u64::from(*slots));
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
        let first = admission.admit(1).expect("room for one");
        assert_eq!(
            admission.admit(1).unwrap_err(),
            Refusal::OverCap,
            "the agent's cap is 1"
        );
        assert_eq!(tenant.live(), 1, "a refused call takes no room");
        let second = other_agent.admit(1).expect("the tenant has room for two");
        assert!(other_agent.admit(1).is_err(), "the tenant's cap is 2");
        drop(second);
        agent.set_cap(2);
        let third = admission.admit(1).expect("the agent's cap is 2 now");
        drop(third);
        drop(first);
        assert_eq!((tenant.live(), agent.live()), (0, 0));
        assert!(admission.admit(1).is_ok());
    }

    #[test]
    fn a_call_moved_from_another_host_is_let_in_over_the_caps_but_not_past_the_pool() {
        let pool = crate::sandbox::budget::Budget::new(1);
        let tenant = Gate::new(1);
        let admission = Admission::new(vec![tenant.clone()]).with_slots(pool.part("acme"));
        let here = admission.admit(0).expect("room for one");
        let moved = admission.admit_moved(0).expect("counted, over the cap");
        assert_eq!(tenant.live(), 2);
        let slot = admission.admit_moved(1).expect("the pool's one slot");
        assert_eq!(admission.admit_moved(1).unwrap_err(), Refusal::HostFull);
        assert_eq!(tenant.live(), 3, "a call refused a slot is not counted");
        drop((here, moved, slot));
        assert_eq!((tenant.live(), pool.used()), (0, 0));
    }

    #[test]
    fn a_call_refused_a_pool_slot_gives_back_its_room_under_the_caps() {
        let pool = crate::sandbox::budget::Budget::new(2);
        pool.reserve([("acme", 1)]);
        let tenant = Gate::new(10);
        let globex = Admission::new(vec![tenant.clone()]).with_slots(pool.part("globex"));
        let acme = Admission::new(vec![]).with_slots(pool.part("acme"));
        let first = globex.admit(1).expect("the slot nobody reserved");
        assert_eq!(globex.admit(1).unwrap_err(), Refusal::HostFull);
        assert_eq!(
            tenant.live(),
            1,
            "the refused call holds no room under its tenant's cap"
        );
        let reserved = acme.admit(1).expect("acme's reserved slot");
        drop((first, reserved));
        assert_eq!((pool.used(), tenant.live()), (0, 0));
        // A call of a component with more memories or tables than a slot holds takes more slots.
        assert_eq!(
            globex.admit(2).unwrap_err(),
            Refusal::HostFull,
            "one unreserved slot"
        );
        let wide = acme.admit(2).expect("acme's slot and the unreserved one");
        assert_eq!(pool.used(), 2);
        drop(wide);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn no_caps_admit_every_call() {
        let admission = Admission::default();
        let permits: Vec<_> = (0..1000).map(|_| admission.admit(1)).collect();
        assert!(permits.iter().all(Result::is_ok));
    }
}
