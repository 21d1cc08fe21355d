//! A header map in the Proxy-Wasm host's serialized form, read in place: the filter reads the
//! request headers with one host call and looks up the few it needs without building a
//! `String` per header (the SDK's `get_map` makes two per header, about 20 allocations for a
//! plain request, and panics on an unexpected host status).
//!
//! The form (Proxy-Wasm ABI 0.2): a little-endian `u32` pair count, then a `u32` name size and
//! a `u32` value size per pair, then each name and each value followed by a NUL byte. A
//! malformed map reads as its well-formed pairs up to the first bad one, never a panic.

/// A serialized header map, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct HeaderMap<'a> {
    data: &'a [u8],
}

impl<'a> HeaderMap<'a> {
    /// The map serialized in `data` (empty data: no headers).
    pub fn new(data: &'a [u8]) -> HeaderMap<'a> {
        HeaderMap { data }
    }

    /// The pairs in order, as (name, value) bytes.
    pub fn pairs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let data = self.data;
        let count = read_u32(data, 0).unwrap_or(0);
        let mut size_at = 4usize;
        let mut at = count.saturating_mul(8).saturating_add(4);
        (0..count).map_while(move |_| {
            let name_len = read_u32(data, size_at)?;
            let value_len = read_u32(data, size_at + 4)?;
            size_at += 8;
            // Each end is within `data`, so stepping over its NUL cannot overflow.
            let name_end = at.checked_add(name_len)?;
            let name = data.get(at..name_end)?;
            let value_end = (name_end + 1).checked_add(value_len)?;
            let value = data.get(name_end + 1..value_end)?;
            at = value_end + 1;
            Some((name, value))
        })
    }

    /// The first value of header `name` (ASCII case-insensitive).
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.pairs()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The first value of header `name` as text (invalid UTF-8 replaced), copied.
    pub fn get_string(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Whether header `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// The little-endian `u32` at `at`, as a size.
fn read_u32(data: &[u8], at: usize) -> Option<usize> {
    let bytes: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(bytes)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serializes `pairs` as the host does.
    fn serialize(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn reads_every_pair_in_order() {
        let data = serialize(&[(":path", "/v1/completions"), ("x-a", ""), ("x-b", "2")]);
        let map = HeaderMap::new(&data);
        let pairs: Vec<_> = map.pairs().collect();
        assert_eq!(
            pairs,
            vec![
                (&b":path"[..], &b"/v1/completions"[..]),
                (&b"x-a"[..], &b""[..]),
                (&b"x-b"[..], &b"2"[..]),
            ]
        );
    }

    #[test]
    fn looks_up_names_case_insensitively_first_value_wins() {
        let data = serialize(&[("X-Gateway-Thing", "one"), ("x-gateway-thing", "two")]);
        let map = HeaderMap::new(&data);
        assert_eq!(map.get_string("x-gateway-thing").as_deref(), Some("one"));
        assert!(map.contains("X-GATEWAY-THING"));
        assert!(!map.contains("x-gateway"));
        assert_eq!(map.get("missing"), None);
    }

    #[test]
    fn invalid_utf8_values_are_replaced_not_dropped() {
        let mut data = serialize(&[("x-v", "ab")]);
        let at = data.len() - 3; // 'a'
        data[at] = 0xff;
        assert_eq!(
            HeaderMap::new(&data).get_string("x-v").as_deref(),
            Some("\u{fffd}b")
        );
    }

    #[test]
    fn malformed_maps_yield_their_good_pairs_and_never_panic() {
        assert_eq!(HeaderMap::new(&[]).pairs().count(), 0);
        assert_eq!(HeaderMap::new(&[1, 0]).pairs().count(), 0);
        let good = serialize(&[("a", "1"), ("b", "2")]);
        // Every truncation of a good map reads as a prefix of its pairs, whole pairs only.
        let all: Vec<_> = HeaderMap::new(&good).pairs().collect();
        assert_eq!(all.len(), 2);
        for cut in 0..good.len() {
            let read: Vec<_> = HeaderMap::new(&good[..cut]).pairs().collect();
            assert_eq!(read, all[..read.len()], "cut {cut}");
        }
        assert!(HeaderMap::new(&good[..good.len() - 2]).pairs().count() < 2);
        // A count far beyond the data, and sizes that overflow.
        let mut huge = good.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(HeaderMap::new(&huge).pairs().count() <= 2);
        let mut overflow = good;
        overflow[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(HeaderMap::new(&overflow).pairs().count(), 0);
    }
}
