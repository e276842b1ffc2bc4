//! The retry policy of an outbox: exponential backoff with proportional jitter, and
//! dead-lettering once `max_attempts` is used up.

use std::time::Duration;

use rand::Rng;

use crate::config::BackoffConfig;
use crate::storage::{FailureDecision, RetryPolicy};

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    config: BackoffConfig,
    max_attempts: u32,
}

impl Backoff {
    pub fn new(config: BackoffConfig, max_attempts: u32) -> Self {
        Self {
            config,
            max_attempts,
        }
    }

    /// The delay before retry number `attempt` (1-based) without jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(1024) as i32;
        let raw = self.config.base.as_secs_f64() * self.config.factor.powi(exponent);
        let capped = raw.min(self.config.maximum.as_secs_f64());
        Duration::from_secs_f64(capped)
    }

    /// The delay before retry number `attempt`, jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        let jitter = self.config.jitter;
        if jitter == 0.0 {
            return base;
        }
        let factor = rand::rng().random_range(1.0 - jitter..=1.0 + jitter);
        base.mul_f64(factor)
    }
}

impl RetryPolicy for Backoff {
    fn on_failure(&self, attempts: u32, requested_delay: Option<Duration>) -> FailureDecision {
        if attempts >= self.max_attempts {
            return FailureDecision::DeadLetter;
        }
        let delay = match requested_delay {
            // A client-given delay (say, a broker's Retry-After) is honoured within limits.
            Some(requested) => requested.min(self.config.maximum),
            None => self.delay(attempts),
        };
        FailureDecision::RetryAfter(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(jitter: f64) -> Backoff {
        Backoff::new(
            BackoffConfig {
                base: Duration::from_secs(1),
                factor: 2.0,
                maximum: Duration::from_secs(10),
                jitter,
            },
            5,
        )
    }

    #[test]
    fn grows_by_factor_up_to_the_maximum() {
        let delays: Vec<u64> = (1..=6).map(|n| backoff(0.0).delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(0.0).delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_its_band() {
        for _ in 0..1000 {
            let delay = backoff(0.25).delay(3).as_secs_f64();
            assert!((3.0..=5.0).contains(&delay), "{delay}");
        }
    }

    #[test]
    fn last_attempt_dead_letters() {
        assert_eq!(
            backoff(0.0).on_failure(5, None),
            FailureDecision::DeadLetter
        );
        assert_eq!(
            backoff(0.0).on_failure(4, None),
            FailureDecision::RetryAfter(Duration::from_secs(8))
        );
    }

    #[test]
    fn requested_delay_is_capped_at_the_maximum() {
        let requested = Some(Duration::from_secs(3600));
        assert_eq!(
            backoff(0.0).on_failure(1, requested),
            FailureDecision::RetryAfter(Duration::from_secs(10))
        );
    }
}
