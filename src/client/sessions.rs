//! Sessions: the first of a transfer, and further ones for segments and tree workers.

use super::Options;
use super::control::Control;
use super::error::{ClientError, Result};
use super::url::Target;

/// Connects, logs in, reads FEAT, sets TYPE I. `size_of`: a file whose SIZE is asked in the
/// same flight where the server pipelines (a braid server).
pub fn session(target: &Target, opts: &Options, size_of: Option<&str>) -> Result<Control> {
    let mut c = match &opts.ssh {
        Some(ssh) => ssh.session()?,
        None => Control::connect(target)?,
    };
    c.set_verbose(opts.verbose);
    c.deflate = opts.compress == braid_proto::compress::Policy::On;
    if target.gsi {
        let credential = super::gsi_creds::credential().map_err(ClientError::Usage)?;
        c.start_gsi(&credential, &target.host)?;
    } else if let Some(tls) = &opts.tls {
        c.start_tls(tls, &target.host)?;
    }
    c.start(target, size_of)?;
    Ok(c)
}

/// A further session for a transfer that has one already (a segment's, a tree's worker's):
/// tried at once, then again after 0.1, 0.4 and 1.6 s, since a server that limits sessions
/// per client (421) still counts one that has just closed. The last failure when every try
/// failed; `give_up` (Ctrl-C, an aborted download) stops the tries.
pub fn another_session(
    target: &Target,
    opts: &Options,
    give_up: impl Fn() -> bool,
) -> Result<Control> {
    let mut last = ClientError::Interrupted {
        bytes: 0,
        why: "stopped before a new session started".into(),
        partial: None,
    };
    for wait in [0, 100, 400, 1600] {
        std::thread::sleep(std::time::Duration::from_millis(wait));
        if give_up() {
            break;
        }
        match session(target, opts, None) {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_further_session_that_is_given_up_stops_before_it_connects() {
        // Nothing listens on port 9 of loopback, but no connection is tried at all.
        let target = Target {
            gsi: false,
            host: "127.0.0.1".into(),
            port: 9,
            user: "anonymous".into(),
            password: String::new(),
            path: String::new(),
        };
        let started = std::time::Instant::now();
        let e = another_session(&target, &Options::default(), || true)
            .err()
            .unwrap();
        assert!(matches!(e, ClientError::Interrupted { .. }), "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_millis(90),
            "it waited for the retries"
        );
    }
}
