"""Pure evaluation functions of the long-context tasks (perplexity windows, passkey prompts)."""
