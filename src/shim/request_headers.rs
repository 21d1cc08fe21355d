//! The request headers, read with one host call into one buffer and looked up in place
//! ([`crate::header_map`]). The call (`proxy_get_header_map_pairs`) costs Envoy one walk of the
//! header map, one call back into the VM for the buffer (the SDK's `proxy_on_memory_allocate`)
//! and one copy of every header; the lookups after it make no host call and no allocation
//! except for a header actually present among the few the filter reads.

use crate::header_map::HeaderMap;

#[link(wasm_import_module = "env")]
extern "C" {
    /// Proxy-Wasm ABI 0.2: serializes a header map into a buffer the host allocates in the
    /// guest (through `proxy_on_memory_allocate`); `map_type` 0 is the request headers.
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
}

/// `MapType::HttpRequestHeaders` in the ABI.
const HTTP_REQUEST_HEADERS: u32 = 0;
/// `Status::Ok` in the ABI.
const STATUS_OK: u32 = 0;

/// The serialized request headers (owned; empty if the host has none to give).
pub struct RequestHeaders {
    data: Vec<u8>,
}

impl RequestHeaders {
    /// Reads the request headers: one host call. Any host failure reads as no headers (the
    /// SDK's `get_map` would panic on an unexpected status).
    pub fn read() -> RequestHeaders {
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host writes a pointer and a size it allocated in this module's memory
        // through `proxy_on_memory_allocate`, which allocates a boxed `[u8]` of exactly `size`
        // bytes; the Vec takes ownership with that capacity and frees it when dropped.
        let data = unsafe {
            let status = proxy_get_header_map_pairs(HTTP_REQUEST_HEADERS, &mut data, &mut size);
            if status != STATUS_OK || data.is_null() {
                Vec::new()
            } else {
                Vec::from_raw_parts(data, size, size)
            }
        };
        RequestHeaders { data }
    }

    /// The headers, for lookups.
    pub fn map(&self) -> HeaderMap<'_> {
        HeaderMap::new(&self.data)
    }
}
