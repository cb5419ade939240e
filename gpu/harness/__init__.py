"""The GPU scenario harness: real vLLM on tiny random models, with and without the series."""
