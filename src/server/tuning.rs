//! The count of a copy's data connections, tuned by the server that sends it. In a copy
//! between servers this server opens the connections to the other one, and only it sees that
//! path (the client, which chooses the count of its own transfers with `-n auto`, sees
//! neither end's): given a range of counts (`OPTS RETR Parallelism=start,min,most`) it runs
//! the same self-tuning on its own connections, opening more to the other server's address as
//! the tuning asks and retiring some as it gives them up.

use crate::engine::hooks::{Cap, Steering};
use crate::engine::transfer::Transfer as Moving;
use crate::engine::tune::{self, Tuning};
use braid_proto::session::{BlockMode, DataEndpoint, ThirdParty, Transfer};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// How long opening one more connection may take before the tuning counts it as refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The steering of a copy this server sends and tunes, and where the connections it opens
/// join the transfer; None for every other transfer, and for one whose pace the server or the
/// client sets (a rate, background mode, a class's share: a count judged by its goodput under
/// a cap would be judged wrong).
pub(super) fn tuned(
    t: &Transfer,
    b: &BlockMode,
    left: Option<u64>,
    paced: bool,
    local: IpAddr,
    moving: &Moving,
    idle: Duration,
) -> Option<(Steering, Receiver<TcpStream>)> {
    let (DataEndpoint::Active(to), Some(ThirdParty::Connect(_))) = (&t.endpoint, &t.third_party)
    else {
        return None;
    };
    if b.most <= b.parallelism || !b.elastic || paced || b.max_rate.is_some() {
        return None;
    }
    let mut tuning = Tuning::new(b.block_size.unwrap_or(crate::engine::DEFAULT_BLOCK));
    tuning.start = b.parallelism as usize;
    tuning.max = b.most as usize;
    tuning.try_congestion = b.congestion.is_none();
    let mut steering = Steering::new(
        Box::new(tune::Auto::new(tuning)),
        Box::new(Cap(None)),
        true,
        left,
    );
    let (to, buffer) = (*to, t.buffer);
    let connect = move || connect(to, local, idle);
    let rx = steering.open_with(b.parallelism as usize, connect, buffer, moving.waker());
    Some((steering, rx))
}

/// One more data connection to `to`, from this server's control address (as the first ones),
/// blocking, with the idle timeout on its reads and writes.
fn connect(to: SocketAddr, local: IpAddr, idle: Duration) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    let _ = sock.bind(&SocketAddr::new(local, 0).into());
    sock.connect_timeout(&to.into(), CONNECT_TIMEOUT)?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(idle))?;
    s.set_write_timeout(Some(idle))?;
    Ok(s)
}
