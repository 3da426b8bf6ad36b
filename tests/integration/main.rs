//! One integration-test binary (linking is the slow part on two cores), one module per area.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod abuse;
mod admin;
mod background;
mod cli;
mod compress;
mod cp;
mod curl;
mod diskfull;
mod elastic;
mod ftplib;
mod globus;
mod gsi;
mod hostile;
mod interop;
mod lab;
mod layers;
mod lftp;
mod parallel;
mod proftpd;
mod quota;
mod safety;
mod scripted;
mod stripes;
mod third_party;
mod tls;
mod trace;
mod tree;
mod uploads;
mod util;
mod vsftpd;
