"""The kinds of fast backend in one functional shape (load.py), and the gymnasium VectorEnvs a
training run steps: JAX translations and gymnax (jax_vector.py, jax_batched.py), envpool. Rust
translations are rust/'s; MuJoCo's batched engines are mujoco/'s; the VectorEnv shape they share is
vector_env.py's."""
