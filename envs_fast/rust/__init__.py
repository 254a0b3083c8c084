"""Rust translations: the toolchain (toolchain.py), building a `.rs` source into a cached library
(build.py), loading it over its C ABI (backend.py) and the VectorEnv training steps (vector.py)."""
