//! braid: move large files fast over long, fat, slow or lossy networks.
//!
//! Layers: `braid-proto` holds the protocol without I/O; [`fsroot`] confines file access to a
//! root; [`server`] and [`client`] are the I/O around the protocol; [`cli`] is the command line.

pub mod bench;
pub mod cli;
pub mod client;
pub mod demo;
pub mod engine;
pub mod fanout;
pub mod fsroot;
pub mod lab;
pub mod model;
pub mod server;
pub mod sums;
pub mod trace;
pub mod units;
pub mod users;
pub mod warnings;
