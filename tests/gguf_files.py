"""Small GGUF files written the way llama.cpp's converter writes them, for the GGUF tests.

`write_llama` turns a Hugging Face Llama (a tiny one from `tinybpe`) into a GGUF file with
`gguf`'s own writer: llama.cpp's tensor names, its Q/K row permutation (the rotary halves
interleaved), the config as `llama.*` metadata and the BPE vocabulary as a `gpt2` tokenizer
with a chat template. Loading it back must give the source model's logits; nothing here
shares code with the loader under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: each head's rotary halves interleaved row-wise."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    config = model.config
    kv_heads = int(config.num_key_value_heads or config.num_attention_heads)
    out: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().to(torch.float32).numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = array
        elif name == "model.norm.weight":
            out["output_norm.weight"] = array
        elif name == "lm_head.weight":
            if not config.tie_word_embeddings:
                out["output.weight"] = array
        else:
            _, _, layer, rest = name.split(".", 3)
            if rest.endswith("q_proj.weight"):
                array = permute(array, config.num_attention_heads)
            elif rest.endswith("k_proj.weight"):
                array = permute(array, kv_heads)
            out[f"blk.{layer}.{_LAYER_NAMES[rest]}"] = array
    return out


def write_llama(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    path: Path,
    *,
    quantization: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    architecture: str = "llama",
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """Write `model` and `tokenizer` as GGUF file `path`; 2-D weights in `quantization`."""
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_config(writer, model)
    _write_tokenizer(writer, tokenizer)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, array in gguf_tensors(model).items():
        if array.ndim == 2 and quantization != gguf.GGMLQuantizationType.F32:
            quantized = gguf.quants.quantize(array, quantization)
            writer.add_tensor(name, quantized, raw_dtype=quantization)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_config(writer: gguf.GGUFWriter, model: LlamaForCausalLM) -> None:
    config = model.config
    writer.add_name("polyrl test llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(int(config.num_key_value_heads or config.num_attention_heads))
    rope = config.rope_parameters or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta") or 10000.0))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(int(config.head_dim or 64))


def _write_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerBase) -> None:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {added["id"] for added in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(int(tokenizer.bos_token_id or 0))
    writer.add_eos_token_id(int(tokenizer.eos_token_id or 0))
    writer.add_pad_token_id(int(tokenizer.pad_token_id or 0))
