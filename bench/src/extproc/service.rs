//! The gRPC side: `envoy.service.ext_proc.v3.ExternalProcessor/Process`, one task per stream
//! feeding Envoy's messages to an [`Exchange`] and sending its answers back.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::exchange::{Exchange, MAX_BODY_BYTES};
use super::picking::PickState;

/// Answers queued per stream before the stream task waits for Envoy to read them.
const QUEUED_ANSWERS: usize = 32;
/// Largest gRPC message accepted or sent (a whole buffered body plus headers).
const MAX_MESSAGE_BYTES: usize = MAX_BODY_BYTES + (1 << 20);

/// The ext_proc service over shared picker state.
#[derive(Debug, Clone)]
pub struct PickerService {
    state: Arc<PickState>,
}

impl PickerService {
    /// A service deciding with `state`.
    pub fn new(state: Arc<PickState>) -> PickerService {
        PickerService { state }
    }

    /// The tonic server wrapper with message limits large enough for whole prompts.
    pub fn into_server(self) -> ExternalProcessorServer<PickerService> {
        ExternalProcessorServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl ExternalProcessor for PickerService {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        let (answers, stream) = mpsc::channel(QUEUED_ANSWERS);
        let mut exchange = Exchange::new(self.state.clone());
        tokio::spawn(async move {
            // Ends when Envoy closes the stream, on a stream error, or when Envoy stops
            // reading; dropping the exchange then releases its in-flight count.
            while let Ok(Some(message)) = inbound.message().await {
                for answer in exchange.handle(message) {
                    if answers.send(Ok(answer)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}
