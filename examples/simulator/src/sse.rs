//! Server-sent events: the `data: …` framing and a channel-fed body.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::respond::Body;

/// Events buffered between the generating task and the connection.
const BUFFERED_EVENTS: usize = 16;

/// One event carrying `value` as JSON: `data: {json}\n\n`.
pub fn event(value: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

/// The event that ends an OpenAI stream.
pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// A response body fed, event by event, through the returned sender. The body
/// ends when the sender is dropped; sending fails once the client is gone.
pub fn channel() -> (mpsc::Sender<Bytes>, Body) {
    let (sender, receiver) = mpsc::channel(BUFFERED_EVENTS);
    (sender, EventStream { receiver }.boxed())
}

struct EventStream {
    receiver: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver
            .poll_recv(cx)
            .map(|event| event.map(|bytes| Ok(Frame::data(bytes))))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_are_data_lines_with_a_blank_line_after() {
        assert_eq!(event(&json!({"a": 1})), "data: {\"a\":1}\n\n");
        assert_eq!(done(), "data: [DONE]\n\n");
    }

    #[tokio::test]
    async fn the_body_yields_what_was_sent_and_ends_with_the_sender() {
        let (sender, body) = channel();
        sender.send(event(&json!(1))).await.unwrap();
        sender.send(done()).await.unwrap();
        drop(sender);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "data: 1\n\ndata: [DONE]\n\n");
    }
}
