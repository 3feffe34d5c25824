//! How often the admin API answers: failed logins per client address (a token cannot be guessed at
//! speed), requests per tenant (one tenant's script cannot take the admin API from the others), and
//! renderings of a tenant's metrics (each costs up to 30 KiB and 80 µs per agent).
//! GCRA buckets from `governor`, keyed; the map of client addresses is bounded.

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Client addresses remembered at most; past it, failed logins are refused from every address until
/// the stale ones are forgotten (a flood from many addresses gets 429s, never more memory).
const MAX_CLIENTS: usize = 10_000;

/// The admin API's rate limits.
pub(super) struct Rates {
    failed_logins: DefaultKeyedRateLimiter<Option<IpAddr>>,
    /// Clients refused for failing too often, until when: looked at before a request's token is hashed
    /// (the limiter itself cannot be asked without counting). At most [`MAX_CLIENTS`].
    refused: Mutex<HashMap<Option<IpAddr>, Instant>>,
    requests: DefaultKeyedRateLimiter<String>,
    /// Renderings of each tenant's `/v1/metrics`.
    renders: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

/// Renderings of one tenant's metrics per second: scrapers ask every few seconds.
pub const RENDERS_PER_SECOND: u32 = 1;

impl Rates {
    /// `failed_logins_per_minute` per client address (in a burst, then one per interval), and
    /// `requests_per_second` per tenant (with a burst of twice that).
    pub(super) fn new(failed_logins_per_minute: u32, requests_per_second: u32) -> Rates {
        let per_minute = NonZeroU32::new(failed_logins_per_minute.max(1)).expect("not zero");
        let per_second = NonZeroU32::new(requests_per_second.max(1)).expect("not zero");
        let burst = per_second.saturating_mul(NonZeroU32::new(2).expect("not zero"));
        Rates {
            failed_logins: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
            refused: Mutex::new(HashMap::new()),
            requests: DefaultKeyedRateLimiter::keyed(
                Quota::per_second(per_second).allow_burst(burst),
            ),
            renders: DefaultKeyedRateLimiter::keyed(Quota::per_second(
                NonZeroU32::new(RENDERS_PER_SECOND).expect("not zero"),
            )),
            clock: DefaultClock::default(),
        }
    }

    /// How long `client` must wait when it has failed too often lately; asked before anything else, so a
    /// refused client costs no hashing.
    pub(super) fn login_refused(&self, client: Option<IpAddr>) -> Option<Duration> {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        let until = *refused.get(&client)?;
        until.checked_duration_since(Instant::now())
    }

    /// Counts a failed login from `client` (unknown without an address); `Err(wait)` when it has failed
    /// too often, with how long until it may try again.
    pub(super) fn failed_login(&self, client: Option<IpAddr>) -> Result<(), Duration> {
        if self.failed_logins.len() >= MAX_CLIENTS {
            self.failed_logins.retain_recent();
            if self.failed_logins.len() >= MAX_CLIENTS {
                return Err(Duration::from_secs(60));
            }
        }
        let Err(not_until) = self.failed_logins.check_key(&client) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(self.clock.now());
        let now = Instant::now();
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if refused.len() >= MAX_CLIENTS {
            refused.retain(|_, until| *until > now);
        }
        if refused.len() < MAX_CLIENTS {
            refused.insert(client, now + wait);
        }
        Err(wait)
    }

    /// Counts a request of `tenant`; `Err(wait)` when it asks faster than it may.
    pub(super) fn request(&self, tenant: &str) -> Result<(), Duration> {
        self.requests
            .check_key(&tenant.to_string())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Counts a rendering of `tenant`'s metrics; `Err(wait)` when it had one less than a second ago.
    pub(super) fn render(&self, tenant: &str) -> Result<(), Duration> {
        self.renders
            .check_key(&tenant.to_string())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_failing_to_log_in_too_often_is_told_to_wait_and_others_are_not() {
        let rates = Rates::new(3, 100);
        let attacker = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..3 {
            assert!(rates.failed_login(attacker).is_ok());
        }
        let wait = rates.failed_login(attacker).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(rates
            .failed_login(Some(IpAddr::from([10, 0, 0, 2])))
            .is_ok());
    }

    #[test]
    fn a_client_refused_for_failing_is_refused_before_its_next_attempt_is_looked_at() {
        let rates = Rates::new(2, 100);
        let attacker = Some(IpAddr::from([10, 0, 0, 1]));
        assert_eq!(rates.login_refused(attacker), None);
        for _ in 0..2 {
            assert!(rates.failed_login(attacker).is_ok());
            assert_eq!(rates.login_refused(attacker), None);
        }
        assert!(rates.failed_login(attacker).is_err());
        assert!(rates.login_refused(attacker).is_some());
        assert_eq!(rates.login_refused(Some(IpAddr::from([10, 0, 0, 2]))), None);
    }

    #[test]
    fn a_tenant_asking_faster_than_it_may_is_told_to_wait_and_others_are_not() {
        let rates = Rates::new(10, 5);
        for _ in 0..10 {
            assert!(rates.request("acme").is_ok());
        }
        assert!(rates.request("acme").is_err());
        assert!(rates.request("globex").is_ok());
    }

    #[test]
    fn a_tenants_metrics_are_rendered_once_a_second_at_most_and_anothers_are_not_held_back() {
        let rates = Rates::new(10, 100);
        assert!(rates.render("acme").is_ok());
        let wait = rates.render("acme").unwrap_err();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        assert!(rates.render("globex").is_ok());
    }

    #[test]
    fn a_flood_of_failed_logins_from_many_addresses_is_refused_without_remembering_more_of_them() {
        let rates = Rates::new(1, 100);
        for n in 0..(MAX_CLIENTS as u32 + 500) {
            let _ = rates.failed_login(Some(IpAddr::from(n.to_be_bytes())));
        }
        assert!(rates.failed_logins.len() <= MAX_CLIENTS);
    }
}
