//! Calendar arithmetic for MDTM, MLSx `modify` facts and LIST dates, in UTC. The caller passes
//! the time; nothing here reads a clock.

/// A UTC date and time broken into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// RFC 3659's `time-val` (MDTM's and the MLSx `modify` fact's form), written where it goes:
/// a listing writes one per entry.
impl std::fmt::Display for Civil {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04}{:02}{:02}{:02}{:02}{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

impl Civil {
    /// Converts seconds since the Unix epoch (Howard Hinnant's days-to-civil algorithm).
    pub fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Civil {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// The inverse of [`Civil::from_unix`].
    pub fn to_unix(&self) -> i64 {
        let y = self.year - i64::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }

    /// RFC 3659 `time-val`: YYYYMMDDHHMMSS.
    pub fn mdtm(&self) -> String {
        self.to_string()
    }

    /// Parses an RFC 3659 `time-val`, ignoring a fractional part.
    pub fn parse_mdtm(s: &str) -> Option<Civil> {
        let s = s.split('.').next()?;
        if s.len() != 14 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n = |a: usize, b: usize| s[a..b].parse::<u32>().ok();
        let c = Civil {
            year: i64::from(n(0, 4)?),
            month: n(4, 6)?,
            day: n(6, 8)?,
            hour: n(8, 10)?,
            minute: n(10, 12)?,
            second: n(12, 14)?,
        };
        let valid = (1..=12).contains(&c.month)
            && (1..=31).contains(&c.day)
            && c.hour < 24
            && c.minute < 60
            && c.second < 61;
        valid.then_some(c)
    }

    pub fn month_abbrev(&self) -> &'static str {
        const M: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        M[(self.month as usize).saturating_sub(1).min(11)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_dates() {
        assert_eq!(Civil::from_unix(0).mdtm(), "19700101000000");
        assert_eq!(Civil::from_unix(951_782_400).mdtm(), "20000229000000");
        assert_eq!(Civil::from_unix(1_795_340_180).mdtm(), "20261122093620");
        assert_eq!(Civil::from_unix(-1).mdtm(), "19691231235959");
        assert_eq!(
            Civil::parse_mdtm("20000229000000.123").unwrap().to_unix(),
            951_782_400
        );
        assert_eq!(Civil::parse_mdtm("2000022900000"), None);
    }

    proptest! {
        #[test]
        fn unix_civil_round_trip(t in -10_000_000_000i64..100_000_000_000) {
            let c = Civil::from_unix(t);
            prop_assert_eq!(c.to_unix(), t);
            if c.year >= 1000 && c.year <= 9999 {
                prop_assert_eq!(Civil::parse_mdtm(&c.mdtm()).unwrap(), c);
            }
        }
    }
}
