"""`python -m envs_fast.verify --env ENV_ID --backend SPEC ...` (exit 0 pass, 1 fail, 2 bad input)."""
import sys

from envs_fast.verify import main

sys.exit(main())
