"""posttrain: RL post-training of language models on Ray."""
