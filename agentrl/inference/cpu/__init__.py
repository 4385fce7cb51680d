"""What makes the reference `hf` engine fast on a CPU, kept behind the engine's interface.

    kv_cache.py       the in-place KV cache, its row operations, finished turns' KV kept for the next
    packed_linear.py  linear weights kept cast and packed for oneDNN between decode steps
    speculation.py    prompt-lookup drafts and the fitted forward cost that sizes them
    threads.py        intra-op thread counts per thread; libgomp's idle workers given back
    memory.py         freed heap back to the OS, bounded oneDNN kernel caches, mapped tensors

Importing any of them changes nothing in the process: each acts when called. Outside
agentrl/inference, only `threads` and `memory` are used (by the learner and the training loop,
which ask how many threads a step takes and hand memory back between phases); scripts/lint_imports.py
keeps it so. The attention every model runs with, the learner's and the engines', is the model
layer's (agentrl/attention.py), not the engine's: both compute log-probs through it alike.
"""
