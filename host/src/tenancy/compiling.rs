//! Uploads in progress and whose compile runs when. A tenant has a few uploads in progress at most (one
//! more is refused at once, before its body is read). Compiles run a few at once across the host, one at
//! a time per tenant, in the order asked: a tenant that uploads many slow components waits for its own;
//! another tenant's upload takes the next free slot. Loading from the compiled cache never queues (see
//! `Tenancy::load`). The time a tenant's compiles hold a slot, refused ones included, is charged to its
//! compile time per hour: a tenant that has spent it waits until it refills.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// Compile time each tenant may take: `per_hour` seconds of a slot, as a balance that refills
/// continuously up to `per_hour`. A compile is charged once it ends, and the balance is checked when a
/// compile is asked for and again when the tenant's previous compile has ended, so a balance goes below
/// zero by one compile at most (its deadline); the tenant's next compile waits until it is above zero.
struct CompileTime {
    per_hour: Duration,
    /// Each tenant's balance, in seconds, and when it was last brought up to date.
    balances: Mutex<BTreeMap<String, (f64, Instant)>>,
}

impl CompileTime {
    /// Seconds of balance gained per second.
    fn rate(&self) -> f64 {
        self.per_hour.as_secs_f64() / 3600.0
    }

    /// Brings `tenant`'s balance up to now, adds `change`, and returns it.
    fn update(&self, tenant: &str, change: f64) -> f64 {
        let now = Instant::now();
        let full = self.per_hour.as_secs_f64();
        let mut balances = self.balances.lock().unwrap_or_else(|p| p.into_inner());
        let (balance, at) = balances.entry(tenant.to_string()).or_insert((full, now));
        let refilled = *balance + now.duration_since(*at).as_secs_f64() * self.rate();
        *balance = refilled.min(full) + change;
        *at = now;
        *balance
    }

    /// `Err(wait)` while `tenant` has spent its compile time.
    fn check(&self, tenant: &str) -> Result<(), Duration> {
        let balance = self.update(tenant, 0.0);
        if balance > 0.0 {
            return Ok(());
        }
        // Until the balance is a second above zero.
        Err(Duration::from_secs_f64((1.0 - balance) / self.rate()))
    }

    fn charge(&self, tenant: &str, spent: Duration) {
        self.update(tenant, -spent.as_secs_f64());
    }
}

/// Who pays for a compile's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Payer {
    /// The tenant, whose upload, activation or rollback asked for it: charged, and refused while the
    /// tenant has spent its compile time.
    Tenant,
    /// The host, compiling an active version at start (the cache was emptied by an upgrade): neither.
    Host,
}

/// The queue of compiles.
pub(super) struct CompileQueue {
    /// Compiles at once across tenants.
    slots: Arc<Semaphore>,
    /// One compile at a time per tenant: a tenant waits here before it queues for a slot, so the slots'
    /// queue (first come, first served) holds at most one compile of each tenant, and serves tenants in
    /// turn however many uploads one of them sends.
    tenants: PerTenant,
    time: Arc<CompileTime>,
}

/// A turn to compile: held while the compile runs; the time it was held is charged to its tenant when
/// it is dropped, however the compile ended.
pub(super) struct Turn {
    _tenant: OwnedSemaphorePermit,
    _slot: OwnedSemaphorePermit,
    charge: Option<(Arc<CompileTime>, String, Instant)>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((time, tenant, since)) = self.charge.take() {
            time.charge(&tenant, since.elapsed());
        }
    }
}

impl CompileQueue {
    /// A queue running `at_once` compiles at a time, each tenant's taking at most `per_hour` of a slot's
    /// time per hour.
    pub(super) fn new(at_once: usize, per_hour: Duration) -> CompileQueue {
        CompileQueue {
            slots: Arc::new(Semaphore::new(at_once)),
            tenants: PerTenant::new(1),
            time: Arc::new(CompileTime {
                per_hour,
                balances: Mutex::default(),
            }),
        }
    }

    /// Waits for `tenant`'s turn (dropping the future leaves the queue); `Err(wait)` at once when `payer`
    /// is the tenant and it has spent its compile time.
    pub(super) async fn turn(&self, tenant: &str, payer: Payer) -> Result<Turn, Duration> {
        if payer == Payer::Tenant {
            self.time.check(tenant)?;
        }
        // Neither semaphore is ever closed.
        let tenant_permit = self
            .tenants
            .of(tenant)
            .acquire_owned()
            .await
            .expect("never closed");
        // Again: the tenant's compile before this one, charged as its turn ended, may have spent it.
        if payer == Payer::Tenant {
            self.time.check(tenant)?;
        }
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        Ok(Turn {
            _tenant: tenant_permit,
            _slot: slot,
            charge: (payer == Payer::Tenant)
                .then(|| (self.time.clone(), tenant.to_string(), Instant::now())),
        })
    }

    /// `Err(wait)` while `tenant` has spent its compile time (checked again when its turn is asked for).
    pub(super) fn may_compile(&self, tenant: &str) -> Result<(), Duration> {
        self.time.check(tenant)
    }

    /// The compile time each tenant may take per hour.
    pub(super) fn per_hour(&self) -> Duration {
        self.time.per_hour
    }

    /// Forgets the tenants not in `keep` (removed from the config).
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.tenants.retain(&keep);
        self.time
            .balances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|tenant, _| keep(tenant));
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

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_tenant_with_many_compiles_waiting_does_not_hold_up_another_tenants_next_one() {
        let queue = Arc::new(CompileQueue::new(1, HOUR));
        let running = queue.turn("a", Payer::Tenant).await.unwrap();
        // Tenant a asks for three more compiles, then b for one.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for tenant in ["a", "a", "a", "b"] {
            let (queue, order) = (queue.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = queue.turn(tenant, Payer::Tenant).await.unwrap();
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
        let queue = CompileQueue::new(2, HOUR);
        let _a = queue.turn("a", Payer::Tenant).await;
        let b = tokio::time::timeout(Duration::from_secs(5), queue.turn("b", Payer::Tenant)).await;
        assert!(b.is_ok(), "b waited for a with a slot free");
        let a_again =
            tokio::time::timeout(Duration::from_millis(50), queue.turn("a", Payer::Tenant)).await;
        assert!(a_again.is_err(), "a compiled twice at once");
    }

    #[tokio::test]
    async fn a_tenant_that_spent_its_compile_time_waits_for_it_to_refill_and_others_do_not() {
        // 36 s an hour: a hundredth of a second per second.
        let queue = CompileQueue::new(2, Duration::from_secs(36));
        let turn = queue.turn("a", Payer::Tenant).await.unwrap();
        // Its compile held the slot for 40 s (however it ended): 4 s more than it had.
        queue.time.charge("a", Duration::from_secs(40));
        drop(turn);
        let wait = queue
            .turn("a", Payer::Tenant)
            .await
            .err()
            .expect("a has spent its time");
        assert!(
            (400..=520).contains(&wait.as_secs()),
            "4 s and a second at 0.01 s per second: {wait:?}"
        );
        assert!(
            queue.turn("b", Payer::Tenant).await.is_ok(),
            "b has its own"
        );
        assert!(
            queue.turn("a", Payer::Host).await.is_ok(),
            "what the host compiles is never refused"
        );
    }

    #[tokio::test]
    async fn a_compile_that_waited_behind_its_tenants_last_one_is_refused_if_that_one_spent_the_time(
    ) {
        let queue = Arc::new(CompileQueue::new(2, Duration::from_secs(36)));
        let first = queue.turn("a", Payer::Tenant).await.unwrap();
        // Asked while the balance was still full: it waits for a's first compile.
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move { queue.turn("a", Payer::Tenant).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        queue.time.charge("a", Duration::from_secs(40));
        drop(first);
        assert!(waiting.await.unwrap().is_err(), "it went past the balance");
    }
}
