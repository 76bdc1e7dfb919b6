"""Generation on top of a model: LLM, sessions, batching and the scheduler,
sampling, stopping, log-probabilities, embeddings, saved states."""
