"""Real models' shapes without their weights, for checks that need the size and not the file.

The GPU scripts build SmolLM2-135M-Instruct's configuration with seeded random weights: a
GPU machine has no copy of the GGUF file, and its timings and memory depend on the shape.
"""

from __future__ import annotations

from transformers import LlamaConfig

SMOLLM2_VOCAB = 49152


def smollm2_135m(layers: int = 30) -> LlamaConfig:
    """SmolLM2-135M-Instruct's configuration (30 layers, hidden 576, 9 query and 3 key-value
    heads, tied embeddings), with `layers` decoder layers for a quicker try."""
    return LlamaConfig(
        vocab_size=SMOLLM2_VOCAB,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
