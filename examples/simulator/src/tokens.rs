//! Pseudo-tokenization: the simulator counts four bytes of text as one token
//! and produces output text from a fixed vocabulary.

/// Bytes of text that make one pseudo-token.
pub const BYTES_PER_TOKEN: usize = 4;

/// The vocabulary output tokens are drawn from (four bytes each).
const VOCABULARY: [&str; 8] = [
    " the", " sim", " say", " hey", " all", " you", " ask", " for",
];

/// Number of pseudo-tokens in `text`: `ceil(bytes / 4)`.
pub fn count(text: &str) -> u64 {
    text.len().div_ceil(BYTES_PER_TOKEN) as u64
}

/// Text of output token `index` of sequence `sequence`.
pub fn output_token(sequence: u64, index: u64) -> &'static str {
    let slot = sequence.wrapping_add(index) % VOCABULARY.len() as u64;
    VOCABULARY[slot as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_four_bytes_per_token_rounding_up() {
        assert_eq!(count(""), 0);
        assert_eq!(count("abcd"), 1);
        assert_eq!(count("abcde"), 2);
        assert_eq!(count(&"x".repeat(64)), 16);
    }

    #[test]
    fn output_tokens_are_one_token_each() {
        for i in 0..16 {
            assert_eq!(count(output_token(3, i)), 1);
        }
        assert_ne!(output_token(0, 0), output_token(0, 1));
    }
}
