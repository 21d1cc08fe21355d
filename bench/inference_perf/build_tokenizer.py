"""Builds the small local tokenizer inference-perf needs (it cannot download one here).

Run with the inference-perf venv's Python: ``build_tokenizer.py OUT_DIR``. It trains a
word-level tokenizer on inference-perf's bundled ``assets/shakespeare.txt`` (the corpus its
prompt generators sample from, so every generated word is in the vocabulary) and saves it with
``PreTrainedTokenizerFast.save_pretrained``, which inference-perf loads from ``OUT_DIR``.
"""

import sys
from pathlib import Path

import inference_perf
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<unk>", "<s>", "</s>"]


def build(out_dir: Path) -> None:
    """Trains the tokenizer and writes it to `out_dir`."""
    corpus = Path(inference_perf.__file__).parent / "assets" / "shakespeare.txt"
    if not corpus.is_file():
        raise SystemExit(f"build_tokenizer: {corpus} is missing from the inference-perf package")
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train([str(corpus)], trainers.WordLevelTrainer(special_tokens=SPECIAL))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_tokenizer.py OUT_DIR")
    build(Path(sys.argv[1]))
