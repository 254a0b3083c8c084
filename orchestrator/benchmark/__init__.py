"""The night benchmark's library: its search problems and detunes drawn at random, real nights of the
daemon on them rescored, and the table of what each searcher recovered (`python -m bench.nights`,
`make demo`, and the tests of the table read it)."""
