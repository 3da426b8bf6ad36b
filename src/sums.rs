//! The checksums GridFTP peers ask for with CKSM, computed over a byte range of a file.

use braid_proto::session::ChecksumAlg;
use std::fs::File;
use std::os::unix::fs::FileExt;

const PIECE: usize = 1 << 20;

/// Feeds `[start, end)` of `file` to `eat` in large pieces.
fn read_range(
    file: &File,
    start: u64,
    end: u64,
    mut eat: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    // No bigger than the range: zeroing a whole piece for a small file cost more than hashing
    // it (14 % of a server's CPU serving 4 KiB files).
    let want = usize::try_from(end.saturating_sub(start)).unwrap_or(PIECE);
    let mut buf = vec![0u8; want.min(PIECE)];
    let mut at = start;
    while at < end {
        let n = (end - at).min(PIECE as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        eat(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// braid's XXH3 checksum ([`braid_proto::checksum`]) of a whole file.
pub fn xxh3(file: &File, len: u64) -> std::io::Result<u128> {
    let mut sum = braid_proto::checksum::ChunkSum::new();
    let mut at = 0;
    read_range(file, 0, len, |b| {
        // Pieces are whole chunks except the file's last, so this cannot fail.
        let _ = sum.add(at, b, at + b.len() as u64 == len);
        at += b.len() as u64;
    })?;
    Ok(sum.finish(len))
}

pub fn md5(file: &File, start: u64, end: u64) -> std::io::Result<String> {
    use md5::Digest;
    let mut h = md5::Md5::new();
    read_range(file, start, end, |b| h.update(b))?;
    Ok(braid_hex(&h.finalize()))
}

/// `[start, end)` of `file` in CKSM's `alg`, lower-case hex as servers answer (XXH3 over the
/// whole file only: `start` 0, `end` its length).
pub fn cksm(alg: ChecksumAlg, file: &File, start: u64, end: u64) -> std::io::Result<String> {
    match alg {
        ChecksumAlg::Xxh3 => Ok(braid_proto::checksum::hex(xxh3(file, end)?)),
        ChecksumAlg::Md5 => md5(file, start, end),
        ChecksumAlg::Adler32 => adler32(file, start, end),
    }
}

/// [`cksm`] of an algorithm named as CKSM names it (`MD5`, `ADLER32`).
pub fn named(alg: &str, file: &File, start: u64, end: u64) -> std::io::Result<String> {
    let alg = ChecksumAlg::parse(alg).ok_or_else(|| {
        std::io::Error::other(format!(
            "no local {alg} checksum to compare with the server's"
        ))
    })?;
    cksm(alg, file, start, end)
}

pub fn adler32(file: &File, start: u64, end: u64) -> std::io::Result<String> {
    let mut h = adler2::Adler32::new();
    read_range(file, start, end, |b| h.write_slice(b))?;
    Ok(format!("{:08x}", h.checksum()))
}

fn braid_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn known_values() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"The quick brown fox jumps over the lazy dog")
            .unwrap();
        assert_eq!(md5(&f, 0, 43).unwrap(), "9e107d9d372bb6826bd81d3542a419d6");
        assert_eq!(adler32(&f, 0, 43).unwrap(), "5bdc0fda");
        // A range: "quick".
        assert_eq!(md5(&f, 4, 9).unwrap(), "1df3746a4728276afdc24f828186f73a");
    }
}
