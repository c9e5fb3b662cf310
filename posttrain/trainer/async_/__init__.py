"""Asynchronous training: generators beside a trainer, a bounded buffer between them (``trainer.mode=async``)."""
