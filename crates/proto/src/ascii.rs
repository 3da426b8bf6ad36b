//! TYPE A line-ending conversion: LF on disk, CRLF on the wire (RFC 959 §3.1.1.1).
//! Both converters keep state so buffers may split a line ending anywhere.

/// Disk to wire: every LF not already preceded by CR becomes CRLF.
#[derive(Debug, Default)]
pub struct ToWire {
    last_was_cr: bool,
}

impl ToWire {
    pub fn convert(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len() + input.len() / 16);
        for &b in input {
            if b == b'\n' && !self.last_was_cr {
                out.push(b'\r');
            }
            out.push(b);
            self.last_was_cr = b == b'\r';
        }
    }
}

/// Wire to disk: CRLF becomes LF; a CR not followed by LF is kept.
#[derive(Debug, Default)]
pub struct FromWire {
    pending_cr: bool,
}

impl FromWire {
    pub fn convert(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len());
        for &b in input {
            if self.pending_cr {
                self.pending_cr = false;
                if b != b'\n' {
                    out.push(b'\r');
                }
            }
            if b == b'\r' {
                self.pending_cr = true;
            } else {
                out.push(b);
            }
        }
    }

    /// Call at the end of the stream: a trailing lone CR is data.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.pending_cr) {
            out.push(b'\r');
        }
    }
}

/// How many bytes `data` takes on the wire in TYPE A (for SIZE in ASCII mode).
pub fn wire_len(data: &[u8], last_was_cr: &mut bool) -> u64 {
    let mut n = data.len() as u64;
    for &b in data {
        if b == b'\n' && !*last_was_cr {
            n += 1;
        }
        *last_was_cr = b == b'\r';
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let mut out = Vec::new();
        ToWire::default().convert(b"a\nb\r\nc\r", &mut out);
        assert_eq!(out, b"a\r\nb\r\nc\r");
        let mut out = Vec::new();
        let mut f = FromWire::default();
        f.convert(b"a\r\nb\rc\r", &mut out);
        f.finish(&mut out);
        assert_eq!(out, b"a\nb\rc\r");
    }

    proptest! {
        /// Text without CR survives disk -> wire -> disk whatever the buffer split points.
        #[test]
        fn round_trip_with_splits(text in "[a-z\n]{0,200}", cuts in proptest::collection::vec(0usize..200, 0..5)) {
            let data = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.push(0);
            cuts.push(data.len());
            cuts.sort();
            let mut to = ToWire::default();
            let mut wire = Vec::new();
            for w in cuts.windows(2) {
                to.convert(&data[w[0]..w[1]], &mut wire);
            }
            let mut cr = false;
            prop_assert_eq!(wire_len(data, &mut cr), wire.len() as u64);
            let mut from = FromWire::default();
            let mut back = Vec::new();
            for chunk in wire.chunks(7) {
                from.convert(chunk, &mut back);
            }
            from.finish(&mut back);
            prop_assert_eq!(back, data.to_vec());
        }
    }
}
