"""Engines: the training engine (torch) and the rollout engines (vLLM; HF ``generate`` fallback)."""
