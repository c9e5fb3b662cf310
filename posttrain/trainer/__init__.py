"""The loops (sync, later async), validation, checkpoints, tracking and reports."""
