//! Medians and percentiles.

use std::time::Duration;

/// The median of `values`; the mean of the middle two for an even count.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    })
}

/// Table cells for two median rates, ours then raw's, and ours over raw's.
pub(crate) fn ours_and_raw_cells(ours: Option<f64>, raw: Option<f64>) -> String {
    let shown = |rate: Option<f64>| rate.map_or("n/a".to_owned(), |rate| format!("{rate:.0}"));
    let ratio = ours.zip(raw).map_or("n/a".to_owned(), |(ours, raw)| {
        format!("{:.2}×", ours / raw)
    });
    format!(" {} | {} | {ratio} |", shown(ours), shown(raw))
}

/// The lowest and the highest of `values`, all of them at least 0.
pub(crate) fn lowest_and_highest(values: &[f64]) -> (f64, f64) {
    let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = values.iter().copied().fold(0.0, f64::max);
    (lowest, highest)
}

/// Wait-time percentiles of one scenario and implementation, over every round.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waits {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

impl Waits {
    pub(crate) fn of(samples: &[Duration]) -> Option<Waits> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Some(Waits {
            p50: nearest_rank(&sorted, 0.50),
            p99: nearest_rank(&sorted, 0.99),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// The nearest-rank percentile of sorted samples: the smallest sample with at least
/// `fraction` of the samples at or below it.
fn nearest_rank(sorted: &[Duration], fraction: f64) -> Duration {
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranks() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let waits = Waits::of(&samples).unwrap();
        assert_eq!(waits.p50, Duration::from_millis(50));
        assert_eq!(waits.p99, Duration::from_millis(99));
        assert_eq!(waits.max, Duration::from_millis(100));
    }
}
