//! When to dial again: the protocol's schedule (0, 1, 2, 4, 8, 16, then 30 s), with jitter so that hosts
//! that lost Sent together do not come back in lockstep (the first attempt too, within half a second), and
//! never past 30 s.

use std::time::Duration;

/// The longest wait before another attempt to connect.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How far a delay may stray from the schedule, either way (a quarter).
pub const JITTER: f64 = 0.25;

/// The scheduled delay before attempt `attempt`, as the official SDKs: 0, 1, 2, 4, 8, 16, then 30 s.
pub fn scheduled(attempt: u32) -> Duration {
    if attempt == 0 {
        Duration::ZERO
    } else {
        MAX_BACKOFF.min(Duration::from_secs(1u64 << (attempt - 1).min(5)))
    }
}

/// The spread of the first attempt: up to this long, so that hosts that lost Sent together do not all
/// redial in the same instant.
pub const FIRST_SPREAD: Duration = Duration::from_millis(500);

/// [scenario: flapping_connection_backs_off] The delay before attempt `attempt`: the schedule, moved by up
/// to a quarter either way by `unit` (uniform in 0..1), never past [`MAX_BACKOFF`]; the first attempt
/// within [`FIRST_SPREAD`].
pub fn delay(attempt: u32, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    if attempt == 0 {
        return FIRST_SPREAD.mul_f64(unit);
    }
    let factor = 1.0 - JITTER + 2.0 * JITTER * unit;
    scheduled(attempt).mul_f64(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_doubles_up_to_thirty_seconds() {
        let delays: Vec<u64> = (0..8).map(|a| scheduled(a).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(scheduled(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn jitter_stays_within_a_quarter_of_the_schedule_and_spreads_hosts() {
        for attempt in 1..6 {
            let base = scheduled(attempt).as_secs_f64();
            let low = delay(attempt, 0.0).as_secs_f64();
            let high = delay(attempt, 1.0).as_secs_f64();
            assert!((low - base * 0.75).abs() < 1e-9 && (high - base * 1.25).abs() < 1e-9);
        }
        // Never past the cap, the jitter's high side included.
        for attempt in 6..40 {
            assert!(delay(attempt, 1.0) <= MAX_BACKOFF, "{attempt}");
            assert!(delay(attempt, 0.0) >= MAX_BACKOFF.mul_f64(0.75));
        }
        // The first attempt is spread too, within half a second.
        assert_eq!(delay(0, 0.0), Duration::ZERO);
        assert!(delay(0, 0.9) > Duration::ZERO && delay(0, 1.0) <= FIRST_SPREAD);
        // Two hosts drawing different units come back at different times.
        assert_ne!(delay(3, 0.1), delay(3, 0.7));
    }
}
