//! Summaries of repeated measurements: median with its spread, percentiles, and ratios
//! taken run by run.

use std::collections::BTreeMap;

/// The median of some samples and their spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: usize,
}

impl Figure {
    /// `None` without samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            samples: n,
        })
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Every measured value, by name and run (a run whose measurement failed has no value).
#[derive(Debug, Default)]
pub struct Measurements {
    values: BTreeMap<String, BTreeMap<usize, f64>>,
    /// What the table must say besides its figures (a section that could not run).
    notes: Vec<String>,
}

impl Measurements {
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Records `value` of `name` in run (or sample) number `run`.
    pub fn record(&mut self, name: impl Into<String>, run: usize, value: f64) {
        self.values
            .entry(name.into())
            .or_default()
            .insert(run, value);
    }

    /// Whether `name` has a value in run `run`.
    pub fn has(&self, name: &str, run: usize) -> bool {
        self.values
            .get(name)
            .is_some_and(|runs| runs.contains_key(&run))
    }

    pub fn figure(&self, name: &str) -> Option<Figure> {
        let values: Vec<f64> = self.values.get(name)?.values().copied().collect();
        Figure::of(&values)
    }

    /// `a / b` computed within each run that has both, then summarised: ratios never
    /// mix runs.
    pub fn ratio(&self, a: &str, b: &str) -> Option<Figure> {
        let (a, b) = (self.values.get(a)?, self.values.get(b)?);
        let ratios: Vec<f64> = a
            .iter()
            .filter_map(|(run, a)| Some(a / b.get(run)?))
            .collect();
        Figure::of(&ratios)
    }

    /// Every series (name to values in run order), for the JSON output.
    pub fn all(&self) -> BTreeMap<&str, Vec<f64>> {
        self.values
            .iter()
            .map(|(name, runs)| (name.as_str(), runs.values().copied().collect()))
            .collect()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_spread_and_percentiles() {
        let f = Figure::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((f.median, f.min, f.max), (2.0, 1.0, 3.0));
        assert_eq!(Figure::of(&[1.0, 2.0, 4.0, 8.0]).unwrap().median, 3.0);
        assert!(Figure::of(&[]).is_none());
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), 50.0);
        assert_eq!(percentile(&sorted, 99.0), 99.0);
        assert_eq!(percentile(&sorted, 100.0), 100.0);
    }

    #[test]
    fn ratios_pair_values_of_the_same_run() {
        let mut m = Measurements::default();
        for (run, (a, b)) in [(10.0, 5.0), (30.0, 10.0), (8.0, 8.0)]
            .into_iter()
            .enumerate()
        {
            m.record("a", run, a);
            m.record("b", run, b);
        }
        m.record("a", 3, 100.0);
        let r = m.ratio("a", "b").unwrap();
        assert_eq!((r.median, r.min, r.max, r.samples), (2.0, 1.0, 3.0, 3));
    }
}
