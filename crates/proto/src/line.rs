//! Splitting a control-connection byte stream into command lines.

/// Why a control line could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The peer sent more than the limit without an end of line.
    #[error("command line longer than {0} bytes")]
    TooLong(usize),
}

/// Accumulates bytes and yields complete lines, with Telnet control sequences removed.
///
/// Lines end at LF; a CR before it is dropped. Bare-LF clients are common enough to accept.
#[derive(Debug)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for LF, so a slow sender does not cost quadratic time.
    scanned: usize,
    max: usize,
}

impl LineBuffer {
    pub fn new(max: usize) -> Self {
        LineBuffer {
            buf: Vec::new(),
            scanned: 0,
            max,
        }
    }

    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered but not yet returned as a line.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The bytes buffered but not returned as a line, taken out: what a client sent after
    /// AUTH TLS without waiting for its answer (its ClientHello) belongs to TLS.
    pub fn take_pending(&mut self) -> Vec<u8> {
        self.scanned = 0;
        std::mem::take(&mut self.buf)
    }

    /// Whether a complete line is waiting.
    pub fn has_line(&self) -> bool {
        self.buf[self.scanned..].contains(&b'\n')
    }

    /// The next complete line without its end of line, `Ok(None)` if more bytes are needed.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(pos) => {
                let end = self.scanned + pos;
                if end + 1 > self.max {
                    return Err(LineError::TooLong(self.max));
                }
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                self.scanned = 0;
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                Ok(Some(strip_telnet(&line)))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() >= self.max {
                    Err(LineError::TooLong(self.max))
                } else {
                    Ok(None)
                }
            }
        }
    }
}

const IAC: u8 = 255;

/// Removes Telnet commands (RFC 854) that FTP clients put on the control connection, such as
/// the IP and Synch sequence before ABOR. `IAC IAC` stands for a literal 255 byte.
pub fn strip_telnet(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] != IAC {
            out.push(line[i]);
            i += 1;
            continue;
        }
        match line.get(i + 1) {
            Some(&IAC) => {
                out.push(IAC);
                i += 2;
            }
            // WILL, WONT, DO, DONT carry an option byte.
            Some(251..=254) => i += 3,
            Some(_) => i += 2,
            None => i += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_crlf_and_bare_lf_lines() {
        let mut b = LineBuffer::new(100);
        b.extend(b"USER a\r\nPASS b\nNO");
        assert_eq!(b.next_line().unwrap(), Some(b"USER a".to_vec()));
        assert_eq!(b.next_line().unwrap(), Some(b"PASS b".to_vec()));
        assert_eq!(b.next_line().unwrap(), None);
        b.extend(b"OP\r\n");
        assert_eq!(b.next_line().unwrap(), Some(b"NOOP".to_vec()));
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn refuses_overlong_lines_with_or_without_newline() {
        let mut b = LineBuffer::new(10);
        b.extend(b"0123456789A");
        assert_eq!(b.next_line(), Err(LineError::TooLong(10)));
        let mut b = LineBuffer::new(10);
        b.extend(b"012345678901\r\n");
        assert_eq!(b.next_line(), Err(LineError::TooLong(10)));
        let mut b = LineBuffer::new(10);
        b.extend(b"12345678\r\n");
        assert_eq!(b.next_line().unwrap(), Some(b"12345678".to_vec()));
    }

    #[test]
    fn strips_telnet_interrupt_before_abor() {
        let mut b = LineBuffer::new(100);
        b.extend(b"\xff\xf4\xff\xf2ABOR\r\n");
        assert_eq!(b.next_line().unwrap(), Some(b"ABOR".to_vec()));
        assert_eq!(
            strip_telnet(b"a\xff\xffb\xff\xfb\x01c"),
            b"a\xffbc".to_vec()
        );
    }
}
