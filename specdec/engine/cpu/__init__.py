"""The CPU's own kernels: what the CPU offers (`features`), and the gguf paths' block formats with their C
kernels (`blockquant` exact, `q8dot` integer, `layer_ops` for the float steps between them), built per
instruction-set level by `native` from `csrc/`. The CUDA-side runner lives apart, in `specdec.engine.static`."""
