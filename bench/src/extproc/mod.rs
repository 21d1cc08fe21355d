//! `wasm-epp-extproc`: the upstream design as a baseline, an Envoy ext_proc gRPC server making
//! the same pick as the wasm-epp filter ([`wasm_epp::director::Director::decide`], the snapshot's
//! profile, an in-memory prefix index, in-flight counts) one network hop away from Envoy.
//!
//! It follows the controller's snapshot like the filter's poller ([`poll`]), and speaks
//! upstream's request path ([`exchange`]): request headers SEND, request body
//! FULL_DUPLEX_STREAMED (the only body mode upstream supports: the whole prompt is streamed to
//! the server and back), the answer a header mutation setting `x-gateway-destination-endpoint`
//! with `clear_route_cache` and the `envoy.lb` metadata; BUFFERED works too. The response
//! path is not needed for the pick, so the benchmark configures it SKIP.

pub mod exchange;
pub mod picking;
pub mod poll;
pub mod replies;
pub mod service;
pub mod timing;
