//! Uploads in progress and whose compile runs when. A tenant has a few uploads in progress at most (one
//! more is refused at once, before its body is read). Compiles run a few at once across the host, one at
//! a time per tenant, in the order asked: a tenant that uploads many slow components waits for its own;
//! another tenant's upload takes the next free slot. Loading from the compiled cache never queues (see
//! `Tenancy::load`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A semaphore of `permits` per tenant, made on first use.
struct PerTenant {
    permits: usize,
    tenants: Mutex<BTreeMap<String, Arc<Semaphore>>>,
}

impl PerTenant {
    fn new(permits: usize) -> PerTenant {
        PerTenant {
            permits,
            tenants: Mutex::default(),
        }
    }

    /// `tenant`'s semaphore.
    fn of(&self, tenant: &str) -> Arc<Semaphore> {
        self.tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.permits)))
            .clone()
    }

    /// How many of `tenant`'s permits are held.
    fn held(&self, tenant: &str) -> usize {
        self.tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .map_or(0, |semaphore| self.permits - semaphore.available_permits())
    }

    /// Forgets the tenants not in `keep` (removed from the config).
    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|tenant, _| keep(tenant));
    }
}

/// The queue of compiles.
pub(super) struct CompileQueue {
    /// Compiles at once across tenants.
    slots: Arc<Semaphore>,
    /// One compile at a time per tenant: a tenant waits here before it queues for a slot, so the slots'
    /// queue (first come, first served) holds at most one compile of each tenant, and serves tenants in
    /// turn however many uploads one of them sends.
    tenants: PerTenant,
}

/// A turn to compile: held while the compile runs.
pub(super) struct Turn {
    _tenant: OwnedSemaphorePermit,
    _slot: OwnedSemaphorePermit,
}

impl CompileQueue {
    /// A queue running `at_once` compiles at a time.
    pub(super) fn new(at_once: usize) -> CompileQueue {
        CompileQueue {
            slots: Arc::new(Semaphore::new(at_once)),
            tenants: PerTenant::new(1),
        }
    }

    /// Waits for `tenant`'s turn. (Dropping the future leaves the queue.)
    pub(super) async fn turn(&self, tenant: &str) -> Turn {
        // Neither semaphore is ever closed.
        let tenant = self
            .tenants
            .of(tenant)
            .acquire_owned()
            .await
            .expect("never closed");
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        Turn {
            _tenant: tenant,
            _slot: slot,
        }
    }

    /// Forgets the tenants not in `keep` (removed from the config).
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.tenants.retain(keep);
    }
}

/// Each tenant's uploads in progress, at most a fixed number each.
pub(super) struct UploadSlots(PerTenant);

impl UploadSlots {
    /// At most `per_tenant` uploads in progress per tenant.
    pub(super) fn new(per_tenant: usize) -> UploadSlots {
        UploadSlots(PerTenant::new(per_tenant))
    }

    /// A slot for one of `tenant`'s uploads, held until its answer; `None` when all are taken.
    pub(super) fn try_take(&self, tenant: &str) -> Option<OwnedSemaphorePermit> {
        self.0.of(tenant).try_acquire_owned().ok()
    }

    /// How many of `tenant`'s uploads are in progress.
    pub(super) fn in_progress(&self, tenant: &str) -> usize {
        self.0.held(tenant)
    }

    /// How many each tenant may have.
    pub(super) fn per_tenant(&self) -> usize {
        self.0.permits
    }

    /// Forgets the tenants not in `keep` (removed from the config).
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.retain(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_tenant_with_many_compiles_waiting_does_not_hold_up_another_tenants_next_one() {
        let queue = Arc::new(CompileQueue::new(1));
        let running = queue.turn("a").await;
        // Tenant a asks for three more compiles, then b for one.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for tenant in ["a", "a", "a", "b"] {
            let (queue, order) = (queue.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = queue.turn(tenant).await;
                order.lock().unwrap().push(tenant);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(running);
        for task in waiting {
            task.await.unwrap();
        }
        // b's compile came first or second, not after all of a's.
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 4);
        assert!(order.iter().position(|t| *t == "b") <= Some(1), "{order:?}");
    }

    #[test]
    fn a_tenant_has_at_most_its_uploads_in_progress_and_a_finished_one_frees_its_slot() {
        let slots = UploadSlots::new(2);
        let first = slots.try_take("a").unwrap();
        let _second = slots.try_take("a").unwrap();
        assert!(slots.try_take("a").is_none());
        assert!(slots.try_take("b").is_some(), "another tenant has its own");
        drop(first);
        assert!(slots.try_take("a").is_some());
    }

    #[tokio::test]
    async fn two_tenants_compile_at_once_when_there_are_two_slots() {
        let queue = CompileQueue::new(2);
        let _a = queue.turn("a").await;
        let b = tokio::time::timeout(Duration::from_secs(5), queue.turn("b")).await;
        assert!(b.is_ok(), "b waited for a with a slot free");
        let a_again = tokio::time::timeout(Duration::from_millis(50), queue.turn("a")).await;
        assert!(a_again.is_err(), "a compiled twice at once");
    }
}
