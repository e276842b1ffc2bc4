//! Adaptive idle polling: the fallback when no insert notification arrives. The wait
//! after an empty claim grows from `min` by `factor` up to `max`; any work found brings it
//! back to `min`. One schedule serves all the idle streams of an outbox (see [`super::idle`]).

use std::time::Duration;

use crate::config::PollConfig;

#[derive(Debug, Clone)]
pub struct Poller {
    config: PollConfig,
    current: Duration,
}

impl Poller {
    pub fn new(config: PollConfig) -> Self {
        Self {
            config,
            current: config.min,
        }
    }

    /// The claim found work: poll eagerly again.
    pub fn busy(&mut self) {
        self.current = self.config.min;
    }

    /// The shortest wait, `poll.min`.
    pub fn min(&self) -> Duration {
        self.config.min
    }

    /// How long the next empty claim would wait, without backing off.
    pub fn wait(&self) -> Duration {
        self.current
    }

    /// The claim found nothing: returns how long to wait, and backs off for next time.
    pub fn wait_and_back_off(&mut self) -> Duration {
        let wait = self.current;
        self.current = self
            .current
            .mul_f64(self.config.factor)
            .min(self.config.max);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_while_idle_and_resets_when_busy() {
        let mut poller = Poller::new(PollConfig {
            min: Duration::from_millis(50),
            max: Duration::from_millis(300),
            factor: 2.0,
        });
        let waits: Vec<u128> = (0..5)
            .map(|_| poller.wait_and_back_off().as_millis())
            .collect();
        assert_eq!(waits, [50, 100, 200, 300, 300]);
        poller.busy();
        assert_eq!(poller.wait_and_back_off(), Duration::from_millis(50));
    }
}
