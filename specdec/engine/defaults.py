"""The engines' defaults that the services' flags name, in a module without torch: a launcher, the command line and
the orchestrator read them without importing the engines."""

GAMMA_LIMIT = 16  # draft tokens a service takes per round by default
# Beside decoding sessions a prompt goes in chunks that keep each shared pass within this many times their pass
# alone (`specdec.engine.model_engine`).
SHARED_SLOWDOWN = 3.0
PREFIX_CACHE_BYTES = 1 << 30  # ended sessions' KV caches kept for later sessions, by default (`PrefixCache`)
DRAFT_VOCAB_AUTO = 65536  # measured in docs/PERFORMANCE.md ("The draft's output layer")
DRAFT_WEIGHTS = ("auto", "as-shipped", "q4_0")  # auto: q4_0 on the gguf-q8 path, as shipped elsewhere
