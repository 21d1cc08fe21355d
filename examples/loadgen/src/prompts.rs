//! The workload: deterministic pseudo-random prompts and model choice.
//!
//! Every request's prompt and model depend only on the seed and the
//! request's index, so a run is repeatable whatever order requests finish in.

const WORDS: [&str; 64] = [
    "the", "model", "server", "token", "cache", "prefix", "request", "queue", "batch", "latency",
    "river", "mountain", "engine", "signal", "garden", "window", "silver", "planet", "market",
    "history", "answer", "question", "number", "letter", "bridge", "forest", "orange", "winter",
    "summer", "harbor", "island", "castle", "ticket", "rocket", "pencil", "mirror", "dragon",
    "meadow", "circle", "copper", "violet", "thunder", "lantern", "compass", "journey", "anchor",
    "canyon", "desert", "falcon", "glacier", "horizon", "jungle", "kernel", "ledger", "marble",
    "nectar", "oracle", "pepper", "quartz", "saddle", "timber", "velvet", "walnut", "zephyr",
];

/// Domains keep the random streams of prefixes and requests apart.
const PREFIX_DOMAIN: u64 = 1;
const REQUEST_DOMAIN: u64 = 2;
const LENGTH_DOMAIN: u64 = 3;

/// Log-normal spread (sigma of the log) of ShareGPT-like prompt lengths.
const SHAREGPT_PROMPT_SIGMA: f64 = 1.0;
/// Log-normal spread of ShareGPT-like output lengths.
const SHAREGPT_OUTPUT_SIGMA: f64 = 0.8;
/// ShareGPT-like lengths are capped at this multiple of their median.
const SHAREGPT_CAP: f64 = 8.0;

/// A small SplitMix64 generator: fast, seedable, good enough for test text.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, domain: u64, index: u64) -> Self {
        let mut rng = Rng(seed
            ^ domain.wrapping_mul(0xD1B5_4A32_D192_ED03)
            ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.next_u64();
        rng
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..1` (53 random bits).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A log-normal draw with median `median` and log-sigma `sigma`, rounded and kept within
    /// `1..=median × SHAREGPT_CAP` (Box-Muller).
    fn log_normal(&mut self, median: u32, sigma: f64) -> u32 {
        let (u1, u2) = (1.0 - self.unit(), self.unit());
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let median = f64::from(median.max(1));
        (median * (sigma * normal).exp())
            .round()
            .clamp(1.0, median * SHAREGPT_CAP) as u32
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Appends space-separated words to `text` until it is `bytes` long.
    fn fill(&mut self, text: &mut String, bytes: usize) {
        while text.len() < bytes {
            if !text.is_empty() && !text.ends_with([' ', '\n']) {
                text.push(' ');
            }
            text.push_str(WORDS[self.below(WORDS.len())]);
        }
        // The words are ASCII, so any byte length is a char boundary.
        text.truncate(bytes);
    }
}

/// What one request sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPlan {
    /// The `model` field.
    pub model: String,
    /// The prompt (or the user message for chat).
    pub prompt: String,
    /// This request's `max_tokens`, when the workload varies it (else the target's).
    pub max_tokens: Option<u32>,
}

/// How long each request's own prompt text and output are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LengthDist {
    /// Every request: `--prompt-bytes` of own text and `--max-tokens`.
    #[default]
    Fixed,
    /// Heavy-tailed, as in ShareGPT conversations: log-normal with medians `--prompt-bytes`
    /// and `--max-tokens`, capped at 8× the median.
    Sharegpt,
}

/// The settings every request's plan derives from.
#[derive(Clone, Debug)]
pub struct Workload {
    seed: u64,
    prompt_bytes: usize,
    prefixes: Vec<String>,
    models: Vec<String>,
    /// `Some(median max_tokens)` for ShareGPT-like lengths.
    sharegpt_output: Option<u32>,
    /// The index of this run's first request (see [`Workload::starting_at`]).
    first_index: u32,
}

impl Workload {
    /// A workload of `prompt_bytes`-long unique prompts, each after one of
    /// `groups` shared prefixes of `prefix_bytes` (none when `groups` is 0),
    /// naming one of `models` (at least one) at random.
    pub fn new(
        seed: u64,
        prompt_bytes: usize,
        groups: usize,
        prefix_bytes: usize,
        models: Vec<String>,
    ) -> Self {
        let prefixes = (0..groups as u64)
            .map(|group| {
                let mut prefix = String::with_capacity(prefix_bytes);
                if prefix_bytes > 0 {
                    Rng::new(seed, PREFIX_DOMAIN, group).fill(&mut prefix, prefix_bytes - 1);
                    prefix.push('\n');
                }
                prefix
            })
            .collect();
        Self {
            seed,
            prompt_bytes,
            prefixes,
            models,
            sharegpt_output: None,
            first_index: 0,
        }
    }

    /// The same workload with lengths drawn from `dist`; `max_tokens` is the median output
    /// length of [`LengthDist::Sharegpt`]. Prompts and models stay those of the seed.
    pub fn with_lengths(mut self, dist: LengthDist, max_tokens: u32) -> Self {
        self.sharegpt_output = match dist {
            LengthDist::Fixed => None,
            LengthDist::Sharegpt => Some(max_tokens),
        };
        self
    }

    /// The same workload, with this run's requests numbered from `first_index`: its request
    /// `i` is request `first_index + i` of the seed. Runs that continue one another with the
    /// same seed then share the prefix groups but never repeat a prompt.
    pub fn starting_at(mut self, first_index: u32) -> Self {
        self.first_index = first_index;
        self
    }

    /// The plan of this run's request `run_index`: its shared prefix (if any) followed by its
    /// own text (`prompt_bytes` long, or drawn for ShareGPT-like lengths) starting with
    /// `[index]`, where `index` counts from the first index.
    pub fn plan(&self, run_index: u32) -> RequestPlan {
        let index = self.first_index.saturating_add(run_index);
        let mut rng = Rng::new(self.seed, REQUEST_DOMAIN, u64::from(index));
        let model = self.models[rng.below(self.models.len())].clone();
        let prefix = match self.prefixes.len() {
            0 => "",
            n => self.prefixes[rng.below(n)].as_str(),
        };
        // Lengths come from their own stream, so fixed-length prompts are unchanged.
        let mut lengths = Rng::new(self.seed, LENGTH_DOMAIN, u64::from(index));
        let (own_bytes, max_tokens) = match self.sharegpt_output {
            None => (self.prompt_bytes, None),
            Some(output) => {
                let median = u32::try_from(self.prompt_bytes).unwrap_or(u32::MAX);
                let bytes = lengths.log_normal(median, SHAREGPT_PROMPT_SIGMA) as usize;
                let tokens = lengths.log_normal(output, SHAREGPT_OUTPUT_SIGMA);
                (bytes, Some(tokens))
            }
        };
        let mut prompt = String::with_capacity(prefix.len() + own_bytes);
        prompt.push_str(prefix);
        let mut own = format!("[{index}] ");
        rng.fill(&mut own, own_bytes);
        prompt.push_str(&own);
        RequestPlan {
            model,
            prompt,
            max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn unique_prompts_have_the_asked_length_and_differ() {
        let w = Workload::new(7, 200, 0, 2048, models(&["m"]));
        let a = w.plan(0);
        let b = w.plan(1);
        assert_eq!(a.prompt.len(), 200);
        assert_eq!(b.prompt.len(), 200);
        assert!(a.prompt.starts_with("[0] ") && b.prompt.starts_with("[1] "));
        assert_ne!(a.prompt[4..], b.prompt[4..]);
        assert_eq!(a.model, "m");
    }

    #[test]
    fn a_later_run_continues_the_numbering() {
        let w = Workload::new(3, 100, 4, 256, models(&["m"]));
        let later = Workload::new(3, 100, 4, 256, models(&["m"])).starting_at(50);
        assert_eq!(later.plan(0), w.plan(50));
        assert!(later.plan(2).prompt.contains("[52] "));
        assert_ne!(later.plan(0), w.plan(0));
    }

    #[test]
    fn deterministic_by_seed() {
        let a = Workload::new(42, 300, 3, 500, models(&["x", "y", "z"]));
        let b = Workload::new(42, 300, 3, 500, models(&["x", "y", "z"]));
        let c = Workload::new(43, 300, 3, 500, models(&["x", "y", "z"]));
        for i in 0..20 {
            assert_eq!(a.plan(i), b.plan(i));
        }
        assert!((0..20).any(|i| a.plan(i) != c.plan(i)));
    }

    #[test]
    fn shared_prefix_groups_share_exactly_the_prefix() {
        let (prompt_bytes, prefix_bytes) = (64, 512);
        let w = Workload::new(3, prompt_bytes, 4, prefix_bytes, models(&["m"]));
        assert_eq!(w.prefixes.len(), 4);
        for (g, prefix) in w.prefixes.iter().enumerate() {
            assert_eq!(prefix.len(), prefix_bytes);
            assert!(prefix.ends_with('\n'));
            for other in &w.prefixes[g + 1..] {
                assert_ne!(prefix, other);
            }
        }
        let mut per_group = vec![Vec::new(); 4];
        for i in 0..64 {
            let prompt = w.plan(i).prompt;
            assert_eq!(prompt.len(), prefix_bytes + prompt_bytes);
            let (head, tail) = prompt.split_at(prefix_bytes);
            let g = w
                .prefixes
                .iter()
                .position(|p| p == head)
                .expect("starts with a group prefix");
            assert!(tail.starts_with(&format!("[{i}] ")));
            per_group[g].push(tail.to_string());
        }
        for tails in &per_group {
            assert!(!tails.is_empty(), "64 requests reach every one of 4 groups");
            for (k, tail) in tails.iter().enumerate() {
                assert!(!tails[k + 1..].contains(tail), "suffixes are unique");
            }
        }
    }

    #[test]
    fn sharegpt_lengths_are_heavy_tailed_around_the_medians() {
        let fixed = Workload::new(5, 400, 2, 256, models(&["m"]));
        let varied = fixed.clone().with_lengths(LengthDist::Sharegpt, 100);
        let n = 2000;
        let mut own: Vec<usize> = Vec::new();
        let mut out: Vec<u32> = Vec::new();
        for i in 0..n {
            let (a, b) = (fixed.plan(i), varied.plan(i));
            assert_eq!(a.max_tokens, None);
            assert_eq!(a.model, b.model);
            // Same prefix group: only the lengths change.
            assert_eq!(a.prompt[..256], b.prompt[..256]);
            own.push(b.prompt.len() - 256);
            out.push(b.max_tokens.expect("varied output length"));
        }
        own.sort_unstable();
        out.sort_unstable();
        let (own_median, out_median) = (own[own.len() / 2], out[out.len() / 2]);
        assert!(
            (300..=530).contains(&own_median),
            "prompt median {own_median}"
        );
        assert!(
            (85..=118).contains(&out_median),
            "output median {out_median}"
        );
        // Heavy tail, but capped at 8× the median.
        assert!(own[own.len() * 95 / 100] > 1500 && own[own.len() - 1] <= 8 * 400);
        assert!(out[out.len() * 95 / 100] > 250 && out[out.len() - 1] <= 800);
        assert!(out[0] >= 1);
    }

    #[test]
    fn models_are_picked_among_the_adapters() {
        let w = Workload::new(1, 16, 0, 0, models(&["a", "b"]));
        let picked: Vec<String> = (0..40).map(|i| w.plan(i).model).collect();
        assert!(picked.iter().any(|m| m == "a") && picked.iter().any(|m| m == "b"));
        assert!(picked.iter().all(|m| m == "a" || m == "b"));
    }
}
