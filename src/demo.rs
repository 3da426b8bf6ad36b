//! `braid demo`: the whole job end to end on loopback, with nothing to set up.

use crate::client::{self, Dest, Options, human_bytes};
use crate::server::{self, Shutdown};
use anyhow::{Context, bail};
use std::io::{BufWriter, Read, Write};
use std::path::Path;

/// Fills a file with pseudo-random bytes (xorshift64*), fast enough not to dominate the demo.
pub fn write_random_file(path: &Path, size: u64, seed: u64) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            chunk.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n])?;
        left -= n as u64;
    }
    w.flush()
}

/// Compares two files byte for byte; returns the first differing offset.
pub fn first_difference(a: &Path, b: &Path) -> std::io::Result<Option<u64>> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (la, lb) = (fa.metadata()?.len(), fb.metadata()?.len());
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok((la != lb).then_some(off));
        }
        fb.read_exact(&mut bb[..n])
            .map_err(|_| std::io::Error::other("second file is shorter"))?;
        if let Some(i) = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y) {
            return Ok(Some(off + i as u64));
        }
        off += n as u64;
    }
}

pub fn run(size: u64) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("braid-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let serve_dir = dir.path().join("served");
    let fetch_dir = dir.path().join("fetched");
    std::fs::create_dir_all(&serve_dir)?;
    std::fs::create_dir_all(&fetch_dir)?;
    let source = serve_dir.join("demo.bin");
    println!(
        "demo: writing {} of random data to {}",
        human_bytes(size as f64),
        source.display()
    );
    write_random_file(&source, size, 0x9e37_79b9_7f4a_7c15)
        .context("cannot write the demo file")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .context("cannot bind a loopback port")?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = tokio::sync::watch::channel(Shutdown::Running);
    let config = std::sync::Arc::new(server::Config::new(serve_dir.clone()));
    let (_keep, configs) = tokio::sync::watch::channel(config);
    let server = rt.spawn(server::run(listener, configs, stop_rx));
    println!(
        "demo: braid server on {} serving {} (anonymous, read-only)",
        server::url_for(addr),
        serve_dir.display()
    );

    let url = format!("ftp://{addr}/demo.bin");
    let target = client::url::parse(&url, &Default::default())?;
    let dest = fetch_dir.join("demo.bin");
    println!("demo: braid get {url} {}", dest.display());
    let opts = Options {
        progress: true,
        streams: None,
        ..Options::default()
    };
    let summary = client::get(&target, &Dest::File(dest.clone()), &opts);
    let _ = stop.send(Shutdown::Abort);
    let _ = rt.block_on(server);
    let summary = summary?;
    match first_difference(&source, &dest)? {
        None => println!("demo: verified: {} bytes identical", summary.bytes),
        Some(off) => bail!("demo: the copy differs from the source at byte {off}"),
    }
    println!(
        "demo: {} in {:.3} s = {}/s ({:.0} Mbit/s) over loopback, {} mode, {} data connection(s), checksum {}",
        human_bytes(summary.bytes as f64),
        summary.seconds,
        human_bytes(summary.bytes_per_second),
        summary.bytes_per_second * 8.0 / 1e6,
        summary.mode,
        summary.streams,
        summary.checksum.as_deref().unwrap_or("not compared")
    );
    Ok(())
}
