//! Room the tenants share, with parts set aside per tenant: the instance pool's call slots (`max_calls`)
//! and the guests' linear memory (`guest_memory_mib`). A tenant takes from what it reserved first, then
//! from the part nobody reserved. Another tenant's unused reservation is never lent, so a tenant always
//! finds its reservation free, whatever its neighbours hold; what nobody reserved goes first come, first
//! served.
//!
//! Taken and given back rarely (once per call for slots, once per memory growth for bytes), so one
//! mutex is enough.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One kind of room: its capacity, and what each tenant reserved and holds of it.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every tenant's reservation, added up.
    reserved: u64,
    /// What tenants hold beyond their reservations, added up: taken from the part nobody reserved.
    beyond: u64,
    accounts: HashMap<Arc<str>, Account>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    reserved: u64,
    used: u64,
}

impl Account {
    fn beyond(&self) -> u64 {
        self.used.saturating_sub(self.reserved)
    }
}

impl Budget {
    /// `capacity` units, none reserved yet.
    pub fn new(capacity: u64) -> Arc<Budget> {
        Arc::new(Budget {
            capacity,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is reserved from now on: each tenant named gets its amount, every other nothing. What a
    /// tenant holds stays held, even beyond a smaller reservation. The config checks that the
    /// reservations fit the capacity; if they do not (a bug), a tenant still gets its reservation and the
    /// part nobody reserved is empty.
    pub fn reserve<'a>(&self, reservations: impl IntoIterator<Item = (&'a str, u64)>) {
        let mut state = self.state();
        for account in state.accounts.values_mut() {
            account.reserved = 0;
        }
        for (tenant, amount) in reservations {
            state.accounts.entry(tenant.into()).or_default().reserved = amount;
        }
        state.accounts.retain(|_, a| a.reserved > 0 || a.used > 0);
        state.reserved = state.accounts.values().map(|a| a.reserved).sum();
        state.beyond = state.accounts.values().map(Account::beyond).sum();
    }

    /// Takes `amount` for `tenant`: from its reservation while it lasts, the rest from the part nobody
    /// reserved. `false` (and nothing taken) when that part has not enough left.
    pub fn take(&self, tenant: &str, amount: u64) -> bool {
        let mut state = self.state();
        let State {
            reserved,
            beyond,
            accounts,
        } = &mut *state;
        let account = match accounts.get_mut(tenant) {
            Some(account) => account,
            None => accounts.entry(tenant.into()).or_default(),
        };
        let after = Account {
            used: account.used.saturating_add(amount),
            ..*account
        };
        let more = after.beyond() - account.beyond();
        if more > 0 && reserved.saturating_add(*beyond).saturating_add(more) > self.capacity {
            if account.used == 0 && account.reserved == 0 {
                accounts.remove(tenant);
            }
            return false;
        }
        *beyond += more;
        *account = after;
        true
    }

    /// Gives back `amount` that `tenant` took.
    pub fn give(&self, tenant: &str, amount: u64) {
        let mut state = self.state();
        let State {
            beyond, accounts, ..
        } = &mut *state;
        let Some(account) = accounts.get_mut(tenant) else {
            return;
        };
        let before = account.beyond();
        account.used = account.used.saturating_sub(amount);
        *beyond -= before - account.beyond();
        if account.used == 0 && account.reserved == 0 {
            accounts.remove(tenant);
        }
    }

    /// All there is.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What every tenant holds now, added up.
    pub fn used(&self) -> u64 {
        self.state().accounts.values().map(|a| a.used).sum()
    }

    /// What is reserved, added up.
    pub fn reserved(&self) -> u64 {
        self.state().reserved
    }

    /// One tenant's part of this budget.
    pub fn part(self: &Arc<Budget>, tenant: &str) -> Part {
        Part {
            budget: self.clone(),
            tenant: tenant.into(),
        }
    }
}

/// One tenant's part of a [`Budget`]: what its calls take from and give back to.
#[derive(Debug, Clone)]
pub struct Part {
    budget: Arc<Budget>,
    tenant: Arc<str>,
}

impl Part {
    /// See [`Budget::take`].
    pub fn take(&self, amount: u64) -> bool {
        self.budget.take(&self.tenant, amount)
    }

    /// See [`Budget::give`].
    pub fn give(&self, amount: u64) {
        self.budget.give(&self.tenant, amount)
    }

    /// The whole budget's capacity.
    pub fn capacity(&self) -> u64 {
        self.budget.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_finds_its_reservation_free_whatever_its_neighbour_holds() {
        let budget = Budget::new(10);
        budget.reserve([("acme", 4)]);
        // globex reserved nothing: it gets the 6 nobody reserved, and not one of acme's 4.
        assert!((0..6).all(|_| budget.take("globex", 1)));
        assert!(!budget.take("globex", 1));
        assert!((0..4).all(|_| budget.take("acme", 1)));
        // acme past its reservation competes for the unreserved part, which globex holds.
        assert!(!budget.take("acme", 1));
        budget.give("globex", 1);
        assert!(budget.take("acme", 1));
        assert!(!budget.take("globex", 1));
        assert_eq!(budget.used(), 10);
    }

    #[test]
    fn an_unused_reservation_is_held_back_and_a_refusal_takes_nothing() {
        let budget = Budget::new(8);
        budget.reserve([("acme", 5), ("initech", 3)]);
        assert!(!budget.take("globex", 1), "everything is reserved");
        assert!(
            !budget.take("acme", 6),
            "more than acme reserved, and nothing unreserved"
        );
        assert_eq!(budget.used(), 0);
        assert!(budget.take("acme", 5));
        budget.give("acme", 5);
        assert_eq!((budget.used(), budget.reserved()), (0, 8));
    }

    #[test]
    fn what_is_given_back_beyond_a_reservation_frees_the_unreserved_part_first() {
        let budget = Budget::new(10);
        budget.reserve([("acme", 2)]);
        assert!(
            budget.take("acme", 7),
            "2 reserved and 5 of the 8 unreserved"
        );
        assert!(budget.take("globex", 3));
        assert!(!budget.take("globex", 1));
        budget.give("acme", 1);
        assert!(budget.take("globex", 1));
        budget.give("acme", 6);
        assert!(
            budget.take("globex", 4),
            "acme holds none of the unreserved part now"
        );
        assert!(!budget.take("globex", 1));
    }

    #[test]
    fn a_new_reservation_applies_to_what_is_taken_next_and_keeps_what_is_held() {
        let budget = Budget::new(10);
        assert!(budget.take("globex", 9));
        budget.reserve([("acme", 4)]);
        // globex keeps its 9, though only 6 are unreserved now; acme still gets its 4.
        assert!(!budget.take("globex", 1));
        assert!((0..4).all(|_| budget.take("acme", 1)));
        assert_eq!(budget.used(), 13);
        budget.give("globex", 9);
        budget.give("acme", 4);
        budget.reserve([]);
        assert!(budget.take("globex", 10));
        assert!(
            budget.state().accounts.len() == 1,
            "accounts holding nothing are forgotten"
        );
    }
}
