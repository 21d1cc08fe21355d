"""Builds a tiny random-weight Llama, its tokenizer and two LoRA adapters, without a model hub.

Usage: python scripts/tiny_model.py DIR  ->  DIR/model, DIR/lora1, DIR/lora2

The model only has to be served by a real vLLM: its answers are noise, but its prompts are
tokenized, cached in blocks, queued and scheduled as a real model's are. The tokenizer is a
byte-level BPE trained on this repository's own text (every prompt tokenizes), with a
ChatML-style chat template so /v1/chat/completions works.
"""

import pathlib
import sys

import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def corpus(root: pathlib.Path) -> list[str]:
    """Text to train the tokenizer on: the repository's Markdown and Rust sources."""
    files = sorted(root.glob("**/*.md")) + sorted(root.glob("src/**/*.rs"))
    texts = [f.read_text(errors="ignore") for f in files if "target" not in f.parts]
    return texts or ["hello world"]


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    root = pathlib.Path(__file__).resolve().parent.parent
    torch.manual_seed(0)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(root), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    model_dir = out / "model"
    wrapped.save_pretrained(model_dir)

    config = LlamaConfig(
        vocab_size=len(wrapped),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=wrapped.bos_token_id,
        eos_token_id=wrapped.eos_token_id,
        pad_token_id=wrapped.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir)

    for name in ("lora1", "lora2"):
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        adapter = get_peft_model(LlamaForCausalLM(config).to(torch.bfloat16), lora)
        adapter.save_pretrained(out / name)
    print(f"tiny model in {model_dir}, adapters lora1 and lora2")


if __name__ == "__main__":
    main()
