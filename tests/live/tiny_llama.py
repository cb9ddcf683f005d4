"""Writes a model directory a real vLLM server loads with ``--load-format dummy``: a 2-layer Llama
config and a byte-level BPE tokenizer trained here with ``tokenizers`` (so nothing is downloaded; any
text encodes). Run with the vLLM virtualenv's Python (``tokenizers`` and ``transformers`` come with vLLM):

    python tests/live/tiny_llama.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Chat requests need a template; this one is plain text, like a base model's.
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "an inference server answers prompts with tokens one step at a time",
    "system user assistant: hello, how are you? fine, thanks.",
    "queue prefill decode time to first token time per output token",
] * 50
# The pages' vLLM lines serve --max-model-len 8192 (docs/engines/vllm.md); vLLM refuses more than the
# model's positions.
MAX_POSITIONS = 8192


def write(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": MAX_POSITIONS, "chat_template": CHAT_TEMPLATE}, indent=1))
    # head_dim 64: vLLM's CPU attention kernels refuse 16 ("Unsupported CPU attention configuration").
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5, "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"), "tie_word_embeddings": False,
        "torch_dtype": "float32"}, indent=1))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
