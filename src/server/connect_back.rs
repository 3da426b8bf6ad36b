//! `braid connect-back`, which `braid cp` runs on the far side through ssh when its data
//! connections cannot reach the far side (a firewall in front of its ports) but the far side
//! may reach the client: the far side then opens them, as bbcp's `-z` does. Each request on
//! standard input (`braid_proto::connect_back`) asks for one: a connection to the client's
//! port at the address ssh came from, and one to this host's data port (the session's own
//! listener, which admits connections from this host), with the bytes carried between them
//! until either end closes. The data stays TLS bound to the session end to end. Ends when
//! standard input closes: the client is done, or gone.

use braid_proto::connect_back::Request;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// How long one connection may take to open: the client gives up on it after about as long.
const OPEN_LIMIT: Duration = Duration::from_secs(5);
/// Each direction's buffer when carrying bytes: large reads and writes, few system calls.
const CARRY_BUFFER: usize = 256 << 10;

/// Serves requests from standard input until it closes.
pub fn run() -> anyhow::Result<()> {
    let (client, here) = super::ssh_ends(std::env::var("SSH_CONNECTION").ok().as_deref())
        .ok_or_else(|| {
            anyhow::anyhow!("connect-back runs under ssh (SSH_CONNECTION is not set)")
        })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(client.ip(), here.ip()));
    // Connections still carrying bytes end with the process: the client is done.
    rt.shutdown_background();
    Ok(())
}

async fn serve(client: IpAddr, here: IpAddr) {
    let (said, mut answers) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = answers.recv().await {
            if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
                return;
            }
        }
    });
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let r = match Request::parse(&line) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("braid connect-back: {e}");
                continue;
            }
        };
        // Only to this host's own data address: this is not a general proxy.
        if r.target.ip() != here {
            let _ = said.send(r.failed(&format!("only this host's data address {here} is served")));
            continue;
        }
        let said = said.clone();
        tokio::spawn(async move {
            if let Err(e) = carry(&r, client).await {
                let _ = said.send(r.failed(&e));
            }
        });
    }
}

/// Opens both ends of one request and carries bytes between them.
async fn carry(r: &Request, client: IpAddr) -> Result<(), String> {
    let open = |addr: SocketAddr| async move {
        match tokio::time::timeout(OPEN_LIMIT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
            Err(_) => Err(format!(
                "no answer from {addr} in {}s",
                OPEN_LIMIT.as_secs()
            )),
        }
    };
    // The client first: a local connection opened for nothing would be a stranger to the
    // session's listener.
    let mut back = open(SocketAddr::new(client, r.port)).await?;
    let mut local = open(r.target).await?;
    for s in [&back, &local] {
        let _ = s.set_nodelay(true);
    }
    back.write_all(&r.token)
        .await
        .map_err(|e| format!("writing to the client: {e}"))?;
    let _ =
        tokio::io::copy_bidirectional_with_sizes(&mut back, &mut local, CARRY_BUFFER, CARRY_BUFFER)
            .await;
    Ok(())
}
