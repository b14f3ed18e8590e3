"""A policy's model and tokenizer, without NATS: where they come from (`sources`, `loading`,
the tiny test models `tinybpe` and `chartokenizer`), how prompts become token ids
(`prompts`), and whether a model fits its trainer (`memory`)."""
