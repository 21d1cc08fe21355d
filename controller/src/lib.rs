//! wasm-epp controller: discovers model-server endpoints, scrapes their Prometheus metrics,
//! compiles the upstream `EndpointPickerConfig` into a scheduling profile, and serves versioned
//! snapshots that the wasm-epp filter inside Envoy long-polls.
//!
//! Data flow: [`discovery`] → [`store`] ← [`scrape`] (via [`prometheus`] and [`extract`]);
//! [`serve`] hands the store's snapshots to Envoy (and relays prefix records between Envoy
//! replicas through [`records`], and between controllers through [`peers`]) and [`admin`] exposes health and metrics.
//! [`cli`] and [`config`] turn flags and files into the settings `main` wires together;
//! [`manifests`] loads and watches InferenceObjective / InferenceModelRewrite objects.

pub mod log;

pub mod admin;
pub mod cli;
pub mod config;
pub mod discovery;
pub mod duration;
pub mod eds;
pub mod engines;
pub mod extract;
pub mod http;
pub mod manifests;
pub mod moving_mean;
pub mod peers;
pub mod prometheus;
pub mod records;
pub mod scrape;
pub mod serve;
pub mod store;
