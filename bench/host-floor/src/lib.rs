//! The proxy-wasm host floor: a filter that makes no decision. It pauses the request headers,
//! lets Envoy buffer the body to its end (as wasm-epp must, to read the prompt) and then sets
//! `x-gateway-destination-endpoint` to the next address of a fixed list, round-robin. It never
//! copies the body into Wasm, reads no header and touches no shared data, so what it costs
//! Envoy per request is the floor every body-reading Proxy-Wasm picker pays on this Envoy:
//! context creation, the callbacks into V8, body buffering and one header write.
//!
//! Plugin configuration: the addresses as `ip:port` separated by commas. Loaded with any other
//! configuration (the shipped `envoy/envoy.yaml` also loads the module as its bootstrap poller)
//! it does nothing.
#![cfg(target_arch = "wasm32")]

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

/// The header the ORIGINAL_DST cluster routes on.
const DESTINATION: &str = "x-gateway-destination-endpoint";

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { endpoints: Rc::from([]), next: Cell::new(0) })
    });
}}

/// The address list and the round-robin position.
struct Root {
    endpoints: Rc<[String]>,
    next: Cell<usize>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        if !text.trim_start().starts_with('{') {
            self.endpoints = text.split(',').map(|a| a.trim().to_string()).collect();
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let index = self.next.get();
        self.next.set(index.wrapping_add(1));
        Some(Box::new(Request {
            endpoints: Rc::clone(&self.endpoints),
            index,
            done: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request: which address it gets, and whether it has been set.
struct Request {
    endpoints: Rc<[String]>,
    index: usize,
    done: bool,
}

impl Request {
    /// Sets the destination once (one host call) and lets the request go on.
    fn route(&mut self) -> Action {
        if !self.done && !self.endpoints.is_empty() {
            let address = &self.endpoints[self.index % self.endpoints.len()];
            self.set_http_request_header(DESTINATION, Some(address));
        }
        self.done = true;
        Action::Continue
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            self.route()
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, _size: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            self.route()
        } else {
            Action::Pause
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        self.route()
    }
}
