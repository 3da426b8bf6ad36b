//! `ftp://[user[:password]@]host[:port]/path` and where the password comes from;
//! `gsiftp://[user@]host[:port]/path` logs in with a GSI credential instead.

use super::error::{ClientError, Result};

/// A parsed FTP URL with its credentials resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// Path on the server, percent-decoded, as sent in commands (without the leading `/` of
    /// the URL, per RFC 1738: relative to the login directory).
    pub path: String,
    /// `gsiftp://`: the login is a GSI security context (the user's X.509 credential), the
    /// commands and replies protected by it.
    pub gsi: bool,
}

/// Where credentials may come from besides the URL, so tests need not touch the real
/// environment.
#[derive(Debug, Default, Clone)]
pub struct CredentialSources {
    /// `BRAID_PASSWORD`.
    pub env_password: Option<String>,
    /// Contents of `~/.netrc`.
    pub netrc: Option<String>,
    /// Asks for a password on the terminal (the prompt given); None when there is no terminal
    /// to ask on.
    pub ask: Option<fn(&str) -> Option<String>>,
}

/// Reads a password from the terminal without echo; None if that fails.
fn ask_on_terminal(prompt: &str) -> Option<String> {
    rpassword::prompt_password(prompt).ok()
}

impl CredentialSources {
    pub fn from_env() -> CredentialSources {
        let netrc = std::env::var_os("NETRC")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".netrc"))
            })
            .and_then(|p| std::fs::read_to_string(p).ok());
        use std::io::IsTerminal;
        CredentialSources {
            env_password: std::env::var("BRAID_PASSWORD").ok(),
            netrc,
            ask: std::io::stdin()
                .is_terminal()
                .then_some(ask_on_terminal as fn(&str) -> Option<String>),
        }
    }
}

/// Whether `arg` is a server's URL (`ftp://` or `gsiftp://`) rather than a local path or an
/// ssh destination.
pub fn is_url(arg: &str) -> bool {
    let lower = arg.to_ascii_lowercase();
    lower.starts_with("ftp://") || lower.starts_with("gsiftp://")
}

/// Parses a URL. The password is taken, in order, from the URL, `BRAID_PASSWORD`, then a
/// `~/.netrc` entry for the host (which may also supply the user), then the terminal. Without
/// a user anywhere, the login is anonymous; a user with no password anywhere and no terminal
/// to ask on is a usage error (`user:@host` says the password is empty).
pub fn parse(text: &str, creds: &CredentialSources) -> Result<Target> {
    let url =
        url::Url::parse(text).map_err(|e| ClientError::Usage(format!("bad URL {text:?}: {e}")))?;
    let gsi = match url.scheme() {
        "ftp" => false,
        "gsiftp" => true,
        other => {
            return Err(ClientError::Usage(format!(
                "unsupported URL scheme {other:?} in {text:?}: braid speaks ftp:// and gsiftp://"
            )));
        }
    };
    let host = url
        .host_str()
        .ok_or_else(|| ClientError::Usage(format!("URL {text:?} has no host")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = url.port().unwrap_or(if gsi { 2811 } else { 21 });
    let decode = |s: &str| {
        percent_decode(s).map_err(|_| {
            ClientError::Usage(format!(
                "URL {text:?} is not valid UTF-8 after percent-decoding"
            ))
        })
    };
    let mut user = decode(url.username())?;
    let path = decode(url.path())?;
    // A gsiftp:// path is absolute (`/~/` for the login directory), as globus-url-copy reads
    // it; an ftp:// one is relative to the login directory (RFC 1738).
    let path = match path.strip_prefix("/~/") {
        Some(home) if gsi => home.to_string(),
        _ if gsi => path,
        _ => path.strip_prefix('/').unwrap_or(&path).to_string(),
    };
    if path.contains(['\r', '\n', '\0']) {
        return Err(ClientError::Usage(format!(
            "URL path in {text:?} contains a line break or NUL"
        )));
    }
    if gsi {
        // The credential says who logs in; the server maps it to an account (the one named,
        // or its grid-mapfile's). No password is asked for or sent.
        if user.is_empty() {
            user = ":globus-mapping:".into();
        }
        return Ok(Target {
            host,
            port,
            user,
            password: String::new(),
            path,
            gsi,
        });
    }
    let mut password = url.password().map(decode).transpose()?;
    if password.is_none() && !user.is_empty() {
        password = creds.env_password.clone();
    }
    if password.is_none()
        && let Some((u, p)) = creds.netrc.as_deref().and_then(|n| netrc_lookup(n, &host))
        && (user.is_empty() || user == u)
    {
        user = u;
        password = Some(p);
    }
    if user.is_empty() {
        user = "anonymous".into();
        password.get_or_insert_with(|| "braid@".into());
    }
    let password = match (password, creds.ask) {
        (Some(p), _) => p,
        (None, Some(ask)) => ask(&format!("Password for {user}@{host}: ")).ok_or_else(|| {
            ClientError::Usage(format!(
                "could not read a password for {user} from the terminal"
            ))
        })?,
        (None, None) => {
            return Err(ClientError::Usage(format!(
                "no password for {user}@{host}: give it in the URL (ftp://{user}:PASSWORD@{host}/...), \
                 in BRAID_PASSWORD (empty for an empty one) or in ~/.netrc, or run braid on a \
                 terminal to be asked"
            )));
        }
    };
    Ok(Target {
        host,
        port,
        user,
        password,
        path,
        gsi,
    })
}

fn percent_decode(s: &str) -> std::result::Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
}

/// Finds `login` and `password` for `host` (or a `default` entry) in netrc text.
pub fn netrc_lookup(text: &str, host: &str) -> Option<(String, String)> {
    let mut tokens = text.split_whitespace();
    let mut current: Option<bool> = None; // Some(true) inside the matching machine entry
    let (mut login, mut password) = (None, None);
    while let Some(tok) = tokens.next() {
        match tok {
            "machine" => {
                if current == Some(true) {
                    break;
                }
                current = Some(tokens.next() == Some(host));
            }
            "default" => {
                if current == Some(true) {
                    break;
                }
                current = Some(true);
            }
            "login" if current == Some(true) => login = tokens.next().map(str::to_string),
            "password" if current == Some(true) => password = tokens.next().map(str::to_string),
            "macdef" if current == Some(true) => break,
            _ => {}
        }
    }
    Some((login?, password?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gsiftp_url_is_absolute_asks_no_password_and_maps_the_credential() {
        // A password source that would be asked is not: GSI needs none.
        let asking = CredentialSources {
            env_password: Some("secret".into()),
            netrc: Some("machine grid.example login al password pw".into()),
            ask: Some(|_| panic!("asked for a password")),
        };
        let t = parse("gsiftp://grid.example/data/run%207/f", &asking).unwrap();
        assert!(t.gsi);
        assert_eq!(
            (
                t.user.as_str(),
                t.password.as_str(),
                t.port,
                t.path.as_str()
            ),
            (":globus-mapping:", "", 2811, "/data/run 7/f")
        );
        let t = parse("gsiftp://al@grid.example:2812/~/f", &asking).unwrap();
        assert_eq!(
            (t.user.as_str(), t.port, t.path.as_str()),
            ("al", 2812, "f")
        );
        assert!(!parse("ftp://grid.example/f", &asking).unwrap().gsi);
        assert!(is_url("GSIFTP://h/x") && is_url("ftp://h/x") && !is_url("h:/x"));
        let e = parse("sftp://h/x", &asking).unwrap_err().to_string();
        assert!(e.contains("ftp:// and gsiftp://"), "{e}");
    }

    #[test]
    fn url_forms_and_credential_order() {
        let none = CredentialSources::default();
        let t = parse("ftp://example.org/pub/a%20b.txt", &none).unwrap();
        assert_eq!(
            (t.user.as_str(), t.port, t.path.as_str()),
            ("anonymous", 21, "pub/a b.txt")
        );
        let t = parse("ftp://al%40x:p%3Aw@[::1]:2121/f", &none).unwrap();
        assert_eq!(
            (
                t.user.as_str(),
                t.password.as_str(),
                t.host.as_str(),
                t.port
            ),
            ("al@x", "p:w", "::1", 2121)
        );
        let env = CredentialSources {
            env_password: Some("envpw".into()),
            ..Default::default()
        };
        assert_eq!(parse("ftp://bob@h/f", &env).unwrap().password, "envpw");
        let netrc = CredentialSources {
            netrc: Some(
                "machine other login x password y\nmachine h login carol password c1".into(),
            ),
            ..Default::default()
        };
        let t = parse("ftp://h/f", &netrc).unwrap();
        assert_eq!((t.user.as_str(), t.password.as_str()), ("carol", "c1"));
        // A user and no password anywhere: asked on the terminal, else an error that says
        // where a password can come from (it used to log in with an empty one).
        let terminal = CredentialSources {
            ask: Some(|prompt| (prompt == "Password for bob@h: ").then(|| "typed".into())),
            ..Default::default()
        };
        assert_eq!(parse("ftp://bob@h/f", &terminal).unwrap().password, "typed");
        match parse("ftp://bob@h/f", &none) {
            Err(ClientError::Usage(m)) => assert!(m.contains("BRAID_PASSWORD"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(parse("http://h/f", &none).is_err());
        assert!(parse("ftp://h/a%0d%0aDELE%20x", &none).is_err());
    }

    #[test]
    fn percent_escapes_decode_to_utf8_and_invalid_ones_are_refused() {
        let none = CredentialSources::default();
        let t = parse("ftp://h/caf%C3%A9/%41", &none).expect("utf-8");
        assert_eq!(t.path, "café/A");
        // A lone % is kept as it is; bytes that are no UTF-8 are refused with the URL named.
        assert_eq!(parse("ftp://h/100%", &none).expect("kept").path, "100%");
        match parse("ftp://h/%FF%FE", &none) {
            Err(ClientError::Usage(m)) => assert!(m.contains("UTF-8"), "{m}"),
            other => panic!("{other:?}"),
        }
        // An empty path names the login directory.
        assert_eq!(parse("ftp://h", &none).expect("host only").path, "");
    }

    #[test]
    fn netrc_entries_are_found_by_host_else_default_and_macros_end_them() {
        let text = "machine a login ua password pa\n\
                    machine b login ub macdef init\n password never\n\n\
                    default login anon password me@";
        assert_eq!(netrc_lookup(text, "a"), Some(("ua".into(), "pa".into())));
        assert_eq!(
            netrc_lookup(text, "zzz"),
            Some(("anon".into(), "me@".into()))
        );
        // An entry without a password before its macro gives nothing.
        assert_eq!(netrc_lookup(text, "b"), None);
        assert_eq!(netrc_lookup("", "a"), None);
        // A user in the URL that is not the entry's keeps asking elsewhere.
        let creds = CredentialSources {
            netrc: Some("machine h login carol password c1".into()),
            ..Default::default()
        };
        assert!(parse("ftp://dave@h/f", &creds).is_err());
    }
}
