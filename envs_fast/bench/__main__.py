"""`python -m envs_fast.bench --env ENV_ID --backend SPEC ...`: a backend's throughput against its reference."""
import sys

from envs_fast.bench import main
from envs_fast.compiling import compile_quickly

compile_quickly()  # train.py builds its update (the e2e rollout inside it) at -O1 too
sys.exit(main())
