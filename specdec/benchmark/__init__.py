"""`specdec bench`: speculation against target-only decoding and transformers, at batch 1 and
under concurrency, with the Leviathan ideal beside each measured speedup."""
