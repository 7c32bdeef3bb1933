"""One decoding core: KV-cached batches, the step loop both the torch rollout engine and the server run, sampling."""
