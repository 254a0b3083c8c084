"""Real nights of the daemon on small search problems, rescored (resumable): the night benchmark.
Its library is orchestrator/benchmark/ (`make demo` and the tests read it too).

    .venv/bin/python -m bench.nights --help
"""
import sys

from orchestrator.benchmark.nights import main

if __name__ == "__main__":
    sys.exit(main())
