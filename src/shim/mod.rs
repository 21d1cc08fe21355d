//! The Proxy-Wasm shell: creates the poller or the filter root context from the plugin
//! configuration. Everything worth testing lives in the plain library modules.

mod calls;
mod filter;
mod flow;
mod http;
mod leased_poller;
mod phase_metrics;
mod poller;
mod records_channel;
mod request_headers;
mod shared;
mod worker;

use proxy_wasm::traits::{Context, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};

use crate::plugin_config::PluginConfig;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::Unconfigured) });
}}

/// A root context; its role is known once the plugin configuration is read.
enum Root {
    Unconfigured,
    Filter(filter::FilterRoot),
    Poller(poller::Poller),
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        match self {
            Root::Poller(p) => p.on_http_call_response(token, headers, body, trailers),
            Root::Filter(f) => {
                if let Some(p) = f.poller() {
                    p.on_http_call_response(token, headers, body, trailers);
                }
            }
            Root::Unconfigured => {}
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes =
            proxy_wasm::hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
                .ok()
                .flatten()
                .unwrap_or_default();
        match PluginConfig::parse(&bytes) {
            Ok(PluginConfig::Filter(config)) => {
                *self = Root::Filter(filter::FilterRoot::new(config));
                true
            }
            Ok(PluginConfig::Poller(config)) => {
                let mut poller = poller::Poller::new(config);
                poller.start();
                *self = Root::Poller(poller);
                true
            }
            Err(message) => {
                log::error!("wasm-epp: {message}");
                false
            }
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        match self {
            Root::Filter(f) => f.on_queue_ready(queue_id),
            Root::Poller(p) => {
                p.on_queue_ready(queue_id);
            }
            Root::Unconfigured => {}
        }
    }

    fn on_tick(&mut self) {
        match self {
            Root::Poller(p) => p.on_tick(),
            Root::Filter(f) => f.on_tick(),
            Root::Unconfigured => {}
        }
    }

    fn create_http_context(
        &self,
        context_id: u32,
    ) -> Option<Box<dyn proxy_wasm::traits::HttpContext>> {
        match self {
            Root::Filter(f) => Some(Box::new(f.new_http(context_id))),
            _ => None,
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        match self {
            Root::Filter(_) | Root::Unconfigured => Some(ContextType::HttpContext),
            Root::Poller(_) => None,
        }
    }
}
