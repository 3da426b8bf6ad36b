//! `OPTS RETR` (GFD.20): how the server sends a MODE E download, built by the client and
//! parsed by the server with the same type.
//!
//! `Parallelism=start,min,max;` (like the Globus server, braid uses `start` for the
//! connections it opens itself), `blocksize=n;` (a whole number of checksum chunks), and as a
//! braid extension `MaxRate=n;`: a cap on the server's sending rate in bytes/s (0 lifts it),
//! which a braid client may also send while a download runs, and `Congestion=name;`: the
//! TCP congestion control the server's data connections use (bbr, cubic, reno, ...), and
//! `Dscp=n;`: the DSCP (0-63) its data packets carry, e.g. 1 for lower effort (RFC 8622),
//! which background mode asks for, and `Background=ms;`: the server steers its sending rate with
//! background mode's controller itself, adding at most that much queueing delay, from the
//! round trip its data connections see (a copy between servers, whose path the client cannot
//! probe); 0 turns it off. Other options (markers,
//! windowsize, ...) are accepted and ignored, as GFD.20 allows.

use crate::checksum::CHUNK;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetrOpts {
    /// `(start, min, max)` connections.
    pub parallelism: Option<(u32, u32, u32)>,
    pub block_size: Option<u64>,
    /// `Some(0)`: no cap.
    pub max_rate: Option<u64>,
    pub congestion: Option<CcName>,
    /// The data connections' DSCP.
    pub dscp: Option<u8>,
    /// The server yields to other traffic on its own (background mode's controller), adding
    /// at most this many milliseconds of queueing delay; 0: no longer; None leaves it as it was.
    pub background: Option<u32>,
}

/// The name of a TCP congestion control (`TCP_CONGESTION`): at most 15 bytes of lower-case
/// letters, digits and `_`, as Linux names them. A value type, so settings stay `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CcName {
    len: u8,
    bytes: [u8; 15],
}

impl CcName {
    pub fn parse(name: &str) -> Result<CcName, String> {
        let ok = !name.is_empty()
            && name.len() <= 15
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(format!(
                "{name:?} is not a congestion control name (e.g. bbr, cubic, reno)"
            ));
        }
        let mut bytes = [0u8; 15];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(CcName {
            len: name.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for CcName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for CcName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Largest queueing delay a background download may be asked to add, ms.
pub const MAX_BACKGROUND_MS: u32 = 10_000;

/// Largest block size accepted.
pub const MAX_BLOCK: u64 = 1 << 30;

impl RetrOpts {
    pub fn parse(opts: &str) -> Result<RetrOpts, String> {
        let mut out = RetrOpts::default();
        for opt in opts.split(';').map(str::trim).filter(|o| !o.is_empty()) {
            let Some((key, value)) = opt.split_once('=') else {
                return Err(format!("expected name=value, got {opt:?}"));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.eq_ignore_ascii_case("Parallelism") {
                let nums: Result<Vec<u32>, _> =
                    value.split(',').map(|n| n.trim().parse::<u32>()).collect();
                out.parallelism = match nums.as_deref() {
                    Ok([start]) if *start >= 1 => Some((*start, *start, *start)),
                    Ok([start, min, max, ..]) if *start >= 1 => Some((*start, *min, *max)),
                    _ => {
                        return Err(format!(
                            "bad Parallelism value {value:?}; expected start,min,max"
                        ));
                    }
                };
            } else if key.eq_ignore_ascii_case("blocksize") {
                out.block_size = match value.parse::<u64>() {
                    Ok(n) if n >= CHUNK && n.is_multiple_of(CHUNK) && n <= MAX_BLOCK => Some(n),
                    _ => {
                        return Err(format!(
                            "blocksize must be a multiple of {CHUNK} up to 1 GiB"
                        ));
                    }
                };
            } else if key.eq_ignore_ascii_case("Congestion") {
                out.congestion = Some(CcName::parse(value)?);
            } else if key.eq_ignore_ascii_case("Dscp") {
                out.dscp = match value.parse::<u8>() {
                    Ok(n) if n < 64 => Some(n),
                    _ => return Err(format!("Dscp must be from 0 to 63, got {value:?}")),
                };
            } else if key.eq_ignore_ascii_case("Background") {
                out.background = match value.parse::<u32>() {
                    Ok(ms) if ms <= MAX_BACKGROUND_MS => Some(ms),
                    _ => {
                        return Err(format!(
                            "Background must be a queueing delay from 0 to {MAX_BACKGROUND_MS} ms, got {value:?}"
                        ));
                    }
                };
            } else if key.eq_ignore_ascii_case("MaxRate") {
                out.max_rate = match value.parse::<u64>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        return Err(format!("MaxRate must be bytes per second, got {value:?}"));
                    }
                };
            }
        }
        Ok(out)
    }

    /// The argument of `OPTS RETR`, e.g. `Parallelism=4,1,16;blocksize=1048576;`.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        if let Some((start, min, max)) = self.parallelism {
            s.push_str(&format!("Parallelism={start},{min},{max};"));
        }
        if let Some(b) = self.block_size {
            s.push_str(&format!("blocksize={b};"));
        }
        if let Some(r) = self.max_rate {
            s.push_str(&format!("MaxRate={r};"));
        }
        if let Some(c) = self.congestion {
            s.push_str(&format!("Congestion={c};"));
        }
        if let Some(d) = self.dscp {
            s.push_str(&format!("Dscp={d};"));
        }
        if let Some(ms) = self.background {
            s.push_str(&format!("Background={ms};"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn what_the_client_builds_the_server_parses(
            par in proptest::option::of((1u32..100, 0u32..100, 0u32..100)),
            block in proptest::option::of(1u64..=(MAX_BLOCK / CHUNK)),
            rate in proptest::option::of(any::<u64>()),
            cc in proptest::option::of("[a-z0-9_]{1,15}"),
            dscp in proptest::option::of(0u8..64),
            background in proptest::option::of(0..=MAX_BACKGROUND_MS),
        ) {
            let congestion = cc.map(|c| CcName::parse(&c).unwrap());
            let o = RetrOpts { parallelism: par, block_size: block.map(|b| b * CHUNK), max_rate: rate, congestion, dscp, background };
            prop_assert_eq!(RetrOpts::parse(&o.encode()), Ok(o));
        }
    }

    #[test]
    fn globus_style_and_bad_values() {
        let o = RetrOpts::parse("Parallelism=4,4,4;").unwrap();
        assert_eq!(o.parallelism, Some((4, 4, 4)));
        let o = RetrOpts::parse("StripeLayout=Partitioned;Parallelism=2;").unwrap();
        assert_eq!(o.parallelism, Some((2, 2, 2)));
        for bad in [
            "Parallelism=x;",
            "Parallelism=0,1,1;",
            "blocksize=100;",
            "MaxRate=-1;",
            "Congestion=;",
            "Congestion=BBR;",
            "Congestion=a_name_of_16_bytes;",
            "Congestion=bbr cubic;",
            "Dscp=64;",
            "Dscp=le;",
            "junk;",
        ] {
            assert!(RetrOpts::parse(bad).is_err(), "{bad}");
        }
    }
}
