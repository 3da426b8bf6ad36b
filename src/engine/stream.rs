//! Stream mode's copy loops, for client and server alike, in clear or through TLS: one data
//! connection, the bytes in order, large pieces, and ASCII conversion when TYPE A asks for it.
//! (Binary file data on a clear connection goes by [`super::file_send`] instead.)

use braid_proto::ascii::{FromWire, ToWire};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

/// Bytes per read or write: syscall overhead disappears next to the copy, and the buffer stays
/// in cache.
pub const PIECE: usize = 1 << 20;

/// Which side of a copy failed, and how many bytes had moved before it did.
#[derive(Debug)]
pub enum CopyError {
    Read(u64, std::io::Error),
    Write(u64, std::io::Error),
}

impl CopyError {
    pub fn moved(&self) -> u64 {
        match self {
            CopyError::Read(n, _) | CopyError::Write(n, _) => *n,
        }
    }
}

/// Copies `from` into `to` until `from` ends. `ascii`: the wire carries CRLF lines, stored
/// with the local line ends. `moved` is told the bytes read so far after each piece. Returns
/// the bytes read.
pub fn read_to_end(
    from: &mut impl Read,
    to: &mut dyn Write,
    ascii: bool,
    mut moved: impl FnMut(u64),
) -> Result<u64, CopyError> {
    let mut buf = vec![0u8; PIECE];
    let mut local = Vec::new();
    let mut conv = FromWire::default();
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(total, e)),
        };
        let data = if ascii {
            local.clear();
            conv.convert(&buf[..n], &mut local);
            &local[..]
        } else {
            &buf[..n]
        };
        to.write_all(data).map_err(|e| CopyError::Write(total, e))?;
        total += n as u64;
        moved(total);
    }
    if ascii {
        local.clear();
        conv.finish(&mut local);
        to.write_all(&local)
            .map_err(|e| CopyError::Write(total, e))?;
    }
    Ok(total)
}

/// Sends `file` from `offset` through `to`, reading at offsets: up to `end` (a file that ends
/// before it is an error: it shrank), or to its end when `end` is None. `ascii`: converted to
/// CRLF lines. `moved` is told the bytes written so far. Returns the bytes written.
pub fn write_from_file(
    file: &File,
    mut offset: u64,
    end: Option<u64>,
    to: &mut impl Write,
    ascii: bool,
    mut moved: impl FnMut(u64),
) -> Result<u64, CopyError> {
    let mut buf = vec![0u8; PIECE];
    let mut wire = Vec::new();
    let mut conv = ToWire::default();
    let mut total = 0u64;
    loop {
        let want = match end {
            Some(e) if offset >= e => break,
            Some(e) => buf
                .len()
                .min(usize::try_from(e - offset).unwrap_or(usize::MAX)),
            None => buf.len(),
        };
        let n = match file.read_at(&mut buf[..want], offset) {
            Ok(0) if end.is_some() => {
                let shrank = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was being sent",
                );
                return Err(CopyError::Read(total, shrank));
            }
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(total, e)),
        };
        offset += n as u64;
        let data = if ascii {
            wire.clear();
            conv.convert(&buf[..n], &mut wire);
            &wire[..]
        } else {
            &buf[..n]
        };
        to.write_all(data).map_err(|e| CopyError::Write(total, e))?;
        total += data.len() as u64;
        moved(total);
    }
    Ok(total)
}

/// Writes a stream into a file from an offset on, with `pwrite`: no seek, no buffering.
pub struct AtOffset<'a> {
    pub file: &'a File,
    pub offset: u64,
}

impl Write for AtOffset<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write_all_at(buf, self.offset)?;
        self.offset += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_round_trips_and_a_shrunk_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let text = b"one\ntwo\n\nthree".repeat(100_000);
        std::fs::write(&path, &text).unwrap();
        let file = File::open(&path).unwrap();
        let mut wire = Vec::new();
        let sent = write_from_file(&file, 0, None, &mut wire, true, |_| {}).unwrap();
        assert_eq!(sent, wire.len() as u64);
        assert_eq!(wire.iter().filter(|&&b| b == b'\r').count(), 3 * 100_000);
        let out = File::create(dir.path().join("g")).unwrap();
        let mut last = 0;
        let got = read_to_end(
            &mut &wire[..],
            &mut AtOffset {
                file: &out,
                offset: 0,
            },
            true,
            |n| last = n,
        )
        .unwrap();
        assert_eq!((got, last), (wire.len() as u64, wire.len() as u64));
        assert!(std::fs::read(dir.path().join("g")).unwrap() == text);
        let past = text.len() as u64 + 10;
        match write_from_file(&file, 5, Some(past), &mut Vec::new(), false, |_| {}) {
            Err(CopyError::Read(n, e)) => {
                assert_eq!(n, text.len() as u64 - 5);
                assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
            }
            other => panic!("{other:?}"),
        }
    }
}
