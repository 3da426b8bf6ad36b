//! Link parameters as people write them: `1.536mbit`, `295ms`, `64pkt`, `60kB`, `1e-6`.

use super::model::{Nanos, QueueLimit};

/// Bits per second from `1.536mbit`, `50Mbit`, `14.4kbit`, `1gbit` or a plain number of bit/s.
/// Decimal multipliers, as link rates are quoted.
pub fn rate(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (number, scale) = split_unit(&lower);
    let scale = match scale {
        "" | "bit" | "bps" => 1.0,
        "kbit" | "kbps" => 1e3,
        "mbit" | "mbps" => 1e6,
        "gbit" | "gbps" => 1e9,
        _ => return Err(format!("{s:?}: rate units are bit, kbit, mbit or gbit")),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a rate (e.g. 1.536mbit)"))?;
    let bps = v * scale;
    if !(bps >= 1.0 && bps.is_finite()) {
        return Err(format!("{s:?}: a rate must be at least 1 bit/s"));
    }
    Ok(bps.round() as u64)
}

/// A delay from `295ms`, `1.5s`, `250us`; a plain number is milliseconds.
pub fn delay(s: &str) -> Result<Nanos, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (number, unit) = split_unit(&lower);
    let scale = match unit {
        "" | "ms" => 1e6,
        "s" => 1e9,
        "us" => 1e3,
        _ => return Err(format!("{s:?}: delay units are s, ms or us")),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a delay (e.g. 295ms)"))?;
    if !(v >= 0.0 && v.is_finite() && v * scale < 3.6e12) {
        return Err(format!("{s:?}: a delay is between 0 and an hour"));
    }
    Ok((v * scale).round() as Nanos)
}

/// A queue bound: `64pkt` (packets) or `60kB`, `1.5MB`, `64KiB`, `9000B` (bytes).
pub fn queue(s: &str) -> Result<QueueLimit, String> {
    let t = s.trim();
    let (number, unit) = split_unit(t);
    let v: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a queue size (e.g. 64pkt or 60kB)"))?;
    let bytes = |scale: f64| QueueLimit::Bytes((v * scale).round() as u64);
    let q = match unit {
        "pkt" | "pkts" | "p" => QueueLimit::Packets(v.round() as u64),
        "B" | "b" => bytes(1.0),
        "kB" | "KB" | "kb" => bytes(1e3),
        "MB" | "mb" => bytes(1e6),
        "KiB" => bytes(1024.0),
        "MiB" => bytes(1024.0 * 1024.0),
        _ => return Err(format!("{s:?}: queue units are pkt, B, kB, MB, KiB or MiB")),
    };
    match q {
        QueueLimit::Packets(0) | QueueLimit::Bytes(0) => {
            Err(format!("{s:?}: a queue must hold something"))
        }
        _ if !(v.is_finite() && v > 0.0) => Err(format!("{s:?}: a queue must hold something")),
        q => Ok(q),
    }
}

/// A probability such as `1e-6` or `0.01`.
pub fn probability(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a probability (e.g. 1e-5)"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?}: a probability is between 0 and 1"))
    }
}

/// Splits `1.5ms` into `1.5` and `ms`. No unit starts with `e`, so an `e` belongs to the
/// number (`1e-6`).
fn split_unit(s: &str) -> (&str, &str) {
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(s.len());
    (&s[..at], &s[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_as_written_in_the_scenarios() {
        assert_eq!(rate("1.536mbit"), Ok(1_536_000));
        assert_eq!(rate("14.4kbit"), Ok(14_400));
        assert_eq!(rate("500Mbit"), Ok(500_000_000));
        assert_eq!(rate("9600"), Ok(9600));
        assert!(rate("fast").is_err() && rate("0mbit").is_err() && rate("3mb").is_err());
        assert_eq!(delay("295ms"), Ok(295_000_000));
        assert_eq!(delay("1.5s"), Ok(1_500_000_000));
        assert_eq!(delay("250us"), Ok(250_000));
        assert_eq!(delay("0"), Ok(0));
        assert!(delay("-1ms").is_err() && delay("3h").is_err());
        assert_eq!(queue("64pkt"), Ok(QueueLimit::Packets(64)));
        assert_eq!(queue("60kB"), Ok(QueueLimit::Bytes(60_000)));
        assert_eq!(queue("64KiB"), Ok(QueueLimit::Bytes(65_536)));
        assert!(queue("0pkt").is_err() && queue("lots").is_err());
        assert_eq!(probability("1e-6"), Ok(1e-6));
        assert!(probability("2").is_err() && probability("x").is_err());
    }
}
