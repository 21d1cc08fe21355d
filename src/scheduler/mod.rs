//! The scheduler: filters → weighted scorers → picker over the snapshot's endpoints.
//! Plain Rust with no proxy-wasm types, tested natively and under wasm-bindgen-test.

pub mod profile;
