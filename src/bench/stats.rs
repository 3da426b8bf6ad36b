//! The statistics Kermit's benchmark script printed for each cell (seed 003), and the
//! correlation of a result with a swept parameter.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub max: f64,
    /// Sample standard deviation (n − 1); 0 for a single value.
    pub std: f64,
}

impl Summary {
    /// None for no values; NaNs are left out.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Summary {
            count: n,
            min: v[0],
            median: percentile(&v, 0.5),
            mean,
            max: v[n - 1],
            std: var.sqrt(),
        })
    }
}

/// The `q` quantile (0..=1) of sorted values, interpolating between neighbours.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// Pearson's correlation coefficient; None when either side does not vary or the lengths
/// differ.
pub fn pearson(xs: &[f64], ys: &[f64]) -> Option<f64> {
    if xs.len() != ys.len() || xs.len() < 2 {
        return None;
    }
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx).powi(2);
        syy += (y - my).powi(2);
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_by_hand() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, squares of deviations 32, sample variance 32/7.
        let s = Summary::of(&[9.0, 4.0, 2.0, 4.0, 5.0, 4.0, 7.0, 5.0]).unwrap();
        assert_eq!(s.count, 8);
        assert_eq!((s.min, s.max, s.mean), (2.0, 9.0, 5.0));
        assert_eq!(s.median, 4.5);
        assert!((s.std - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        let one = Summary::of(&[3.0, f64::NAN]).unwrap();
        assert_eq!((one.count, one.median, one.std), (1, 3.0, 0.0));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [10.0, 20.0, 30.0, 40.0];
        assert_eq!(percentile(&v, 0.5), 25.0);
        assert_eq!(percentile(&v, 0.95), 38.5);
        assert_eq!(percentile(&v, 1.0), 40.0);
        assert_eq!(percentile(&v, 0.0), 10.0);
    }

    #[test]
    fn pearson_by_hand() {
        // x = 1..5, y = 2, 4, 5, 4, 5: mx 3, my 4; sxy = 6, sxx = 10, syy = 6;
        // r = 6 / √60 = 0.7746.
        let r = pearson(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 4.0, 5.0, 4.0, 5.0]).unwrap();
        assert!((r - 6.0 / 60f64.sqrt()).abs() < 1e-12);
        assert!((pearson(&[1.0, 2.0, 3.0], &[6.0, 4.0, 2.0]).unwrap() + 1.0).abs() < 1e-12);
        assert_eq!(pearson(&[1.0, 1.0], &[2.0, 3.0]), None);
        assert_eq!(pearson(&[1.0], &[2.0]), None);
    }
}
