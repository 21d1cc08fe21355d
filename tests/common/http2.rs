//! A minimal HTTP/2 client (prior knowledge, as Envoy's `codec_type: AUTO` accepts) for the
//! protocol tests: a request with an optional body sent in chunks and optional trailers.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use super::Reply;

/// One HTTP/2 request.
#[derive(Debug, Clone, Default)]
pub struct H2Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    /// Sent as DATA frames of at most `chunk` bytes (0: one frame).
    pub body: Option<&'a [u8]>,
    pub chunk: usize,
    /// Trailers ending the request (after the body, or right after the headers).
    pub trailers: &'a [(&'a str, &'a str)],
}

/// Sends `request` to `127.0.0.1:port` over a new HTTP/2 connection. Status 0 with the error
/// as the body when the connection or stream fails (such as a reset).
pub fn send(port: u16, request: &H2Request<'_>) -> Reply {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        match tokio::time::timeout(Duration::from_secs(30), exchange(port, request)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => failed(e),
            Err(_) => failed("timed out".into()),
        }
    })
}

fn failed(e: Box<dyn std::error::Error>) -> Reply {
    Reply {
        status: 0,
        headers: HashMap::new(),
        body: e.to_string(),
    }
}

async fn exchange(port: u16, request: &H2Request<'_>) -> Result<Reply, Box<dyn std::error::Error>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(16 << 20)
        .handshake::<_, Bytes>(tcp)
        .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await?;
    let mut builder = http::Request::builder()
        .method(request.method)
        .uri(format!("http://127.0.0.1:{port}{}", request.path));
    if request.body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    for (name, value) in request.headers {
        builder = builder.header(*name, *value);
    }
    let trailers = (!request.trailers.is_empty()).then(|| {
        let mut map = http::HeaderMap::new();
        for (name, value) in request.trailers {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("trailer name"),
                http::HeaderValue::from_str(value).expect("trailer value"),
            );
        }
        map
    });
    let end_with_headers = request.body.is_none() && trailers.is_none();
    let (response, mut stream) = client.send_request(builder.body(())?, end_with_headers)?;
    if let Some(body) = request.body {
        let chunk = if request.chunk == 0 {
            body.len().max(1)
        } else {
            request.chunk
        };
        let pieces: Vec<&[u8]> = body.chunks(chunk).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len() && trailers.is_none();
            stream.reserve_capacity(piece.len());
            stream.send_data(Bytes::copy_from_slice(piece), last)?;
        }
        if pieces.is_empty() && trailers.is_none() {
            stream.send_data(Bytes::new(), true)?;
        }
    }
    if let Some(trailers) = trailers {
        stream.send_trailers(trailers)?;
    }
    let response = response.await?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}
