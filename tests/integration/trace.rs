//! `braid trace` against tcptrace on a capture with real losses (taken inside the link
//! emulator), and on hand-made captures that are cut, garbled or not TCP.
use crate::util::{BRAID, braid, json, require, tempdir};
use std::collections::HashMap;
use std::process::Command;

/// One connection as tcptrace prints it: host a, host b, the two-column fields as (a2b, b2a)
/// pairs, and the elapsed time in seconds.
type TcptraceConnection = (String, String, HashMap<String, (u64, u64)>, f64);

/// tcptrace -l -n -r, parsed.
fn tcptrace(capture: &std::path::Path) -> Vec<TcptraceConnection> {
    let out = Command::new("tcptrace")
        .args(["-l", "-n", "-r"])
        .arg(capture)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut conns = Vec::new();
    for block in text.split("TCP connection ").skip(1) {
        let mut hosts = Vec::new();
        let mut fields = HashMap::new();
        let mut elapsed = 0.0;
        for line in block.lines() {
            let l = line.trim();
            if let Some(h) = l.strip_prefix("host ").and_then(|h| h.split_once(':')) {
                hosts.push(h.1.trim().to_string());
            } else if let Some(t) = l.strip_prefix("elapsed time:") {
                let parts: Vec<f64> = t.trim().split(':').map(|p| p.parse().unwrap()).collect();
                elapsed = parts[0] * 3600.0 + parts[1] * 60.0 + parts[2];
            } else if let Some((name, rest)) = l.split_once(':') {
                // "total packets:   13   total packets:   14"
                let values: Vec<u64> = rest
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                if values.len() == 2 && rest.contains(&format!("{name}:")) {
                    fields.insert(name.trim().to_string(), (values[0], values[1]));
                }
            }
        }
        if hosts.len() == 2 {
            conns.push((hosts[0].clone(), hosts[1].clone(), fields, elapsed));
        }
    }
    conns
}

#[test]
fn trace_agrees_with_tcptrace_on_a_lossy_lab_capture() {
    crate::lab::require_lab();
    for program in ["tcpdump", "tcptrace", "iperf3"] {
        require(program);
    }
    let top = tempdir();
    let capture = top.path().join("lossy.pcap");
    // Captured on the sending host's TUN: 2 % of data packets are lost after it, so the
    // sender retransmits.
    let client = format!(
        "tcpdump -i braid0 -s 128 -Z root -w {} -U 2>/dev/null & p=$!; sleep 1; \
         iperf3 -c 198.18.0.2 -t 3 -C cubic >/dev/null; sleep 0.5; kill -INT $p; wait $p",
        capture.display()
    );
    let name = crate::lab::lab_name("r");
    let out = Command::new(BRAID)
        .args([
            "lab", "run", "--name", &name, "--rate", "20mbit", "--delay", "5ms",
        ])
        .args([
            "--up-loss",
            "0.02",
            "--server",
            "iperf3 -s -1",
            "--client",
            &client,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = tcptrace(&capture);
    let (code, stdout, err) = braid(&["trace", capture.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let ours = json(&stdout);
    let conns = ours["connections"].as_array().unwrap();
    assert_eq!(conns.len(), theirs.len(), "{stdout}");
    let mut retransmitted = 0;
    for (c, (a, b, fields, elapsed)) in conns.iter().zip(&theirs) {
        assert_eq!(
            (c["a"].as_str().unwrap(), c["b"].as_str().unwrap()),
            (a.as_str(), b.as_str())
        );
        for (theirs_name, ours_name) in [
            ("total packets", "packets"),
            ("actual data pkts", "data_packets"),
            ("actual data bytes", "data_bytes"),
            ("rexmt data pkts", "rexmt_packets"),
            ("rexmt data bytes", "rexmt_bytes"),
            ("unique bytes sent", "unique_bytes"),
        ] {
            let t = fields[theirs_name];
            let o = (
                c["a2b"][ours_name].as_u64().unwrap(),
                c["b2a"][ours_name].as_u64().unwrap(),
            );
            assert_eq!(o, t, "{theirs_name} of {a} <-> {b}");
        }
        retransmitted += fields["rexmt data pkts"].0 + fields["rexmt data pkts"].1;
        let d = c["duration_s"].as_f64().unwrap();
        assert!((d - elapsed).abs() < 1e-5, "duration {d} against {elapsed}");
    }
    assert!(
        retransmitted > 0,
        "the capture has no retransmissions to compare"
    );

    // The model reads the same capture: one data connection, its RTT and its loss as the
    // trace counts them.
    let data = conns
        .iter()
        .map(|c| &c["a2b"])
        .max_by_key(|d| d["unique_bytes"].as_u64().unwrap())
        .unwrap();
    let (code, stdout, err) = braid(
        &[
            "model",
            "--from-trace",
            capture.to_str().unwrap(),
            "--rate",
            "20mbit",
            "--congestion",
            "cubic",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let model = json(&stdout);
    assert_eq!(model["load"]["streams"], 1, "{stdout}");
    let loss = data["rexmt_packets"].as_f64().unwrap() / data["data_packets"].as_f64().unwrap();
    assert!(
        (model["path"]["loss"].as_f64().unwrap() - loss).abs() < 1e-12,
        "{stdout}"
    );
    let rtt = model["path"]["rtt"].as_f64().unwrap();
    assert!(
        (rtt - data["rtt_min_ms"].as_f64().unwrap() / 1e3).abs() < 1e-9 && rtt >= 0.010,
        "{stdout}"
    );
    assert_eq!(model["prediction"]["binding"], "loss", "{stdout}");
    assert!(model["measured_bytes_per_second"].as_f64().unwrap() > 0.0);

    // The plot marks each retransmission of data with a red dot.
    let svg = top.path().join("lossy.svg");
    let (code, _, err) = braid(
        &[
            "trace",
            capture.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    for caption in ["time-sequence", "throughput", "RTT samples"] {
        assert!(svg.contains(caption), "{caption} missing from the plot");
    }
    let red = svg
        .split("<circle")
        .skip(1)
        .filter(|c| c.contains("fill=\"#FF0000\""))
        .count() as u64;
    assert!(
        red > 0 && red <= retransmitted,
        "{red} red dots for {retransmitted} retransmissions"
    );
}

/// A pcap file (microsecond times, raw IP) holding `frames`.
fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&101u32.to_le_bytes());
    for (i, frame) in frames.iter().enumerate() {
        f.extend_from_slice(&(1_700_000_000u32 + i as u32).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        f.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        f.extend_from_slice(frame);
    }
    f
}

/// An IPv4 packet from 198.18.0.1:1000 to 198.18.0.2:2000, `len` payload bytes: TCP (`proto`
/// 6, PSH and ACK, window 4096) or UDP.
fn ipv4(proto: u8, seq: u32, len: usize) -> Vec<u8> {
    let ip = etherparse::PacketBuilder::ipv4([198, 18, 0, 1], [198, 18, 0, 2], 64);
    let mut p = Vec::new();
    let payload = vec![7u8; len];
    if proto == 6 {
        let mut tcp = etherparse::TcpHeader::new(1000, 2000, seq, 4096);
        (tcp.ack, tcp.psh) = (true, true);
        ip.tcp_header(tcp).write(&mut p, &payload).unwrap();
    } else {
        ip.udp(1000, 2000).write(&mut p, &payload).unwrap();
    }
    p
}

#[test]
fn cut_garbled_and_foreign_captures_get_clear_messages_and_partial_results() {
    let top = tempdir();
    let path = |name: &str| top.path().join(name);
    let frames = vec![
        ipv4(6, 1, 100),
        ipv4(6, 101, 100),
        ipv4(17, 0, 50),
        ipv4(6, 201, 100),
    ];
    let whole = pcap(&frames);
    std::fs::write(path("ok.pcap"), &whole).unwrap();
    let (code, out, err) = braid(&["trace", path("ok.pcap").to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out);
    assert_eq!(
        (r["frames"].as_u64(), r["tcp_segments"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(r["skipped"]["not_tcp"], 1);
    assert_eq!(r["connections"][0]["a2b"]["data_bytes"], 300);

    // Cut in the middle of the last frame: the first three are still reported.
    std::fs::write(path("cut.pcap"), &whole[..whole.len() - 30]).unwrap();
    let (code, out, err) = braid(
        &["trace", path("cut.pcap").to_str().unwrap(), "--json"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("ends in the middle of a packet"), "{err}");
    let r = json(&out);
    assert_eq!(r["frames"], 3);
    assert_eq!(r["connections"][0]["a2b"]["data_bytes"], 200);

    // Not a capture at all, and an empty file.
    std::fs::write(path("junk.pcap"), b"this is not a capture file at all").unwrap();
    let (code, _, err) = braid(&["trace", path("junk.pcap").to_str().unwrap()], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("not a pcap or pcapng file"), "{err}");
    std::fs::write(path("empty.pcap"), b"").unwrap();
    let (code, _, err) = braid(&["trace", path("empty.pcap").to_str().unwrap()], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("empty"), "{err}");

    // The series: one line per TCP segment, cumulative data bits.
    let series = path("series.csv");
    let (code, _, err) = braid(
        &[
            "trace",
            path("ok.pcap").to_str().unwrap(),
            "--series",
            series.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let csv = std::fs::read_to_string(&series).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "time_s,connection,direction,kind,data_bits,acked_bits"
    );
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(lines[3].starts_with("3.000000,0,a2b,data,2400,"), "{csv}");
}

#[test]
fn a_parallel_braid_download_is_summarised_as_one_transfer() {
    crate::lab::require_lab();
    require("tcpdump");
    let top = tempdir();
    let root = top.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.bin"), crate::util::random_bytes(8 << 20, 17)).unwrap();
    let capture = top.path().join("braid.pcap");
    let serve = format!(
        "{BRAID} serve --root {} --listen 198.18.0.2:2121",
        root.display()
    );
    let client = format!(
        "tcpdump -i braid0 -s 96 -B 32768 -Z root -w {} -U 2>/dev/null & p=$!; sleep 1; \
         {BRAID} get ftp://198.18.0.2:2121/f.bin /dev/null -n 4 -q; sleep 1; kill -INT $p; wait $p",
        capture.display()
    );
    let name = crate::lab::lab_name("g");
    let out = Command::new(BRAID)
        .args([
            "lab", "run", "--name", &name, "--rate", "100mbit", "--delay", "2ms",
        ])
        .args(["--server", &serve, "--client", &client])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, stdout, err) = braid(&["trace", capture.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let r = json(&stdout);
    // The control connection and four data connections, one transfer.
    assert_eq!(r["connections"].as_array().unwrap().len(), 5, "{stdout}");
    let transfers = r["transfers"].as_array().unwrap();
    assert_eq!(transfers.len(), 1, "{stdout}");
    let t = &transfers[0];
    assert_eq!(t["connections"].as_array().unwrap().len(), 5);
    let total = t["data_bytes"].as_u64().unwrap();
    // tcpdump may lose the last packets on a loaded machine.
    assert!(total >= 6 << 20, "{t}");
    let shares: Vec<f64> = t["shares"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    assert!(
        (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
        "{shares:?}"
    );
    // Every data connection carried a real part of the file.
    assert_eq!(
        shares.iter().filter(|s| **s > 0.05).count(),
        4,
        "{shares:?}"
    );
}

/// A pcapng file: one section, one raw-IP interface with nanosecond times, `frames` as
/// enhanced packet blocks, 1.5 ms apart.
fn pcapng(frames: &[Vec<u8>]) -> Vec<u8> {
    fn block(kind: u32, body: &[u8]) -> Vec<u8> {
        let padded = body.len().div_ceil(4) * 4;
        let len = (12 + padded) as u32;
        let mut b = kind.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.resize(8 + padded, 0);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }
    let mut shb = 0x1A2B_3C4Du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    let mut f = block(0x0A0D_0D0A, &shb);
    let mut idb = 101u16.to_le_bytes().to_vec();
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&0u32.to_le_bytes());
    // if_tsresol = 9: nanoseconds; then the end of options.
    idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(block(1, &idb));
    for (i, frame) in frames.iter().enumerate() {
        let ts: u64 = 1_700_000_000_000_000_000 + i as u64 * 1_500_000;
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        epb.extend_from_slice(frame);
        f.extend(block(6, &epb));
    }
    f
}

/// An IPv6 TCP segment from [2001:db8::1]:1000 to [2001:db8::2]:2000 with `len` bytes.
fn ipv6_tcp(seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&((20 + len) as u16).to_be_bytes());
    p.extend_from_slice(&[6, 64]);
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    a[15] = 1;
    p.extend_from_slice(&a);
    a[15] = 2;
    p.extend_from_slice(&a);
    p.extend_from_slice(&1000u16.to_be_bytes());
    p.extend_from_slice(&2000u16.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 0x50, 0x18, 0x10, 0, 0, 0, 0, 0]);
    p.extend(std::iter::repeat_n(9u8, len));
    p
}

#[test]
fn pcapng_with_nanosecond_times_and_ipv6() {
    let top = tempdir();
    let path = top.path().join("v6.pcapng");
    // Three segments, the second sent twice.
    let frames = vec![
        ipv6_tcp(1, 1000),
        ipv6_tcp(1001, 1000),
        ipv6_tcp(1001, 1000),
        ipv6_tcp(2001, 1000),
    ];
    std::fs::write(&path, pcapng(&frames)).unwrap();
    let (code, out, err) = braid(&["trace", path.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out);
    let c = &r["connections"][0];
    assert_eq!(c["a"], "[2001:db8::1]:1000");
    assert_eq!(c["a2b"]["data_bytes"], 4000);
    assert_eq!(c["a2b"]["unique_bytes"], 3000);
    assert_eq!(
        (
            c["a2b"]["rexmt_packets"].as_u64(),
            c["a2b"]["rexmt_bytes"].as_u64()
        ),
        (Some(1), Some(1000))
    );
    // 4.5 ms from first to last, at nanosecond resolution.
    assert!(
        (c["duration_s"].as_f64().unwrap() - 0.0045).abs() < 1e-9,
        "{c}"
    );
    assert_eq!(c["a2b"]["wire_bytes"], 4 * 1060);
}
