"""gymnasium's MuJoCo v5 locomotion envs, batched: on `mujoco.batch` (batch.py) and on MJX
(mjx.py, with C MuJoCo's algorithms where MJX's differ: mjx_c_engine.py)."""
