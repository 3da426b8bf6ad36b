//! `braid trace`: throughput, retransmissions, RTT and windows per TCP connection from a
//! packet capture, the way Van Jacobson read a tcpdump trace in 1988 (cumulative bits against
//! time, data apart from acks) and tcptrace does today.

pub mod capture;
pub mod decode;
pub mod plot;
pub mod tcp;

use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A pcap or pcapng file (Ethernet, raw IP as on a TUN, Linux cooked SLL/SLL2; IPv4, IPv6).
    capture: PathBuf,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Group every connection between the same two hosts into one transfer, not only those
    /// that overlap in time.
    #[arg(long)]
    group_by_hosts: bool,
    /// Draw the time-sequence graph, throughput and RTT over time into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write the bps.awk-style series here: time, connection, direction, kind (data, rexmt or
    /// ack), cumulative data bits, cumulative acknowledged bits.
    #[arg(long)]
    series: Option<PathBuf>,
}

/// Frames that gave no segment, by reason.
#[derive(Debug, Default, serde::Serialize)]
pub struct Skipped {
    pub unknown_link_type: u64,
    pub not_ip: u64,
    pub not_tcp: u64,
    pub fragments: u64,
    pub short: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub capture: String,
    pub frames: u64,
    pub tcp_segments: u64,
    pub skipped: Skipped,
    /// Packets whose time is earlier than one before them.
    pub timestamps_backwards: u64,
    /// Why reading stopped early, if it did.
    pub damaged: Option<String>,
    pub connections: Vec<tcp::ConnectionReport>,
    /// Connections that ran together between the same two hosts (a braid transfer: one
    /// control connection and its data connections), when there are several.
    pub transfers: Vec<Transfer>,
}

/// Several connections between the same two hosts, taken as one transfer.
#[derive(Debug, serde::Serialize)]
pub struct Transfer {
    pub hosts: [String; 2],
    /// Indexes into `connections`.
    pub connections: Vec<usize>,
    pub first_s: f64,
    pub last_s: f64,
    /// Data bytes of all connections (both directions).
    pub data_bytes: u64,
    /// Over the transfer's span, in bit/s.
    pub rate_bps: Option<f64>,
    /// Each connection's part of the data bytes, in the order of `connections`.
    pub shares: Vec<f64>,
}

/// Groups connections between the same two hosts whose lifetimes overlap (a braid transfer's
/// control connection spans its data connections); with `by_hosts`, every connection between
/// the same two hosts, whatever its time.
pub fn transfers(conns: &[tcp::ConnectionReport], by_hosts: bool) -> Vec<Transfer> {
    let host = |a: &str| a.rsplit_once(':').map_or(a, |(h, _)| h).to_string();
    let mut groups: Vec<Transfer> = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        let mut hosts = [host(&c.a), host(&c.b)];
        hosts.sort();
        let bytes = c.a2b.data_bytes + c.b2a.data_bytes;
        let joined = groups.iter_mut().rev().find(|g| {
            g.hosts == hosts && (by_hosts || (c.first_s <= g.last_s && c.last_s >= g.first_s))
        });
        match joined {
            Some(g) => {
                g.connections.push(i);
                g.first_s = g.first_s.min(c.first_s);
                g.last_s = g.last_s.max(c.last_s);
                g.data_bytes += bytes;
            }
            None => groups.push(Transfer {
                hosts,
                connections: vec![i],
                first_s: c.first_s,
                last_s: c.last_s,
                data_bytes: bytes,
                rate_bps: None,
                shares: Vec::new(),
            }),
        }
    }
    groups.retain(|g| g.connections.len() > 1);
    for g in &mut groups {
        let span = g.last_s - g.first_s;
        g.rate_bps = (span > 0.0).then(|| g.data_bytes as f64 * 8.0 / span);
        g.shares = g
            .connections
            .iter()
            .map(|&i| {
                let c = &conns[i];
                (c.a2b.data_bytes + c.b2a.data_bytes) as f64 / (g.data_bytes.max(1)) as f64
            })
            .collect();
    }
    groups
}

/// Reads and analyses a capture. `series` receives one CSV line per TCP segment.
pub fn analyse(
    input: impl std::io::Read + Send,
    name: &str,
    mut series: Option<&mut dyn Write>,
    mut plot: Option<&mut plot::Collector>,
) -> Result<Report> {
    let mut analysis = tcp::Analysis::new();
    let (mut frames, mut segments) = (0u64, 0u64);
    let mut skipped = Skipped::default();
    let mut start = None;
    let mut data_bits: Vec<[u64; 2]> = Vec::new();
    let mut series_error = None;
    let end = capture::read(input, |f| {
        frames += 1;
        let t0 = *start.get_or_insert(f.time_ns);
        let t = f.time_ns.saturating_sub(t0);
        match decode::decode(f.linktype, f.data) {
            Ok(s) => {
                segments += 1;
                let seen = analysis.add(t, &s);
                if let Some(p) = plot.as_deref_mut() {
                    p.add(t as f64 / 1e9, &seen);
                }
                if let Some(w) = series.as_deref_mut() {
                    if data_bits.len() <= seen.connection {
                        data_bits.resize(seen.connection + 1, [0, 0]);
                    }
                    let bits = &mut data_bits[seen.connection][seen.direction];
                    *bits += u64::from(seen.data_len) * 8;
                    let kind = match (seen.data_len, seen.retransmission) {
                        (0, _) => "ack",
                        (_, true) => "rexmt",
                        _ => "data",
                    };
                    if let Err(e) = writeln!(
                        w,
                        "{:.6},{},{},{kind},{},{}",
                        t as f64 / 1e9,
                        seen.connection,
                        if seen.direction == 0 { "a2b" } else { "b2a" },
                        bits,
                        seen.acked * 8
                    ) {
                        series_error.get_or_insert(e);
                    }
                }
            }
            Err(decode::Skip::UnknownLinkType) => skipped.unknown_link_type += 1,
            Err(decode::Skip::NotIp) => skipped.not_ip += 1,
            Err(decode::Skip::NotTcp) => skipped.not_tcp += 1,
            Err(decode::Skip::Fragment) => skipped.fragments += 1,
            Err(decode::Skip::Short) => skipped.short += 1,
        }
    })
    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if let Some(e) = series_error {
        return Err(e).context("cannot write the series");
    }
    Ok(Report {
        capture: name.to_string(),
        frames,
        tcp_segments: segments,
        skipped,
        timestamps_backwards: analysis.backwards,
        damaged: match end {
            capture::End::Complete => None,
            capture::End::Damaged(why) => Some(why),
        },
        transfers: Vec::new(),
        connections: analysis.report(),
    })
}

pub fn main(args: TraceArgs) -> Result<u8> {
    let file = std::fs::File::open(&args.capture)
        .with_context(|| format!("cannot open {}", args.capture.display()))?;
    let input = std::io::BufReader::with_capacity(1 << 20, file);
    let mut series = match &args.series {
        Some(p) => {
            let f = std::fs::File::create(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            let mut w = std::io::BufWriter::new(f);
            writeln!(w, "time_s,connection,direction,kind,data_bits,acked_bits")?;
            Some(w)
        }
        None => None,
    };
    let name = args.capture.display().to_string();
    let mut plot = args.plot.as_ref().map(|_| plot::Collector::default());
    let mut report = analyse(
        input,
        &name,
        series.as_mut().map(|w| w as &mut dyn Write),
        plot.as_mut(),
    )?;
    if let (Some(path), Some(p)) = (&args.plot, &plot) {
        p.draw(path, &name).map_err(anyhow::Error::msg)?;
    }
    report.transfers = transfers(&report.connections, args.group_by_hosts);
    if let Some(mut w) = series {
        w.flush().context("cannot write the series")?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    if let Some(why) = &report.damaged {
        eprintln!("braid trace: {name}: {why}; the results cover what came before");
    }
    if report.timestamps_backwards > 0 {
        eprintln!(
            "braid trace: warning: {} packets have a time earlier than a packet before them",
            report.timestamps_backwards
        );
    }
    Ok(if report.damaged.is_some() { 1 } else { 0 })
}

fn print_text(r: &Report) {
    print_connections(r);
    for t in &r.transfers {
        println!(
            "\ntransfer {} <-> {}: {} connections, {} data bytes in {:.3} s, {}",
            t.hosts[0],
            t.hosts[1],
            t.connections.len(),
            t.data_bytes,
            t.last_s - t.first_s,
            t.rate_bps
                .map_or("-".into(), |b| format!("{:.3} Mbit/s", b / 1e6))
        );
        let shares: Vec<String> = t
            .connections
            .iter()
            .zip(&t.shares)
            .map(|(i, s)| format!("#{i} {:.1} %", s * 100.0))
            .collect();
        println!("  shares: {}", shares.join(", "));
    }
}

fn print_connections(r: &Report) {
    println!(
        "{}: {} frames, {} TCP segments, {} connections",
        r.capture,
        r.frames,
        r.tcp_segments,
        r.connections.len()
    );
    let s = &r.skipped;
    let other = s.unknown_link_type + s.not_ip + s.not_tcp + s.fragments + s.short;
    if other > 0 {
        println!(
            "skipped: {} not TCP, {} not IP, {} fragments, {} cut short, {} unknown link type",
            s.not_tcp, s.not_ip, s.fragments, s.short, s.unknown_link_type
        );
    }
    let rate = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.3} Mbit/s", b / 1e6));
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    for (i, c) in r.connections.iter().enumerate() {
        println!(
            "\n#{i} {} <-> {}: {} packets, {:.3} s (from {:.3} s)",
            c.a, c.b, c.packets, c.duration_s, c.first_s
        );
        for (label, d) in [
            (format!("{} -> {}", c.a, c.b), &c.a2b),
            (format!("{} -> {}", c.b, c.a), &c.b2a),
        ] {
            println!("  {label}");
            println!(
                "    {} packets, {} with data: {} data bytes ({} unique), {} on the wire",
                d.packets, d.data_packets, d.data_bytes, d.unique_bytes, d.wire_bytes
            );
            println!(
                "    throughput {} mean, {} fitted; retransmitted {} packets / {} bytes ({:.2} %); {} out of order",
                rate(d.mean_bps),
                rate(d.slope_bps),
                d.rexmt_packets,
                d.rexmt_bytes,
                d.rexmt_rate * 100.0,
                d.out_of_order
            );
            println!(
                "    RTT {} samples, min/mean/max {}/{}/{} ms; window {}..{} bytes; {} zero-window events",
                d.rtt_samples,
                ms(d.rtt_min_ms),
                ms(d.rtt_mean_ms),
                ms(d.rtt_max_ms),
                d.window_min.unwrap_or(0),
                d.window_max,
                d.zero_window_events
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fuzz target does, on a few hostile inputs: damage is reported, never a panic.
    #[test]
    fn hostile_bytes_are_reported_not_panicked_on() {
        let mut pcap_header = 0xa1b2c3d4u32.to_le_bytes().to_vec();
        pcap_header.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0]);
        pcap_header.extend_from_slice(&101u32.to_le_bytes());
        let mut huge_record = pcap_header.clone();
        // A record claiming 4 GB of data.
        huge_record.extend_from_slice(&[
            0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ]);
        let mut garbage_frame = pcap_header.clone();
        garbage_frame.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0]);
        garbage_frame.extend_from_slice(&[0x45, 0xff, 0, 0, 0, 0, 0, 0]);
        let ng_header_only = [0x0A, 0x0D, 0x0D, 0x0A, 0xff, 0xff, 0xff, 0x7f];
        for input in [
            &pcap_header[..],
            &huge_record,
            &garbage_frame,
            &ng_header_only,
            b"\xd4\xc3\xb2\xa1",
        ] {
            match analyse(input, "hostile", None, None) {
                Ok(r) => assert!(r.connections.is_empty()),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
}
