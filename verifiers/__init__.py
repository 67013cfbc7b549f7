"""Task-level verifiers: judge a trial by its final external state."""
