"""Translations: one environment's files side by side, named by its slug (`CartPole-v1` ->
`cartpole_v1`): the JAX translation `<slug>.py`, the Rust one `<slug>.rs` and the Rust one's state
sync `<slug>_sync.py`. The translate phase writes here and nowhere else; every other module of
envs_fast is machinery, whose source is part of every verdict's key (cache.py)."""
