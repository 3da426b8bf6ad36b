//! GSI's control-connection tokens: TLS records carried in base64 (in ADAT commands and
//! their 335/235 replies, in ENC/MIC commands and 63x replies), fed to and taken from a
//! rustls connection in memory. Both ends' contexts use them (`client::gsi`, `server::gsi`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use std::io::Read;

/// Why a token could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("a token is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// TLS refused what the records said (a handshake failed): the caller says why.
    #[error("{0}")]
    Tls(rustls::Error),
}

/// Feeds the records of base64 `token` to `tls`.
pub fn take<T>(tls: &mut rustls::ConnectionCommon<T>, token: &str) -> Result<(), TokenError> {
    let bytes = B64.decode(token.trim())?;
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        tls.read_tls(&mut rest)?;
        tls.process_new_packets().map_err(TokenError::Tls)?;
    }
    Ok(())
}

/// The records `tls` has to send now, in base64 (empty when none).
pub fn give<T>(tls: &mut rustls::ConnectionCommon<T>) -> std::io::Result<String> {
    let mut out = Vec::new();
    while tls.wants_write() {
        tls.write_tls(&mut out)?;
    }
    Ok(if out.is_empty() {
        String::new()
    } else {
        B64.encode(out)
    })
}

/// The plain bytes the records taken so far carried and nobody has read.
pub fn plain<T>(tls: &mut rustls::ConnectionCommon<T>) -> std::io::Result<Vec<u8>> {
    let mut plain = Vec::new();
    match tls.reader().read_to_end(&mut plain) {
        Ok(_) => Ok(plain),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(plain),
        Err(e) => Err(e),
    }
}
