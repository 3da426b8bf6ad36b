//! For unit tests: a control connection to a scripted server on loopback, which greets, sends
//! its script whatever it is told, and hands back everything the client sent, so a test sees
//! both what the client made of the replies and what it said.

use super::control::Control;
use super::error::Result;
use super::url::Target;
use std::io::{Read, Write};
use std::thread::JoinHandle;

/// A listing's entry of a `kind` (`file`, `dir`, ...), one byte long.
pub fn listed(name: &str, kind: &str) -> super::ListEntry {
    super::ListEntry {
        name: name.into(),
        kind: Some(kind.into()),
        size: Some(1),
        modify: None,
        raw: None,
    }
}

/// The scripted server: what the client sent, once it has closed.
pub type Script = JoinHandle<String>;

/// A connection greeted with `220` that then receives `script`.
pub fn scripted(script: &'static [u8]) -> (Control, Script) {
    let (c, server) = greeted(b"220 hi\r\n", script);
    (c.expect("the scripted server greets"), server)
}

/// A connection greeted with `greeting` that then receives `script`; the connection, or why
/// it failed.
pub fn greeted(greeting: &'static [u8], script: &'static [u8]) -> (Result<Control>, Script) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let server = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return String::new();
        };
        let _ = s.write_all(greeting);
        let _ = s.write_all(script);
        let mut heard = Vec::new();
        let _ = s.read_to_end(&mut heard);
        String::from_utf8_lossy(&heard).into_owned()
    });
    let target = Target {
        gsi: false,
        host: "127.0.0.1".into(),
        port,
        user: "anonymous".into(),
        password: String::new(),
        path: String::new(),
    };
    (Control::connect(&target), server)
}

/// Closes the client's side; what it sent.
pub fn done(c: Control, server: Script) -> String {
    drop(c);
    server.join().expect("the scripted server")
}
