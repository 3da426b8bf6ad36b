//! Many files as one byte range ([`braid_proto::bundle`]): what the sender reads a bundle's
//! bytes from and where the receiver writes them. A block of small files touches each file
//! once: no command, reply or transfer set-up per file, only its open, read or write, and close.

use braid_proto::bundle::Layout;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;

/// Opens the bundle's file at an index to read it (the server's opener checks that it is
/// still the size the client named).
pub type Opener<'a> = dyn Fn(usize) -> io::Result<File> + Sync + 'a;

/// A bundle's files to send.
pub struct Files<'a> {
    pub layout: &'a Layout,
    pub open: &'a Opener<'a>,
}

impl Files<'_> {
    /// Fills `buf` with the bundle's bytes at `offset`, from as many files as they span.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut filled = 0;
        for p in self.layout.pieces(offset, buf.len()) {
            let file = (self.open)(p.file)?;
            file.read_exact_at(&mut buf[p.from..][..p.len], p.at)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => {
                        io::Error::other("a file of the bundle shrank while it was sent")
                    }
                    _ => e,
                })?;
            filled += p.len;
        }
        if filled < buf.len() {
            return Err(io::Error::other("read past the end of the bundle"));
        }
        Ok(())
    }
}

/// A bundle's files opened before its data comes (a server's partials, each held locked until
/// the bundle is checked and named): blocks are written at their offsets, and two
/// connections that carry parts of one file write it side by side (writes at offsets share
/// a file with no lock).
pub struct Landing {
    layout: Layout,
    /// Shared with whoever names them once the bundle is whole.
    files: std::sync::Arc<[File]>,
}

impl Landing {
    /// `files[i]` takes file `i` of `layout`.
    pub fn new(layout: Layout, files: std::sync::Arc<[File]>) -> Landing {
        Landing { layout, files }
    }

    /// Err for a block that reaches past the bundle's end (none of it is written).
    pub fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset.saturating_add(data.len() as u64) > self.layout.total() {
            return Err(past_the_end());
        }
        for p in self.layout.pieces(offset, data.len()) {
            let file = self.files.get(p.file).ok_or_else(past_the_end)?;
            file.write_all_at(&data[p.from..][..p.len], p.at)?;
        }
        Ok(())
    }

    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut filled = 0;
        for p in self.layout.pieces(offset, buf.len()) {
            let file = self.files.get(p.file).ok_or_else(past_the_end)?;
            file.read_exact_at(&mut buf[p.from..][..p.len], p.at)?;
            filled += p.len;
        }
        if filled < buf.len() {
            return Err(past_the_end());
        }
        Ok(())
    }
}

fn past_the_end() -> io::Error {
    io::Error::other("a block reaches past the end of the bundle")
}

/// Writes a bundle's blocks into its files: each file is created (emptied if it was there)
/// at its first bytes and closed once it has as many as its size. Two connections that
/// carry parts of one file take turns on it; others never wait for each other.
pub struct Writer {
    layout: Layout,
    paths: Vec<PathBuf>,
    slots: Vec<Mutex<Slot>>,
}

#[derive(Default)]
struct Slot {
    file: Option<File>,
    created: bool,
    /// Bytes written (a block sent again after a break counts twice, which only closes the
    /// file early: it is opened again for the rest).
    written: u64,
}

impl Writer {
    /// Writes file `i` of `layout` at `paths[i]`.
    pub fn new(layout: Layout, paths: Vec<PathBuf>) -> Writer {
        let slots = (0..paths.len()).map(|_| Mutex::default()).collect();
        Writer {
            layout,
            paths,
            slots,
        }
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        for p in self.layout.pieces(offset, data.len()) {
            let mut slot = self.slots[p.file].lock().unwrap_or_else(|e| e.into_inner());
            let slot = &mut *slot;
            let file = match &mut slot.file {
                Some(f) => f,
                none => {
                    let f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(!slot.created)
                        .open(&self.paths[p.file])?;
                    slot.created = true;
                    none.insert(f)
                }
            };
            file.write_all_at(&data[p.from..][..p.len], p.at)?;
            slot.written += p.len as u64;
            if slot.written >= self.layout.size(p.file) {
                slot.file = None;
            }
        }
        Ok(())
    }

    /// The files written to so far (on a failure, to remove).
    pub fn created(&self) -> Vec<PathBuf> {
        self.slots
            .iter()
            .zip(&self.paths)
            .filter(|(s, _)| s.lock().unwrap_or_else(|e| e.into_inner()).created)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_across_files_land_in_each_and_a_stale_file_is_emptied_first() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [5u64, 0, 3, 7];
        let paths: Vec<PathBuf> = (0..4).map(|i| dir.path().join(format!("f{i}"))).collect();
        std::fs::write(&paths[3], vec![b'x'; 100]).unwrap();
        let w = Writer::new(Layout::new(sizes), paths.clone());
        let all: Vec<u8> = (0..15u8).collect();
        // Out of order, as parallel connections deliver them.
        w.write(9, &all[9..]).unwrap();
        w.write(0, &all[..9]).unwrap();
        assert_eq!(std::fs::read(&paths[0]).unwrap(), &all[..5]);
        assert!(!paths[1].exists(), "empty files are the caller's to make");
        assert_eq!(std::fs::read(&paths[2]).unwrap(), &all[5..8]);
        assert_eq!(std::fs::read(&paths[3]).unwrap(), &all[8..]);
        assert_eq!(w.created().len(), 3);

        let layout = Layout::new(sizes);
        let open = |i: usize| File::open(&paths[i]);
        let files = Files {
            layout: &layout,
            open: &open,
        };
        let mut back = vec![0u8; 10];
        files.read_exact_at(&mut back, 4).unwrap();
        assert_eq!(back, &all[4..14]);
        std::fs::write(&paths[3], b"ab").unwrap();
        let e = files.read_exact_at(&mut back, 4).unwrap_err();
        assert!(e.to_string().contains("shrank"), "{e}");
        assert!(files.read_exact_at(&mut [0u8; 2], 14).is_err());
    }

    #[test]
    fn a_landing_writes_blocks_across_its_open_files_and_refuses_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("f{i}"))).collect();
        let files = paths.iter().map(|p| File::create(p).unwrap()).collect();
        let l = Landing::new(Layout::new([4, 0, 6]), files);
        let all: Vec<u8> = (10..20u8).collect();
        l.write_at(&all[3..], 3).unwrap();
        l.write_at(&all[..3], 0).unwrap();
        assert!(l.write_at(b"xy", 9).is_err(), "past the end");
        drop(l);
        assert_eq!(std::fs::read(&paths[0]).unwrap(), &all[..4]);
        assert!(std::fs::read(&paths[1]).unwrap().is_empty());
        assert_eq!(std::fs::read(&paths[2]).unwrap(), &all[4..]);
    }
}
