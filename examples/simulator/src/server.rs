//! The accept loop: HTTP/1.1 keep-alive connections until SIGINT or SIGTERM.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::api;
use crate::app::App;

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `listener` until the process is asked to stop.
pub async fn serve(app: Arc<App>, listener: TcpListener) -> io::Result<()> {
    let shutdown = shutdown_signal()?;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return Ok(()),
        };
        match accepted {
            Ok((stream, _)) => {
                // Token events are small writes; send each at once.
                let _ = stream.set_nodelay(true);
                let app = Arc::clone(&app);
                tokio::spawn(async move {
                    let service = service_fn(move |request| api::handle(Arc::clone(&app), request));
                    // A connection error only concerns that client.
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Err(error) => {
                eprintln!("vllm-sim: accept failed: {error}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Completes on SIGINT or SIGTERM.
fn shutdown_signal() -> io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
