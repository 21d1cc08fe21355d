//! Watch errors: never fatal, logged once, retried after a delay.
//!
//! The kube watcher resumes by itself after an error (it re-watches, or relists after a
//! `410 Gone`); this wrapper only decides how long to wait before letting it, and what to log.
//! A resource that does not exist (`404`, usually a CRD that is not installed) is retried every
//! [`NOT_FOUND_RETRY`]; other errors back off from [`FIRST_RETRY`] to [`MAX_RETRY`]. An expired
//! watch (`410`) is routine and relists at once, silently. (kube's own `default_backoff` backs
//! off every error alike, so it cannot tell these apart.)

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use tracing::{info, warn};

/// Delay between attempts to list a resource the API server does not know.
pub const NOT_FOUND_RETRY: Duration = Duration::from_secs(30);

/// Delay after the first failure of any other kind; doubled after each further one.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);

/// Longest delay between attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(30);

/// The events of `stream`, a watch of `what` (e.g. `pods in llm`), with its errors logged and
/// the next attempt delayed as the module docs say. Each distinct error is logged once, and the
/// first event after errors logs a recovery line.
pub fn resilient<K, S>(what: String, stream: S) -> impl Stream<Item = Event<K>> + Send
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    let failures = Failures {
        what,
        consecutive: 0,
        logged: None,
    };
    futures::stream::unfold(
        (stream.boxed(), failures),
        |(mut stream, mut failures)| async move {
            loop {
                match stream.next().await? {
                    Ok(event) => {
                        failures.succeeded();
                        return Some((event, (stream, failures)));
                    }
                    Err(error) => {
                        let delay = failures.failed(&error);
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        },
    )
}

/// What went wrong with one watch, and what is to be done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// One line for the log; `None` for routine errors that are not logged.
    pub message: Option<String>,
    /// How long to wait before the next attempt.
    pub delay: Duration,
}

/// Classifies `error`, the `attempt`-th failure in a row (counting from 1).
pub fn classify(error: &watcher::Error, attempt: u32) -> Retry {
    let backoff = FIRST_RETRY
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
        .min(MAX_RETRY);
    let status = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => Some(status.as_ref()),
            _ => None,
        },
        watcher::Error::WatchError(status) => Some(status.as_ref()),
        watcher::Error::NoResourceVersion => None,
    };
    match status {
        Some(status) if status.code == 410 => Retry {
            message: None,
            delay: Duration::ZERO,
        },
        Some(status) if status.code == 404 => Retry {
            message: Some(format!(
                "not found (is its CRD installed?); retrying every {}s",
                NOT_FOUND_RETRY.as_secs()
            )),
            delay: NOT_FOUND_RETRY,
        },
        Some(status) => {
            let mut message = format!("{} {}", status.code, status.reason);
            if !status.message.is_empty() {
                message.push_str(": ");
                message.push_str(&status.message);
            }
            if status.code == 401 || status.code == 403 {
                message.push_str(" (check the controller's credentials and RBAC rules)");
            }
            Retry {
                message: Some(format!("{}; retrying", message.replace('\n', " "))),
                delay: backoff,
            }
        }
        None => Retry {
            message: Some(format!(
                "{}; retrying",
                error.to_string().replace('\n', " ")
            )),
            delay: backoff,
        },
    }
}

struct Failures {
    what: String,
    consecutive: u32,
    /// The last message logged, so a repeated error is logged once.
    logged: Option<String>,
}

impl Failures {
    fn failed(&mut self, error: &watcher::Error) -> Duration {
        self.consecutive = self.consecutive.saturating_add(1);
        let retry = classify(error, self.consecutive);
        if let Some(message) = retry.message {
            if self.logged.as_ref() != Some(&message) {
                warn!(watch = %self.what, "kubernetes: {}: {message}", self.what);
                self.logged = Some(message);
            }
        }
        retry.delay
    }

    fn succeeded(&mut self) {
        self.consecutive = 0;
        if self.logged.take().is_some() {
            info!(watch = %self.what, "kubernetes: {}: watching again", self.what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str) -> watcher::Error {
        let status = Status::failure("the server says no", reason).with_code(code);
        watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn a_missing_resource_is_retried_slowly() {
        let retry = classify(&api_error(404, "NotFound"), 1);
        assert_eq!(retry.delay, NOT_FOUND_RETRY);
        assert!(retry.message.unwrap().starts_with("not found"));
        // However often it fails, the delay and the message stay the same (so it logs once).
        assert_eq!(
            classify(&api_error(404, "NotFound"), 9).delay,
            NOT_FOUND_RETRY
        );
    }

    #[test]
    fn other_errors_back_off_up_to_the_maximum() {
        let delays: Vec<_> = (1..=9)
            .map(|attempt| classify(&api_error(500, "InternalError"), attempt).delay)
            .collect();
        assert_eq!(delays[0], FIRST_RETRY);
        assert_eq!(delays[1], FIRST_RETRY * 2);
        assert_eq!(delays[8], MAX_RETRY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        let message = classify(&api_error(403, "Forbidden"), 1).message.unwrap();
        assert!(
            message.starts_with("403 Forbidden: the server says no") && message.contains("RBAC"),
            "{message}"
        );
    }

    #[test]
    fn an_expired_watch_relists_at_once_and_silently() {
        let status = Status::failure("too old resource version", "Expired").with_code(410);
        let retry = classify(&watcher::Error::WatchError(status.boxed()), 1);
        assert_eq!(
            retry,
            Retry {
                message: None,
                delay: Duration::ZERO
            }
        );
    }

    #[tokio::test]
    async fn errors_are_skipped_and_events_pass_through() {
        // Expired watches retry at once, so this takes no time.
        let gone = || {
            let status = Status::failure("expired", "Expired").with_code(410);
            Err(watcher::Error::WatchError(status.boxed()))
        };
        let items = vec![
            gone(),
            Ok(Event::Apply(1u32)),
            gone(),
            gone(),
            Ok(Event::Delete(1u32)),
        ];
        let events: Vec<_> = resilient("test".to_string(), futures::stream::iter(items))
            .collect()
            .await;
        assert!(matches!(
            events.as_slice(),
            [Event::Apply(1), Event::Delete(1)]
        ));
    }
}
