//! `braid serve`: the server's process: logging, listeners, reload on SIGHUP, and a graceful
//! stop on SIGTERM or Ctrl-C.

use super::logging::init_logging;
use crate::server::settings::ServeArgs;
use crate::server::{self, Config, Shutdown};
use anyhow::Context;
use std::sync::Arc;

pub fn run(cli: ServeArgs) -> anyhow::Result<()> {
    let args = cli.resolve()?;
    if args.stdio {
        return one_session(&args);
    }
    let level = if args.verbose {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    init_logging(level, false, args.log_format.unwrap_or_default());
    let config = args.config(None)?;
    let root = config.root.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listen = args.listen();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} (is another server using it? pick another with --listen)"))?;
        let addr = listener.local_addr()?;
        let metrics = match args.metrics {
            Some(at) => Some(tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot serve metrics on {at} (is the port taken? pick another with --metrics)"))?),
            None => None,
        };
        let who = args.who(&config);
        let tls = if config.tls.is_some() { "; AUTH TLS offered" } else { "" };
        // Written, not printed: a closed stdout must not stop the server.
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "braid serve: serving {} ({who}{tls}) at {}", root.display(), server::url_for(addr));
        if let Some(listener) = metrics {
            let _ = writeln!(out, "braid serve: metrics at http://{}/metrics", listener.local_addr()?);
            tokio::spawn(server::metrics::serve(listener, config.metrics.clone()));
        }
        let _ = out.flush();
        let (configs_tx, configs) = tokio::sync::watch::channel(Arc::new(config));
        tokio::spawn(reload_on_hangup(cli, args.clone(), configs_tx));
        let (stop, stop_rx) = tokio::sync::watch::channel(Shutdown::Running);
        let grace = args.shutdown_grace();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received: no new sessions; running transfers get {}s to finish (signal again to cut them)", grace.as_secs());
            let _ = stop.send(Shutdown::Graceful);
            tokio::select! {
                _ = wait_for_signal() => {}
                _ = tokio::time::sleep(grace) => {}
            }
            let _ = stop.send(Shutdown::Abort);
        });
        server::run(listener, configs, stop_rx).await?;
        tracing::info!("server stopped");
        anyhow::Ok(())
    })
}

/// `--stdio`: one session on standard input and output, then exit. Only warnings go to
/// stderr (ssh hands them to the person at the other end) unless -v.
fn one_session(args: &ServeArgs) -> anyhow::Result<()> {
    let level = if args.verbose {
        tracing::Level::DEBUG
    } else {
        tracing::Level::WARN
    };
    init_logging(level, false, args.log_format.unwrap_or_default());
    let config = args.config(None)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = rt.block_on(server::serve_stdio(config));
    // The thread reading standard input may still wait in a read nobody can cancel.
    rt.shutdown_background();
    served
}

/// On SIGHUP: reads the config file and the users file again and gives new sessions the
/// result (running sessions keep theirs). A file with a mistake changes nothing: the error
/// is logged and the server goes on as it was.
async fn reload_on_hangup(
    cli: ServeArgs,
    mut running: ServeArgs,
    configs: tokio::sync::watch::Sender<Arc<Config>>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot catch SIGHUP: reloading is off");
        return;
    };
    while hangup.recv().await.is_some() {
        let old = configs.borrow().clone();
        let cli = cli.clone();
        let built = tokio::task::spawn_blocking(move || {
            let args = cli.resolve()?;
            let config = args.config(Some(&old))?;
            anyhow::Ok((args, config))
        })
        .await;
        match built {
            Ok(Ok((args, config))) => {
                if let Some(fixed) = running.fixed_changes(&args) {
                    tracing::warn!("reload: {fixed} change only with a restart; kept as they were");
                }
                tracing::info!(
                    accounts = config.users.len(),
                    anonymous = args.who(&config),
                    "configuration reloaded"
                );
                configs.send_replace(Arc::new(config));
                running = args;
            }
            Ok(Err(e)) => tracing::error!("reload failed, nothing changed: {e:#}"),
            Err(e) => tracing::error!("reload failed, nothing changed: {e}"),
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
