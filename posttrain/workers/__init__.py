"""Thin remote roles over the engines: policy (training + rollout in one process), reference,
critic, reward model. Plain classes; the controller makes them remote."""
