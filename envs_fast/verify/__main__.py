"""`python -m envs_fast.verify --env ENV_ID --backend SPEC ...` (exit 0 pass, 1 fail, 2 bad input)."""
import sys

from envs_fast.compiling import compile_quickly

compile_quickly()  # before JAX starts: every level compiles its programs once

from envs_fast.verify import main  # noqa: E402

sys.exit(main())
