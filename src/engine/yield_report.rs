//! What background mode's controller reports of a transfer: its rate over time and the
//! queueing it saw. Apart from the controller, so that the pacing hooks, which carry a report
//! whatever paces them, need not know the controller.

/// One second of the controller's life, for `--json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Point {
    /// Seconds since the transfer started.
    pub t: f64,
    /// The queueing delay seen (probe round trip above the base), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// The base round trip, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<f64>,
    /// The rate it paces at, bytes/s.
    pub rate: u64,
    /// The rate delivered, bytes/s.
    pub delivered: u64,
}

/// What the controller saw and did over a transfer.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    pub target_ms: f64,
    /// Probes answered.
    pub probes: u64,
    /// The base round trip at the end, ms.
    pub base_ms: Option<f64>,
    /// Queueing delay over the probes, ms: median and 95th percentile.
    pub queue_p50_ms: Option<f64>,
    pub queue_p95_ms: Option<f64>,
    /// Seconds spent yielding: cutting the rate, or holding after a cut, or slowed down to
    /// re-measure the base.
    pub yielded_s: f64,
    pub slowdowns: u32,
    /// The rate over time.
    pub timeline: Vec<Point>,
}
