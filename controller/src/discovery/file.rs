//! File discovery (upstream `file-discovery`): a YAML or JSON file listing the endpoints,
//! optionally re-read while the controller runs.
//!
//! ```yaml
//! endpoints:
//! - name: vllm-0
//!   namespace: llm        # optional; the snapshot name becomes "llm/vllm-0"
//!   address: 10.0.0.5     # IPv4 or IPv6
//!   port: 8000            # or "8000"
//!   labels: {llm-d.ai/role: decode}
//! ```

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;
use tracing::{info, warn};
use wasm_epp::snapshot::{Endpoint, Metrics};

use crate::store::Store;

/// Largest endpoints file accepted, as upstream.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// How often a watched file is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// A file-discovery source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSource {
    /// The endpoints file.
    pub path: PathBuf,
    /// Re-read the file while running and apply changes.
    pub watch: bool,
}

/// Why a file cannot be read (by [`read_limited`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReadError {
    /// The file cannot be opened: the I/O error's text.
    #[error("cannot open: {0}")]
    Open(String),
    /// The file cannot be read: the I/O error's text.
    #[error("cannot read: {0}")]
    Read(String),
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("file is larger than {} bytes", MAX_FILE_BYTES)]
    TooLarge,
}

/// Why an endpoints file is not accepted; one line. Most errors are
/// [`EndpointsFileError::Field`], which names the field, e.g. `endpoints[2].port: …`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointsFileError {
    /// The file cannot be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The file is not UTF-8 text.
    #[error("not UTF-8: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// The file is empty or blank.
    #[error("file is empty (write `endpoints: []` for an empty pool)")]
    Empty,
    /// Not YAML or JSON, or not shaped like an endpoints file (unknown or missing field, wrong
    /// type): serde_yaml's message, which names the field and its position.
    #[error("{0}")]
    Syntax(String),
    /// A field whose value is not accepted.
    #[error("{field}: {message}")]
    Field {
        /// The field's path, e.g. `endpoints[2].port`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl EndpointsFileError {
    /// The value of `field` is not accepted, for `message`.
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> EndpointsFileError {
        EndpointsFileError::Field {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointsFile {
    #[serde(default)]
    endpoints: Vec<FileEndpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEndpoint {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    address: String,
    port: Port,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A port written as a number or as a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Port {
    Number(i64),
    Text(String),
}

impl FileSource {
    /// Reads and validates the file.
    pub fn load(&self) -> Result<Vec<Endpoint>, EndpointsFileError> {
        parse_endpoints(&read_limited(&self.path)?)
    }

    /// Re-reads the file every [`POLL_INTERVAL`] and applies each new, valid content to the
    /// store; an invalid or unreadable file is logged once and the last good list kept.
    /// Returns at once when the source does not watch.
    pub async fn watch(self, store: Arc<Store>) {
        if !self.watch {
            return;
        }
        let path = self.path.clone();
        poll_for_changes(
            None,
            move || read_limited(&path),
            |read: &Result<Vec<u8>, ReadError>| match read {
                Ok(bytes) => match parse_endpoints(bytes) {
                    Ok(endpoints) => {
                        let count = endpoints.len();
                        if store.set_endpoints(endpoints) {
                            info!("{}: applied {count} endpoints", self.path.display());
                        }
                    }
                    Err(e) => warn!(
                        "{}: {e}; keeping the previous endpoint list",
                        self.path.display()
                    ),
                },
                Err(e) => warn!(
                    "{}: {e}; keeping the previous endpoint list",
                    self.path.display()
                ),
            },
        )
        .await
    }
}

/// Runs `read` on a blocking thread every [`POLL_INTERVAL`] (the first time at once) and calls
/// `apply` with each result that differs from the previous one. `initial` is the result the
/// first read is compared with (`None`: the first read is always applied). Never returns; the
/// watching task is dropped to stop it. Shared by file discovery and the manifests watcher.
pub async fn poll_for_changes<T, R, A>(initial: Option<T>, read: R, mut apply: A)
where
    T: PartialEq + Send + 'static,
    R: Fn() -> T + Clone + Send + 'static,
    A: FnMut(&T),
{
    let mut last = initial;
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let read = read.clone();
        // A read that panicked is tried again at the next tick.
        let Ok(current) = tokio::task::spawn_blocking(read).await else {
            continue;
        };
        if last.as_ref() == Some(&current) {
            continue;
        }
        apply(&current);
        last = Some(current);
    }
}

/// Reads `path`, refusing files over [`MAX_FILE_BYTES`].
pub fn read_limited(path: &Path) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| ReadError::Open(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Read(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok(bytes)
}

/// Parses and validates an endpoints file (YAML or JSON). Errors name the offending field,
/// e.g. `endpoints[2].port: ...`.
pub fn parse_endpoints(bytes: &[u8]) -> Result<Vec<Endpoint>, EndpointsFileError> {
    let text = std::str::from_utf8(bytes).map_err(EndpointsFileError::NotUtf8)?;
    if text.trim().is_empty() {
        return Err(EndpointsFileError::Empty);
    }
    let file: EndpointsFile =
        serde_yaml::from_str(text).map_err(|e| EndpointsFileError::Syntax(e.to_string()))?;
    let mut seen = HashSet::new();
    let mut endpoints = Vec::with_capacity(file.endpoints.len());
    for (i, entry) in file.endpoints.into_iter().enumerate() {
        let at = format!("endpoints[{i}]");
        if entry.name.trim().is_empty() {
            return Err(EndpointsFileError::invalid(
                format!("{at}.name"),
                "must not be empty",
            ));
        }
        let name = match entry.namespace.as_deref().filter(|ns| !ns.is_empty()) {
            Some(namespace) => format!("{namespace}/{}", entry.name),
            None => entry.name,
        };
        if !seen.insert(name.clone()) {
            return Err(EndpointsFileError::invalid(
                format!("{at}.name"),
                format!("duplicate endpoint {name:?}"),
            ));
        }
        let address: IpAddr = entry.address.parse().map_err(|_| {
            EndpointsFileError::invalid(
                format!("{at}.address"),
                format!("{:?} is not an IPv4 or IPv6 address", entry.address),
            )
        })?;
        let port = parse_port(&entry.port)
            .map_err(|message| EndpointsFileError::invalid(format!("{at}.port"), message))?;
        endpoints.push(Endpoint {
            name,
            address: address.to_string(),
            port,
            ready: true,
            key_cache: Default::default(),
            labels: entry.labels,
            metrics: Metrics::default(),
        });
    }
    Ok(endpoints)
}

/// The port number; the error is the message for the `port` field.
fn parse_port(port: &Port) -> Result<u16, String> {
    let number = match port {
        Port::Number(n) => *n,
        Port::Text(text) => text
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("{text:?} is not a port number"))?,
    };
    u16::try_from(number)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{number} is outside 1..65535"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_yaml_with_string_and_integer_ports() {
        let endpoints = parse_endpoints(
            b"endpoints:\n\
              - name: a\n  namespace: llm\n  address: 10.0.0.1\n  port: 8000\n  labels: {role: decode}\n\
              - name: b\n  address: '::1'\n  port: \"8001\"\n",
        )
        .unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[0].name, "llm/a");
        assert_eq!(endpoints[0].address, "10.0.0.1");
        assert_eq!(endpoints[0].port, 8000);
        assert_eq!(
            endpoints[0].labels.get("role").map(String::as_str),
            Some("decode")
        );
        assert_eq!(endpoints[1].name, "b");
        assert_eq!(endpoints[1].address, "::1");
        assert_eq!(endpoints[1].port, 8001);
        assert_eq!(endpoints[1].host_port(), "[::1]:8001");
    }

    #[test]
    fn parses_json() {
        let endpoints = parse_endpoints(
            br#"{"endpoints": [{"name": "a", "address": "127.0.0.1", "port": 9000}]}"#,
        )
        .unwrap();
        assert_eq!(endpoints[0].host_port(), "127.0.0.1:9000");
    }

    #[test]
    fn an_explicitly_empty_pool_is_valid_but_an_empty_file_is_not() {
        assert!(parse_endpoints(b"endpoints: []\n").unwrap().is_empty());
        assert!(parse_endpoints(b"  \n").is_err());
    }

    #[test]
    fn errors_name_the_field() {
        for (text, expected) in [
            (
                "endpoints:\n- {name: a, address: 10.0.0.300, port: 1}\n",
                "endpoints[0].address:",
            ),
            (
                "endpoints:\n- {name: a, address: host.example, port: 1}\n",
                "endpoints[0].address:",
            ),
            (
                "endpoints:\n- {name: a, address: 10.0.0.1, port: 0}\n",
                "endpoints[0].port:",
            ),
            (
                "endpoints:\n- {name: a, address: 10.0.0.1, port: 70000}\n",
                "endpoints[0].port:",
            ),
            (
                "endpoints:\n- {name: a, address: 10.0.0.1, port: http}\n",
                "endpoints[0].port:",
            ),
            (
                "endpoints:\n- {name: a, address: 10.0.0.1, port: 1}\n- {name: a, address: 10.0.0.2, port: 1}\n",
                "endpoints[1].name: duplicate endpoint \"a\"",
            ),
            (
                "endpoints:\n- {name: '', address: 10.0.0.1, port: 1}\n",
                "endpoints[0].name:",
            ),
            (
                "endpoints:\n- {name: a, address: 10.0.0.1, port: 1, weight: 3}\n",
                "endpoints[0]: unknown field `weight`",
            ),
        ] {
            let err = parse_endpoints(text.as_bytes()).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{text:?} gave {err:?}");
        }
    }

    #[test]
    fn the_same_name_in_different_namespaces_is_not_a_duplicate() {
        let endpoints = parse_endpoints(
            b"endpoints:\n- {name: a, namespace: x, address: 10.0.0.1, port: 1}\n- {name: a, namespace: y, address: 10.0.0.2, port: 1}\n",
        )
        .unwrap();
        assert_eq!(endpoints.len(), 2);
    }

    #[test]
    fn refuses_files_over_the_size_limit() {
        let dir = std::env::temp_dir().join(format!("wasm-epp-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        let mut text = String::from("endpoints: []\n");
        text.push_str(&"#".repeat(MAX_FILE_BYTES as usize));
        std::fs::write(&path, text).unwrap();
        let err = FileSource { path, watch: false }.load().unwrap_err();
        assert_eq!(err, EndpointsFileError::Read(ReadError::TooLarge));
        assert!(err.to_string().contains("larger than"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
