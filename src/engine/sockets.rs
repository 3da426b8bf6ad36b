//! What braid sets on a data connection's socket beyond its buffers: congestion control,
//! DSCP, and bbr's restart under a raised pacing cap. Shared by the MODE E transfer and
//! background mode on one stream-mode connection.

use braid_proto::retr_opts::CcName;
use std::net::TcpStream;

/// Sets a connection's congestion control; a name the kernel does not know (a module not
/// loaded) leaves the default, and says so.
pub fn set_congestion(sock: &TcpStream, cc: CcName) {
    if let Err(e) = socket2::SockRef::from(sock).set_tcp_congestion(cc.as_str().as_bytes()) {
        tracing::warn!(
            "cannot use congestion control {cc} ({e}); see /proc/sys/net/ipv4/tcp_available_congestion_control"
        );
    }
}

/// How far a pacing cap must rise at once for bbr to be started afresh under it.
pub const RESTART_ABOVE: f64 = 2.0;

/// bbr paces at its own estimate of the path's rate and raises it by a quarter per eight
/// round trips at most: after a while under a low cap (background mode behind a competitor),
/// a cap raised twentyfold took it two seconds to follow at 1 Mbit/s, 20 ms. Setting the
/// congestion control again starts it afresh, in startup, which doubles its rate each round
/// trip up to the cap. The kernel keeps a control set to itself as it is, so reno, always
/// allowed, goes in between. Other controls are left alone: cubic sends what its window
/// allows as soon as the cap rises.
pub fn restart_bbr(sock: &TcpStream) {
    if congestion_of(sock).is_none_or(|cc| cc.as_str() != "bbr") {
        return;
    }
    let s = socket2::SockRef::from(sock);
    if let Err(e) = s.set_tcp_congestion(b"reno") {
        tracing::debug!("cannot restart bbr: {e}");
    } else if let Err(e) = s.set_tcp_congestion(b"bbr") {
        tracing::warn!(
            "cannot go back to bbr after restarting it ({e}): this connection runs reno"
        );
    }
}

/// The congestion control a connection runs, as the kernel names it.
pub fn congestion_of(sock: &TcpStream) -> Option<CcName> {
    let name = socket2::SockRef::from(sock).tcp_congestion().ok()?;
    let name = String::from_utf8_lossy(&name);
    CcName::parse(name.trim_end_matches('\0')).ok()
}

/// Marks a connection's packets with a DSCP (the upper six bits of the TOS byte, or of the
/// IPv6 traffic class); a refusal leaves them unmarked, and says so.
pub fn set_dscp(sock: &TcpStream, dscp: u8) {
    let s = socket2::SockRef::from(sock);
    let tos = u32::from(dscp) << 2;
    let r = match sock.local_addr() {
        Ok(std::net::SocketAddr::V6(_)) => s.set_tclass_v6(tos),
        _ => s.set_tos_v4(tos),
    };
    if let Err(e) = r {
        tracing::warn!("cannot mark data packets with DSCP {dscp}: {e}");
    }
}
