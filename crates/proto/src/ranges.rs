//! Sets of byte ranges: what a receiver already holds, for `111 Range Marker`, `REST a-b,c-d`
//! and the resume sidecar.
//!
//! Ranges are half-open, `start-end` with `end` exclusive, as the Globus server writes them
//! (`111 Range Marker 0-20000000` for a 20,000,000-byte file). GFD.20's example reads as
//! inclusive; braid takes the deployed form.

use std::fmt;

/// Disjoint, sorted, non-empty half-open ranges; touching ranges are merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad byte range list {0:?}: expected start-end[,start-end...] with start <= end")]
pub struct BadRanges(pub String);

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `[start, end)`. Cost is linear in the number of ranges, which stays small: blocks
    /// arrive roughly in order, so neighbours merge.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // First range that ends at or after `start` (could touch or overlap).
        let i = self.ranges.partition_point(|&(_, e)| e < start);
        let mut j = i;
        let (mut s, mut e) = (start, end);
        while j < self.ranges.len() && self.ranges[j].0 <= e {
            s = s.min(self.ranges[j].0);
            e = e.max(self.ranges[j].1);
            j += 1;
        }
        self.ranges.splice(i..j, [(s, e)]);
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many separate ranges there are (what a marker or a sidecar spells out).
    pub fn pieces(&self) -> usize {
        self.ranges.len()
    }

    /// Total bytes covered.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// The covered parts of `[start, end)`, in order.
    pub fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges[i..]
            .iter()
            .take_while(move |&&(s, _)| s < end)
            .map(move |&(s, e)| (s.max(start), e.min(end)))
    }

    /// How many bytes of `[start, end)` are already covered.
    pub fn overlap(&self, start: u64, end: u64) -> u64 {
        self.within(start, end).map(|(s, e)| e - s).sum()
    }

    /// Whether `[start, end)` is wholly covered.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges
            .get(i)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }

    /// The parts of `[0, size)` not covered: what is still to be sent.
    pub fn missing(&self, size: u64) -> RangeSet {
        let mut out = RangeSet::new();
        let mut at = 0;
        for &(s, e) in &self.ranges {
            if s >= size {
                break;
            }
            if s > at {
                out.ranges.push((at, s));
            }
            at = at.max(e);
        }
        if at < size {
            out.ranges.push((at, size));
        }
        out
    }

    /// Parses `a-b,c-d` (spaces around commas tolerated). Overlaps and any order are allowed,
    /// as GFD.20 allows them in concatenated markers.
    pub fn parse(s: &str) -> Result<RangeSet, BadRanges> {
        let bad = || BadRanges(s.chars().take(80).collect());
        let mut set = RangeSet::new();
        for part in s.split(',') {
            let (a, b) = part.trim().split_once('-').ok_or_else(bad)?;
            let a: u64 = a.parse().map_err(|_| bad())?;
            let b: u64 = b.parse().map_err(|_| bad())?;
            if a > b {
                return Err(bad());
            }
            set.insert(a, b);
        }
        Ok(set)
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (s, e)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{s}-{e}")?;
        }
        Ok(())
    }
}

impl FromIterator<(u64, u64)> for RangeSet {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(iter: I) -> RangeSet {
        let mut set = RangeSet::new();
        for (s, e) in iter {
            set.insert(s, e);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model(ranges: &[(u64, u64)], size: u64) -> Vec<bool> {
        let mut bits = vec![false; size as usize];
        for &(s, e) in ranges {
            for b in bits.iter_mut().take(e.min(size) as usize).skip(s as usize) {
                *b = true;
            }
        }
        bits
    }

    proptest! {
        #[test]
        fn behaves_like_a_bitmap(ranges in proptest::collection::vec((0u64..200, 0u64..40), 0..20)) {
            let ranges: Vec<(u64, u64)> = ranges.into_iter().map(|(s, l)| (s, s + l)).collect();
            let set: RangeSet = ranges.iter().copied().collect();
            let bits = model(&ranges, 260);
            prop_assert_eq!(set.len(), bits.iter().filter(|b| **b).count() as u64);
            let pieces: Vec<_> = set.iter().collect();
            for w in pieces.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "not disjoint and merged: {:?}", pieces);
            }
            let missing = set.missing(250);
            for (i, b) in bits.iter().enumerate().take(250) {
                prop_assert_eq!(missing.covers(i as u64, i as u64 + 1), !*b);
                prop_assert_eq!(set.covers(i as u64, i as u64 + 1), *b);
            }
            prop_assert_eq!(RangeSet::parse(&set.to_string()).ok().filter(|_| !set.is_empty()), (!set.is_empty()).then(|| set.clone()));
            for (a, b) in [(0u64, 250u64), (17, 18), (30, 90), (100, 100), (199, 260)] {
                let covered = bits[a as usize..b as usize].iter().filter(|x| **x).count() as u64;
                prop_assert_eq!(set.overlap(a, b), covered);
            }
        }
    }

    #[test]
    fn parses_the_forms_gfd20_allows() {
        // Exclusive ends: 0-30 and 30-90 touch and merge; 0-29,30-89 leaves byte 29 out.
        let a = RangeSet::parse("0-30,30-90").unwrap();
        assert_eq!(a.to_string(), "0-90");
        assert_eq!(RangeSet::parse("30-60, 0-30,60-90").unwrap(), a);
        assert_eq!(
            RangeSet::parse("0-29,30-89")
                .unwrap()
                .missing(90)
                .to_string(),
            "29-30,89-90"
        );
        assert!(RangeSet::parse("5-3").is_err());
        assert!(RangeSet::parse("x").is_err());
        assert!(RangeSet::parse("").is_err());
        assert!(RangeSet::parse("1-99999999999999999999").is_err());
    }
}
