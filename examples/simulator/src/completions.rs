//! `POST /v1/completions` and `POST /v1/chat/completions`: validation, engine
//! submission and the JSON or event-stream answer.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

use crate::app::App;
use crate::engine::Job;
use crate::errors::ApiError;
use crate::generation::Generation;
use crate::openai::{Generate, Reply};
use crate::prefix_cache::block_hashes;
use crate::respond::{self, Body};
use crate::{sse, tokens};

/// Output tokens are capped at this many.
pub const MAX_OUTPUT_TOKENS: u64 = 4096;

/// Runs `request` on the engine and answers it.
pub async fn serve(app: &Arc<App>, request: Generate) -> Result<Response<Body>, ApiError> {
    let adapter = app.resolve_model(&request.model)?;
    // As vLLM: an explicit limit ends with "length", running to the natural
    // end (here the default length) with "stop".
    let (output_tokens, finish_reason) = match request.max_tokens {
        Some(0) => {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1, got 0.",
            ))
        }
        Some(limit) => (limit.min(MAX_OUTPUT_TOKENS), "length"),
        None => (app.default_max_tokens, "stop"),
    };
    let prompt_tokens = tokens::count(&request.prompt);
    let job = Job {
        adapter,
        prompt_tokens,
        block_hashes: block_hashes(
            &request.model,
            request.prompt.as_bytes(),
            app.engine.config().block_size,
        ),
    };
    let generation = Generation::new(app.engine.submit(job), prompt_tokens, output_tokens);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let reply = Reply::new(
        request.endpoint,
        &app.instance_name,
        generation.id(),
        created,
        request.model,
    );
    let answer = Answer {
        generation,
        reply,
        finish_reason,
    };
    Ok(if request.stream {
        answer.stream(request.include_usage)
    } else {
        answer.complete().await
    })
}

struct Answer {
    generation: Generation,
    reply: Reply,
    finish_reason: &'static str,
}

impl Answer {
    /// Waits for every token and answers with one JSON object.
    async fn complete(mut self) -> Response<Body> {
        let mut text = String::new();
        while let Some(token) = self.generation.next_token().await {
            text.push_str(token);
        }
        let body = self
            .reply
            .complete(&text, self.finish_reason, &self.generation.usage());
        respond::json(StatusCode::OK, &body)
    }

    /// Answers at once with an event stream that a task feeds one chunk per
    /// token. The task, and with it the request, stops when the client goes.
    fn stream(self, include_usage: bool) -> Response<Body> {
        let (sender, body) = sse::channel();
        tokio::spawn(async move {
            let closed = sender.clone();
            tokio::select! {
                () = self.send_events(include_usage, &sender) => {}
                () = closed.closed() => {}
            }
        });
        respond::with_body(StatusCode::OK, "text/event-stream", body)
    }

    async fn send_events(mut self, include_usage: bool, sender: &mpsc::Sender<Bytes>) {
        while let Some(token) = self.generation.next_token().await {
            let finish_reason = self.generation.is_done().then_some(self.finish_reason);
            let first = self.generation.produced() == 1;
            let chunk = self.reply.token_chunk(token, first, finish_reason);
            if sender.send(sse::event(&chunk)).await.is_err() {
                return;
            }
        }
        let usage =
            include_usage.then(|| sse::event(&self.reply.usage_chunk(&self.generation.usage())));
        for event in usage.into_iter().chain([sse::done()]) {
            if sender.send(event).await.is_err() {
                return;
            }
        }
    }
}
