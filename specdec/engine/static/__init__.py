"""The decode runner with static shapes: a preallocated KV pool, fixed buckets, CUDA graphs.

`StaticRunner` has `ModelRunner`'s interface (`new_cache`, `forward(steps)`), so the engines,
the batcher and the profile use it unchanged. Every pass runs at one of a few shapes, captured
once as a CUDA graph on a GPU and replayed; on CPU the same code runs eagerly, which is how CI
tests it.
"""
