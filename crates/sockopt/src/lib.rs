//! The socket options braid needs that socket2 and rustix do not offer: the kernel's view of a
//! TCP connection (`TCP_INFO`), a cap on its sending rate (`SO_MAX_PACING_RATE`) and a cap on
//! the window it advertises (`TCP_WINDOW_CLAMP`), and the room left in its send buffer
//! (`SO_MEMINFO`).
//!
//! This is the only crate in braid with `unsafe` code: system calls with a pointer and a
//! length, each in a few lines that can be checked by eye.

use std::os::fd::{AsFd, AsRawFd};

/// What the kernel knows about one TCP connection, in the units braid uses. Fields the running
/// kernel does not fill stay zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed round-trip time, µs.
    pub rtt_us: u32,
    /// Its mean deviation, µs.
    pub rttvar_us: u32,
    /// The lowest RTT seen on this connection, µs (a base-delay estimate).
    pub min_rtt_us: u32,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Maximum segment size used for sending, bytes.
    pub snd_mss: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Bytes retransmitted over the connection's life.
    pub bytes_retrans: u64,
    /// Bytes sent, including retransmissions.
    pub bytes_sent: u64,
    /// Bytes the peer acknowledged.
    pub bytes_acked: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// The rate the kernel paces at now, bytes/s (`u64::MAX`: unpaced).
    pub pacing_rate: u64,
    /// The cap set with `SO_MAX_PACING_RATE`, bytes/s (`u64::MAX`: none).
    pub max_pacing_rate: u64,
    /// The kernel's latest delivery-rate sample, bytes/s.
    pub delivery_rate: u64,
    /// Time spent with data in flight, µs.
    pub busy_us: u64,
    /// Of that, time limited by the receiver's window, µs.
    pub rwnd_limited_us: u64,
    /// Of that, time limited by the send buffer, µs.
    pub sndbuf_limited_us: u64,
    /// Bytes written but not yet sent.
    pub notsent_bytes: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// The receiver's RTT estimate, µs (useful on the receiving side, where `rtt_us` is stale).
    pub rcv_rtt_us: u32,
    /// The receive window the kernel is willing to grow to, bytes.
    pub rcv_space: u32,
    /// How long ago the last acknowledgement came in, ms (in jiffies: 4 ms steps at HZ=250).
    pub last_ack_recv_ms: u32,
}

/// Reads `TCP_INFO`. None if the socket is not TCP or the call fails (it cannot block).
pub fn tcp_info(sock: &impl AsFd) -> Option<TcpInfo> {
    let fd = sock.as_fd().as_raw_fd();
    // SAFETY: `tcp_info` is plain old data, valid when zeroed. The kernel writes at most `len`
    // bytes into it and reports how many; fields past that stay zero.
    #[allow(unsafe_code)]
    let (raw, ok) = unsafe {
        let mut raw: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut raw as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (raw, r == 0)
    };
    ok.then_some(TcpInfo {
        rtt_us: raw.tcpi_rtt,
        rttvar_us: raw.tcpi_rttvar,
        min_rtt_us: raw.tcpi_min_rtt,
        cwnd: raw.tcpi_snd_cwnd,
        snd_mss: raw.tcpi_snd_mss,
        total_retrans: raw.tcpi_total_retrans,
        bytes_retrans: raw.tcpi_bytes_retrans,
        bytes_sent: raw.tcpi_bytes_sent,
        bytes_acked: raw.tcpi_bytes_acked,
        bytes_received: raw.tcpi_bytes_received,
        pacing_rate: raw.tcpi_pacing_rate,
        max_pacing_rate: raw.tcpi_max_pacing_rate,
        delivery_rate: raw.tcpi_delivery_rate,
        busy_us: raw.tcpi_busy_time,
        rwnd_limited_us: raw.tcpi_rwnd_limited,
        sndbuf_limited_us: raw.tcpi_sndbuf_limited,
        notsent_bytes: raw.tcpi_notsent_bytes,
        unacked: raw.tcpi_unacked,
        rcv_rtt_us: raw.tcpi_rcv_rtt,
        rcv_space: raw.tcpi_rcv_space,
        last_ack_recv_ms: raw.tcpi_last_ack_recv,
    })
}

/// `SO_MAX_PACING_RATE`, the Linux number (the same on every architecture braid builds for
/// except SPARC, which it does not).
const SO_MAX_PACING_RATE: libc::c_int = 47;

/// Caps the rate at which the kernel sends on `sock`, bytes/s; None lifts the cap. TCP paces
/// by itself since Linux 4.13, so this works without the fq qdisc.
pub fn set_max_pacing_rate(sock: &impl AsFd, bytes_per_second: Option<u64>) -> std::io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    // The kernel takes an unsigned long here (u32 before 4.20); u64::MAX means "no cap".
    let rate: libc::c_ulong =
        bytes_per_second.map_or(libc::c_ulong::MAX, |r| r.max(1) as libc::c_ulong);
    // SAFETY: the pointer and length describe `rate`, which outlives the call.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MAX_PACING_RATE,
            (&rate as *const libc::c_ulong).cast(),
            std::mem::size_of::<libc::c_ulong>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Caps the receive window `sock` advertises, bytes (`TCP_WINDOW_CLAMP`): the sender can have
/// no more than this in flight, whatever its congestion control, so a receiver sets the rate
/// of a sender it cannot tell (rLEDBAT, RFC 9840). The kernel never takes back a window it
/// has advertised, so a lower cap holds from the next round trip, and it keeps at least
/// about 2 kB. Its receive-buffer autotuning may raise the cap again: set it every time.
pub fn set_window_clamp(sock: &impl AsFd, bytes: u32) -> std::io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    let clamp: libc::c_int = bytes.clamp(1, i32::MAX as u32) as libc::c_int;
    // SAFETY: the pointer and length describe `clamp`, which outlives the call.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&clamp as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The receive window cap in force (`TCP_WINDOW_CLAMP`), bytes.
pub fn window_clamp(sock: &impl AsFd) -> std::io::Result<u32> {
    let fd = sock.as_fd().as_raw_fd();
    let mut clamp: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `clamp`, which outlives the call.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&mut clamp as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(clamp.max(0) as u32)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `SO_MEMINFO`, the Linux number (the same on every architecture braid builds for except
/// SPARC and MIPS, which it does not).
const SO_MEMINFO: libc::c_int = 55;

/// Bytes `sock` can take now without a write blocking: its send buffer's size less what is
/// queued in it (`SO_MEMINFO`, in the kernel's accounting, which counts each packet's
/// overhead too). A write blocks only once the queue has reached the buffer's size, so one
/// that is smaller than this room, with a margin for that overhead, returns at once.
pub fn send_room(sock: &impl AsFd) -> std::io::Result<u64> {
    let fd = sock.as_fd().as_raw_fd();
    // SK_MEMINFO_VARS is 9 today; room for more, which the kernel fills only as far as `len`.
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the pointer and length describe `info`, which outlives the call.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (sndbuf, queued) = (
        libc::SK_MEMINFO_SNDBUF as usize,
        libc::SK_MEMINFO_WMEM_QUEUED as usize,
    );
    if (len as usize) < (queued + 1) * 4 {
        return Err(std::io::Error::other("SO_MEMINFO is too short"));
    }
    Ok(u64::from(info[sndbuf]).saturating_sub(u64::from(info[queued])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn tcp_info_counts_what_moved_and_the_pacing_cap_is_reported_back() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        a.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        b.read_exact(&mut got).unwrap();
        let sent = tcp_info(&a).unwrap();
        let received = tcp_info(&b).unwrap();
        assert_eq!(
            sent.bytes_acked, 100_001,
            "the SYN counts as one acknowledged byte"
        );
        assert_eq!(received.bytes_received, 100_000);
        assert!(sent.rtt_us > 0 && sent.cwnd > 0, "{sent:?}");
        set_max_pacing_rate(&a, Some(1_000_000)).unwrap();
        assert_eq!(tcp_info(&a).unwrap().max_pacing_rate, 1_000_000);
        set_max_pacing_rate(&a, None).unwrap();
        assert_eq!(tcp_info(&a).unwrap().max_pacing_rate, u64::MAX);
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(tcp_info(&file), None, "not a socket");
    }

    #[test]
    fn a_window_clamp_is_set_and_read_back_with_the_kernels_minimum() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        set_window_clamp(&b, 8192).unwrap();
        assert_eq!(window_clamp(&b).unwrap(), 8192);
        set_window_clamp(&b, 1).unwrap();
        let least = window_clamp(&b).unwrap();
        assert!((1..8192).contains(&least), "{least}");
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(set_window_clamp(&file, 8192).is_err(), "not a socket");
    }

    #[test]
    fn send_room_shrinks_as_a_peer_that_does_not_read_lets_the_queue_fill() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_b, _) = l.accept().unwrap();
        let empty = send_room(&a).unwrap();
        assert!(empty > 0);
        // Fill until a write would block: the peer's receive buffer, then this send buffer.
        a.set_nonblocking(true).unwrap();
        let chunk = [1u8; 65536];
        let mut a_ref = &a;
        while a_ref.write(&chunk).is_ok() {}
        let full = send_room(&a).unwrap();
        assert!(
            full < 65536,
            "{full} bytes of room with a full queue (empty: {empty})"
        );
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(send_room(&file).is_err(), "not a socket");
    }
}
