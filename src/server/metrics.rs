//! `--metrics ADDR`: the server's counters in the Prometheus (OpenMetrics) text format at
//! `http://ADDR/metrics`, for a Prometheus server to scrape.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Way {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Ended {
    direction: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UserWay {
    user: String,
    direction: &'static str,
}

/// Everything counted, shared by all sessions and kept across reloads.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    sessions: Gauge,
    in_progress: Family<Way, Gauge>,
    bytes: Family<Way, Counter>,
    transfers: Family<Ended, Counter>,
    login_failures: Counter,
    data_connections: Gauge,
    user_bytes: Family<UserWay, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let m = Metrics {
            registry: Registry::with_prefix("braid"),
            sessions: Gauge::default(),
            in_progress: Family::default(),
            bytes: Family::default(),
            transfers: Family::default(),
            login_failures: Counter::default(),
            data_connections: Gauge::default(),
            user_bytes: Family::default(),
        };
        let mut registry = m.registry;
        registry.register("sessions", "Control connections open", m.sessions.clone());
        registry.register(
            "transfers_in_progress",
            "Transfers running, by direction (upload, download)",
            m.in_progress.clone(),
        );
        registry.register_with_unit(
            "transferred",
            "Payload bytes moved, by direction, counted while transfers run",
            Unit::Bytes,
            m.bytes.clone(),
        );
        registry.register(
            "transfers",
            "Transfers ended, by direction and outcome (complete, aborted, connection_lost, ...)",
            m.transfers.clone(),
        );
        registry.register(
            "login_failures",
            "Logins refused for a wrong user or password",
            m.login_failures.clone(),
        );
        registry.register(
            "data_connections",
            "Data connections open",
            m.data_connections.clone(),
        );
        registry.register_with_unit(
            "user_transferred",
            "Payload bytes moved, by user (anonymous for anonymous sessions) and direction",
            Unit::Bytes,
            m.user_bytes.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Counts a session until the guard is dropped.
    pub fn session(self: &Arc<Self>) -> SessionGuard {
        self.sessions.inc();
        SessionGuard(self.clone())
    }

    pub fn login_failed(&self) {
        self.login_failures.inc();
    }

    /// Counts a transfer as running until its [`Live`] is dropped.
    pub fn transfer(self: &Arc<Self>, upload: bool, user: Option<&str>) -> Live {
        let direction = if upload { "upload" } else { "download" };
        let way = Way { direction };
        self.in_progress.get_or_create(&way).inc();
        Live {
            metrics: self.clone(),
            user: UserWay {
                user: user.unwrap_or("anonymous").to_string(),
                direction,
            },
            way,
            bytes: 0,
            connections: 0,
        }
    }

    /// The text a scrape gets.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode the metrics: {e}");
        }
        out
    }
}

pub struct SessionGuard(Arc<Metrics>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.sessions.dec();
    }
}

/// One running transfer's share of the counts; dropping it ends the transfer's.
pub struct Live {
    metrics: Arc<Metrics>,
    way: Way,
    user: UserWay,
    /// What has been counted so far.
    bytes: u64,
    connections: i64,
}

impl Live {
    /// Brings the counts up to `bytes` moved over `connections` open data connections.
    pub fn update(&mut self, bytes: u64, connections: usize) {
        let more = bytes.saturating_sub(self.bytes);
        if more > 0 {
            self.metrics.bytes.get_or_create(&self.way).inc_by(more);
            self.metrics
                .user_bytes
                .get_or_create(&self.user)
                .inc_by(more);
            self.bytes = bytes;
        }
        let connections = connections as i64;
        self.metrics
            .data_connections
            .inc_by(connections - self.connections);
        self.connections = connections;
    }

    /// The transfer ended with `bytes` moved; `outcome` is how.
    pub fn end(mut self, bytes: u64, outcome: &'static str) {
        self.update(bytes, 0);
        let ended = Ended {
            direction: self.way.direction,
            outcome,
        };
        self.metrics.transfers.get_or_create(&ended).inc();
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.update(self.bytes, 0);
        self.metrics.in_progress.get_or_create(&self.way).dec();
    }
}

/// Answers `GET /metrics` on `listener` until the server stops. One request per connection;
/// anything else gets 404, and a client that sends nothing useful in 5 s is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, &metrics)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() > 8192 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, kind, body) = if head.starts_with(b"GET /metrics ") {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "braid serves its metrics at /metrics\n".into(),
        )
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_transfer_counts_while_it_runs_and_once_it_ends() {
        let m = Arc::new(Metrics::default());
        let session = m.session();
        let mut live = m.transfer(false, Some("alice"));
        live.update(1000, 4);
        let t = m.encode();
        assert_eq!(value(&t, "braid_sessions"), Some(1.0), "{t}");
        assert_eq!(
            value(&t, "braid_transfers_in_progress{direction=\"download\"}"),
            Some(1.0),
            "{t}"
        );
        assert_eq!(value(&t, "braid_data_connections"), Some(4.0), "{t}");
        assert_eq!(
            value(&t, "braid_transferred_bytes_total{direction=\"download\"}"),
            Some(1000.0),
            "{t}"
        );
        live.update(1500, 2);
        live.end(2000, "complete");
        drop(session);
        m.login_failed();
        let t = m.encode();
        assert_eq!(value(&t, "braid_sessions"), Some(0.0), "{t}");
        assert_eq!(
            value(&t, "braid_transfers_in_progress{direction=\"download\"}"),
            Some(0.0),
            "{t}"
        );
        assert_eq!(value(&t, "braid_data_connections"), Some(0.0), "{t}");
        assert_eq!(
            value(&t, "braid_transferred_bytes_total{direction=\"download\"}"),
            Some(2000.0),
            "{t}"
        );
        assert_eq!(
            value(
                &t,
                "braid_user_transferred_bytes_total{user=\"alice\",direction=\"download\"}"
            ),
            Some(2000.0),
            "{t}"
        );
        assert_eq!(
            value(
                &t,
                "braid_transfers_total{direction=\"download\",outcome=\"complete\"}"
            ),
            Some(1.0),
            "{t}"
        );
        assert_eq!(value(&t, "braid_login_failures_total"), Some(1.0), "{t}");
    }

    #[test]
    fn a_transfer_that_is_dropped_stops_counting_as_running() {
        let m = Arc::new(Metrics::default());
        let mut live = m.transfer(true, None);
        live.update(10, 3);
        drop(live);
        let t = m.encode();
        assert_eq!(
            value(&t, "braid_transfers_in_progress{direction=\"upload\"}"),
            Some(0.0),
            "{t}"
        );
        assert_eq!(value(&t, "braid_data_connections"), Some(0.0), "{t}");
    }
}
